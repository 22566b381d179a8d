"""Calibration of the one-shot error estimate against exact gradients (docs/method.md §6).

The estimate of train/control.py bounds the gradient error from residuals; how
loose the bound is depends on the network (5–20× on the dense networks, ~100×
on the pooled convolutional one). Every `mgrit.calibrate_every` evaluations
`CalibratedOracle` also computes the exact gradient of the same batch at the
same θ with `exact` (layer-serial propagation, the batch split over the ranks
as in mode=serial) and tells the one-shot oracle the true relative error
‖g̃ − g‖ / ‖g‖; the controller then scales its estimates by what it measured.
The optimizer still receives the one-shot gradient g̃: calibration observes
the trajectory, it does not change the gradient that drives it.
"""
from __future__ import annotations

import torch


class CalibratedOracle:
    """`oracle` (any oracle stack ending in a SimultaneousOracle `oneshot`) whose
    gradients are compared with `exact`'s when `oneshot.calibration_due()`."""

    def __init__(self, oracle, oneshot, exact):
        self.oracle, self.oneshot, self.exact = oracle, oneshot, exact

    def __getattr__(self, name):          # the rest of the oracle protocol
        return getattr(self.oracle, name)

    def begin(self, batch) -> None:
        self.batch = batch
        self.oracle.begin(batch)

    def value(self, theta):
        self.theta = theta
        return self.oracle.value(theta)

    def gradient(self) -> torch.Tensor:
        grad = self.oracle.gradient()
        if self.oneshot.calibration_due():
            self.exact.begin(self.batch)
            self.exact.value(self.theta)
            true = self.exact.gradient()
            self.oneshot.calibrate(float((grad - true).norm() / true.norm()))
        return grad
