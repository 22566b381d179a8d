"""A propagator wrapper that counts the steps the solver asks for, per level."""
from __future__ import annotations

from collections import Counter


class Counting:
    """Counts steps by their length in fine steps (1 = finest level)."""

    def __init__(self, prop):
        self.prop, self.steps = prop, Counter()

    def step(self, u, start, stop, **kw):
        self.steps[abs(stop - start)] += 1
        return self.prop.step(u, start, stop, **kw)

    def step_many(self, U, starts, stops, **kw):
        for a, b in zip(starts, stops):
            self.steps[abs(b - a)] += 1
        return self.prop.step_many(U, starts, stops, **kw)

    def total(self) -> int:
        return sum(self.steps.values())
