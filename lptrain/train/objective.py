"""The training objective J(θ) = mean loss + R(θ): the regulariser added once, on any data terms.

The data terms (one mode's oracle, possibly summed over data groups) give the
batch's mean loss and its gradient, summed over the ranks; R is the same on every
rank and is added here, after the sums, so no rank counts it twice and no sum has
to take it out again.  Once the whole gradient is known its norm goes back to the
data terms (`observe`): the MGRIT modes estimate the gradient's error relative to
it (train/control.py).
"""
from __future__ import annotations

import math

import torch

from lptrain.train.protocol import Batch, DataTerms, Evaluated, Point


class Objective:
    """A TrainingOracle (train/protocol.py) over `terms` (a DataTerms) and `net`'s R(θ)."""

    def __init__(self, terms: DataTerms, net):
        self.terms, self.net = terms, net

    def begin(self, batch: Batch) -> None:
        self.terms.begin(batch)

    def value(self, theta: torch.Tensor) -> Evaluated:
        data = self.terms.value(theta)
        loss = data.point.loss
        point = Point(objective=loss + self.net.regulariser(theta), loss=loss,
                      accuracy=data.point.accuracy)
        return Evaluated(point, theta, data.batch, tape=data)

    def gradient(self, ev: Evaluated) -> torch.Tensor:
        """∇J at ev's θ. Where the data terms find its estimated error too large to step
        with (`refine`: a one-shot gradient far above mgrit.grad_tol), θ is evaluated
        again with more iterations and `ev` becomes that evaluation (its point too)."""
        grad = self._gradient(ev)
        while self.terms.measures and self.terms.refine():
            again = self.value(ev.theta)
            grad = self._gradient(again)
            ev.point, ev.tape = again.point, again.tape   # the data terms' stats with it
            if not math.isfinite(again.point.objective):   # more iterations overflowed:
                return torch.full_like(grad, math.nan)     # the optimizers refuse it
        return grad

    def _gradient(self, ev: Evaluated) -> torch.Tensor:
        data = ev.tape
        grad = self.terms.gradient(data)
        self.net.regulariser(ev.theta, grad)
        if self.terms.measures:
            self.terms.observe(data, self.terms.measure(data), float(grad.norm()))
        return grad

    def accept(self, ev: Evaluated) -> None:
        self.terms.accept(ev.tape)

    def tighten(self) -> bool:
        return self.terms.tighten()

    def relax(self) -> None:
        self.terms.relax()

    def record(self) -> dict | None:
        return self.terms.record()

    def validate(self, theta, x, y, chunk: int | None = None) -> tuple[float, float]:
        return self.terms.validate(theta, x, y, chunk)

    def state_dict(self) -> dict:
        return self.terms.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.terms.load_state_dict(state)

    def warm_entries(self, state: dict) -> list:
        return self.terms.warm_entries(state)

    def with_warm_entries(self, state: dict, entries: list) -> dict:
        return self.terms.with_warm_entries(state, entries)

    def warm_rows(self, state: dict) -> str:
        return self.terms.warm_rows(state)
