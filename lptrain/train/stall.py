"""When a run has stopped making progress: the rule behind the `stalled` outcome.

A run stalls when the optimizer can find no step at all (a failed line search
along −g with the most accurate gradient the mode has), or when the objective
has not improved on its best value for `patience` iterations.  With
mini-batches each iteration sees another batch, so epochs are compared: the
mean objective of an epoch against the best earlier epoch mean, with the
patience rounded up to whole epochs (at least two).  Patience 0 turns the rule
off; a failed line search still ends the run.
"""
from __future__ import annotations

import math


# why a run stalled whose line search found no step (its hint differs: train/loop.py)
NO_STEP = "no step decreases the objective, even along the steepest descent with exact " \
          "solves"


class StallRule:
    """Feed it one optimizer iteration at a time; `stalled` says why it stalled."""

    def __init__(self, patience: int, batches_per_epoch: int = 1):
        self.per_epoch = max(batches_per_epoch, 1)
        epochs = math.ceil(patience / self.per_epoch)
        self.patience = patience if self.per_epoch == 1 or patience == 0 else max(epochs, 2)
        self.best = math.inf
        self.since = 0               # iterations (epochs with mini-batches) without progress
        self._epoch: list[float] = []
        self.last_epoch: float | None = None   # mini-batches: the last whole epoch's mean
        self.stalled: str | None = None

    def update(self, objective: float, exhausted: bool = False) -> str | None:
        """Record one iteration; returns the reason once the run has stalled, else None."""
        if exhausted:
            self.stalled = NO_STEP
            return self.stalled
        if self.per_epoch > 1:
            self._epoch.append(objective)
            if len(self._epoch) < self.per_epoch:
                return None
            objective = self.last_epoch = sum(self._epoch) / len(self._epoch)
            self._epoch = []
        if objective < self.best:
            self.best, self.since = objective, 0
        else:
            self.since += 1
        if self.patience and self.since >= self.patience:
            unit, best = ("iterations", "best") if self.per_epoch == 1 else \
                ("epochs", "best epoch mean")
            self.stalled = f"the objective has not decreased for {self.since} {unit} " \
                           f"({best} {self.best:.6g})"
        return self.stalled

    def state_dict(self) -> dict:
        return {"best": self.best, "since": self.since, "epoch": list(self._epoch),
                "last_epoch": self.last_epoch}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state`; a run that had stalled and is resumed gets its patience
        afresh (else the first iteration without progress would stall it again)."""
        self.best, self.since, self._epoch = state["best"], state["since"], list(state["epoch"])
        self.last_epoch = state.get("last_epoch")      # (absent from older checkpoints)
        if self.patience and self.since >= self.patience:
            self.since = 0
