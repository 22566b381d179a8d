"""What the training loop checks after every iteration: divergence, and a stop request.

Divergence rule: iteration k diverged when its objective J_k is not finite, or when
J_k > DIVERGENCE_FACTOR · max(J_1, tiny), J_1 being the objective recorded at the first
iteration of the run. Every rank holds the same J_k, so every rank decides alike.

Stops: SIGINT, SIGHUP and SIGTERM only set a flag (`StopSignals`, train/stop.py); the ranks
agree at the end of each optimizer iteration with one small allreduce whether any got one,
so they all leave the loop after the same iteration, whichever rank the signal reached and
whatever collective it was in. The same allreduce carries whether rank 0's metrics writer failed
(full disk, write error), so that every rank stops then too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lptrain.errors import DIVERGED_AT_START
from lptrain.errors import DIVERGED_REMEDY as REMEDY
from lptrain.errors import DivergedError
from lptrain.train.stop import NoStop, StopSignals  # noqa: F401 (their home before)

DIVERGENCE_FACTOR = 1e3
_TINY = 1e-12



@dataclass
class Validated:
    """Parameters after `iteration` and their validation loss and accuracy."""

    iteration: int
    loss: float
    accuracy: float
    theta: torch.Tensor

    def beats(self, other: Validated | None) -> bool:
        """A higher accuracy, or the same at a lower loss (nan beats nothing)."""
        return other is None or self.accuracy > other.accuracy or (
            self.accuracy == other.accuracy and self.loss < other.loss)

    def state_dict(self) -> dict:
        return {"iteration": self.iteration, "loss": self.loss, "accuracy": self.accuracy,
                "theta": self.theta}


@dataclass
class Progress:
    """The last good state of a run: parameters after `iteration` (0 = initial), and the
    best validated parameters among the good ones (`best`).

    An optimizer whose step reports the objective of the parameters it started from (SGD
    and Adam: one evaluation per step, its gradient's point) leaves the new parameters
    `pending`: they pass with the next step's objective, or when the run ends
    (`finish`); a checkpoint keeps them pending (`pending_state`)."""

    theta: torch.Tensor
    iteration: int = 0
    first_objective: float | None = None   # J_1, the divergence rule's reference
    best: Validated | None = None
    validation: tuple[int, float, float] | None = None   # the latest (k, loss, accuracy)
    pending: Validated | None = None    # parameters after an iteration, not yet checked
    _finished: dict | None = None      # what `finish` passed unchecked (pending_state)

    def validated(self, k: int, loss: float, accuracy: float, theta: torch.Tensor) -> None:
        """Record the validation of θ after iteration k; keep a copy of θ if it is the
        best so far once k passed `check` (pending parameters: once they pass)."""
        if self.pending is not None and self.pending.iteration == k:
            self.pending = Validated(k, loss, accuracy, theta)
            return
        self.validation = (k, loss, accuracy)
        candidate = Validated(k, loss, accuracy, theta)
        if candidate.beats(self.best):
            candidate.theta = theta.detach().clone()   # the optimizer may reuse θ's storage
            self.best = candidate

    def validation_of(self, k: int) -> tuple[float, float] | None:
        """(loss, accuracy) of the parameters after iteration k if they were validated."""
        v = self.validation
        return None if v is None or v[0] != k else (v[1], v[2])

    def best_state(self) -> dict | None:
        """What a checkpoint keeps of the best (None before the first validation); after
        `finish`, the best before it passed the pending parameters."""
        if self._finished is not None:
            return self._finished["best"]
        return None if self.best is None else {**self.best.state_dict(),
                                               "validation": self.validation}

    def pending_state(self) -> dict | None:
        """What a checkpoint of θ keeps where θ waits for its check (SGD, Adam): the last
        parameters that passed and θ's validation (None: θ passed, or no such optimizer).
        Also after `finish`, which passed them for this run's files only: a run carried on
        from the checkpoint checks θ with its first step."""
        if self.pending is None:
            return None if self._finished is None else self._finished["pending"]
        p = self.pending
        return {"iteration": self.iteration, "theta": self.theta,
                "validation": None if math.isnan(p.accuracy) else (p.loss, p.accuracy)}

    def load_pending(self, state: dict | None, theta: torch.Tensor, k: int) -> None:
        """A checkpoint's pending_state() for its θ after iteration k (None: θ passed)."""
        if state is None:
            return
        self.theta, self.iteration = state["theta"], int(state["iteration"])
        loss, accuracy = state["validation"] or (math.nan, math.nan)
        self.pending = Validated(k, loss, accuracy, theta)

    def load_best(self, state: dict | None) -> None:
        """Restore best_state() (None: a checkpoint of a run before best was kept)."""
        if state is None:
            self.best, self.validation = None, None
            return
        state = dict(state)
        validation = state.pop("validation")
        self.best = Validated(**state)
        self.validation = None if validation is None else tuple(validation)

    def check(self, k: int, objective: float, theta: torch.Tensor,
              at_start: bool = False) -> None:
        """Apply the divergence rule to iteration k's objective; keep θ (after k) if it
        passes. `at_start`: the objective is that of the parameters iteration k started
        from, which pass; θ waits for the next check (`pending`)."""
        if self.first_objective is None and math.isfinite(objective):
            self.first_objective = objective
        ref = max(self.first_objective or 0.0, _TINY)
        if not math.isfinite(objective):
            start = k == 1 and at_start      # SGD, Adam: the parameters it started from
            raise DivergedError(f"diverged: objective {objective} "
                                + (DIVERGED_AT_START if start else
                                   f"at iteration {k}: {REMEDY}"))
        if objective > DIVERGENCE_FACTOR * ref:
            raise DivergedError(f"diverged: objective {objective:.3e} at iteration {k} exceeds "
                                f"{DIVERGENCE_FACTOR:g} x the first iteration's {ref:.3e}: "
                                f"{REMEDY}")
        if not at_start:
            self.theta, self.iteration = theta, k
            return
        self._passed()
        self.pending = Validated(k, math.nan, math.nan, theta)

    def finish(self) -> None:
        """The run ended by itself: pending parameters are its last ones (its files'),
        unchecked still for a run that carries it on (pending_state)."""
        if self.pending is not None:
            self._finished = {"pending": self.pending_state(), "best": self.best_state()}
        self._passed()

    def _passed(self) -> None:
        """The pending parameters passed: the last good ones, with their validation a
        candidate for the best."""
        p, self.pending = self.pending, None
        if p is None:
            return
        self.theta, self.iteration = p.theta, p.iteration
        if not math.isnan(p.accuracy):
            self.validated(p.iteration, p.loss, p.accuracy, p.theta)
