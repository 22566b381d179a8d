"""What optimizers, the loop and checkpoints ask of an oracle, declared as Protocols.

An oracle evaluates the objective J(θ) and its gradient on the batch of the
current optimizer iteration.  `value(θ)` returns an `Evaluated` handle;
`gradient(handle)` and `accept(handle)` take it, so the gradient belongs to the
point it was asked for, not to whatever was evaluated last.  A handle stays
usable until the same oracle's next `value()`: the oracles reuse their state
buffers from one evaluation to the next (one trial's states in memory, not
two), and `gradient` of an older handle raises `StaleEvaluation` instead of
using overwritten states.  (An optimizer asks for the gradient of its latest
evaluation only: L-BFGS at the accepted line-search trial, SGD and Adam at θ.)

The modes differ only in their `DataTerms` (the batch's mean loss and its
gradient: train/oracles.py, train/mgrit_oracle.py, train/oneshot.py), summed over data
groups by train/data_parallel.py; train/objective.py adds the regulariser once on top.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    key: int = 0      # which mini-batch (for per-batch warm starts)
    n: int | None = None  # samples of the whole batch over all data groups (None: x's)


@dataclass(kw_only=True)
class Point:
    """J, the mean loss and the accuracy at one θ on the batch."""

    objective: float
    loss: float
    accuracy: float


class StaleEvaluation(RuntimeError):
    """gradient() of an evaluation whose states the oracle's next value() reused."""


@dataclass(eq=False)
class Evaluated:
    """What `value(θ)` returns: the point, θ, the batch, and until the oracle's next
    value() its `tape`, what the gradient needs (the oracle's own type)."""

    point: Point
    theta: torch.Tensor
    batch: Batch | None = None
    tape: Any = None
    stats: Any = None         # the MGRIT modes' SolveStats of this evaluation
    measured: Any = None      # data groups: the solve record summed over the groups

    def held(self) -> Any:
        """The tape; StaleEvaluation once the oracle's next evaluation reused it."""
        if self.tape is None:
            raise StaleEvaluation("gradient of an evaluation whose states a later "
                                  "value() reused: ask for the latest evaluation's")
        return self.tape


@runtime_checkable
class Oracle(Protocol):
    """What an optimizer asks (train/optimizers.py)."""

    def value(self, theta: torch.Tensor) -> Evaluated:
        """J at θ on the current batch (a handle for `gradient` and `accept`)."""

    def gradient(self, ev: Evaluated) -> torch.Tensor:
        """∇J at the evaluation's θ (a new tensor, summed over every rank)."""

    def accept(self, ev: Evaluated) -> None:
        """The evaluation's θ is the new iterate (its gradient was taken)."""

    def tighten(self) -> bool:
        """Make the next evaluations more accurate; False when they cannot be."""

    def relax(self) -> None:
        """Back to the configured accuracy (after a successful optimizer iteration)."""


@runtime_checkable
class WarmStarts(Protocol):
    """How checkpoints read the warm starts in an oracle's state_dict (train/checkpoint.py,
    train/regrid.py); callable on the class as well as on an instance."""

    def warm_entries(self, state: dict) -> list:
        """[key, forward states, adjoint states] of every batch the state keeps warm
        starts of (this rank's blocks: parallel/blocks.py), least recently used first."""

    def with_warm_entries(self, state: dict, entries: list) -> dict:
        """`state` with its warm starts replaced by `entries` (as warm_entries gives)."""

    def warm_rows(self, state: dict) -> str:
        """Which rows the state's blocks hold: all of the rank's range (ALL_ROWS) or only
        its C-points (C_POINTS; parallel/blocks.py)."""


@runtime_checkable
class TrainingOracle(Oracle, WarmStarts, Protocol):
    """What the loop and checkpoints ask besides (train/loop.py, train/checkpoint.py)."""

    def begin(self, batch: Batch) -> None:
        """The batch of the optimizer iteration that follows."""

    def record(self) -> dict | None:
        """The MGRIT record of the optimizer iteration (None: no MGRIT solves)."""

    def validate(self, theta, x, y, chunk: int | None = None) -> tuple[float, float]:
        """Mean loss and accuracy on (x, y), `chunk` samples a pass."""

    def state_dict(self) -> dict:
        """What a checkpoint keeps of this rank's oracle (its warm starts, controller)."""

    def load_state_dict(self, state: dict) -> None:
        """Continue from a state_dict."""


@runtime_checkable
class DataTerms(TrainingOracle, Protocol):
    """The data part of J: the batch's mean loss, accuracy and loss gradient, without the
    regulariser (value's point has objective == loss). `measures`: whether the
    evaluations carry a solve record that the gradient error estimate needs."""

    measures: bool

    def skip(self, key: int) -> None:
        """This rank holds no samples of batch `key` (a data group without any): keep the
        warm-start bookkeeping and the record as the ranks with samples do."""

    def measure(self, ev: Evaluated, weight: float = 1.0) -> Any:
        """The evaluation's solve record (train/control.py Measured) after its gradient,
        the adjoint's part weighted by `weight` (its share of the batch); None when the
        oracle does not measure."""

    def observe(self, ev: Evaluated | None, measured: Any, grad_norm: float) -> None:
        """The whole gradient's norm and the solve record summed over every data group,
        once the gradient of `ev` is known (None: this group had no samples)."""

    def refine(self) -> bool:
        """After `observe`: whether that evaluation's gradient is too inexact to step
        with and is to be evaluated again at its θ, more accurately (the same answer on
        every rank)."""
