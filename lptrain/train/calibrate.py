"""Calibration of the one-shot error estimate against exact gradients (docs/method.md §6).

The estimate of train/control.py gauges the gradient error from residuals, not
a bound; how far it lies from the true error depends on the network (2–7× above
at the median on the dense networks, below it often with ReLU, ~100× above on
the pooled convolutional one). Every `mgrit.calibrate_every` evaluations
`CalibratedOracle` also computes the exact gradient of the same batch at the
same θ with `exact` (layer-serial propagation, the batch split over the ranks
as in mode=serial) and tells the one-shot oracle the true relative error
‖g̃ − g‖ / ‖g‖; the controller then scales its estimates by what it measured.
The optimizer still receives the one-shot gradient g̃: calibration observes
the trajectory, it does not change the gradient that drives it.
"""
from __future__ import annotations

import torch

from lptrain.train.protocol import Evaluated


class CalibratedOracle:
    """A TrainingOracle: `oracle` (an objective over data terms that end in a
    SimultaneousOracle `oneshot`) whose gradients are compared with those of `exact`
    (the serial objective) when `oneshot`'s accuracy says a calibration is due."""

    def __init__(self, oracle, oneshot, exact):
        self.oracle, self.oneshot, self.exact = oracle, oneshot, exact

    def begin(self, batch) -> None:
        self.oracle.begin(batch)

    def value(self, theta) -> Evaluated:
        return self.oracle.value(theta)

    def gradient(self, ev: Evaluated) -> torch.Tensor:
        grad = self.oracle.gradient(ev)
        rungs = self.oneshot.accuracy
        if rungs.calibration_due():
            self.exact.begin(ev.batch)
            true = self.exact.gradient(self.exact.value(ev.theta))
            rungs.calibrate(float((grad - true).norm() / true.norm()))
        return grad

    def accept(self, ev: Evaluated) -> None:
        self.oracle.accept(ev)

    def tighten(self) -> bool:
        return self.oracle.tighten()

    def relax(self) -> None:
        self.oracle.relax()

    def record(self) -> dict | None:
        return self.oracle.record()

    def validate(self, theta, x, y, chunk: int | None = None) -> tuple[float, float]:
        return self.oracle.validate(theta, x, y, chunk)

    def state_dict(self) -> dict:
        return self.oracle.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.oracle.load_state_dict(state)

    def warm_entries(self, state: dict) -> list:
        return self.oracle.warm_entries(state)

    def with_warm_entries(self, state: dict, entries: list) -> dict:
        return self.oracle.with_warm_entries(state, entries)

    def warm_rows(self, state: dict) -> str:
        return self.oracle.warm_rows(state)
