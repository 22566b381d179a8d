"""A propagator wrapper that counts the steps the solver asks for, per level."""
from __future__ import annotations

from collections import Counter


class Counting:
    """Counts steps by their length in fine steps (1 = finest level)."""

    def __init__(self, prop):
        self.prop, self.steps = prop, Counter()

    def step(self, u, start, stop, out=None, save=False):
        self.steps[abs(stop - start)] += 1
        return self.prop.step(u, start, stop, out=out, save=save)

    def step_many(self, U, starts, stops, out=None, save=False):
        for a, b in zip(starts, stops):
            self.steps[abs(b - a)] += 1
        return self.prop.step_many(U, starts, stops, out=out, save=save)

    def total(self) -> int:
        return sum(self.steps.values())
