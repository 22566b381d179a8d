"""When a run has stopped making progress: the rule behind the `stalled` outcome.

A run stalls when the optimizer can find no step at all (a failed line search
along −g with the most accurate gradient the mode has), or when the objective
has not improved on its best value for `patience` iterations.  With
mini-batches each iteration sees another batch, so epochs are compared: the
mean objective of an epoch against the best earlier epoch mean, with the
patience rounded up to whole epochs (at least two); the mean weighs each batch's
objective by its samples, so that a small remainder batch counts by its size.
Patience 0 turns the rule off; a failed line search still ends the run.
"""
from __future__ import annotations

import math

from lptrain.errors import counted


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
        self._epoch: list[tuple[float, int | None]] = []   # (objective, samples) a batch
        self.last_epoch: float | None = None   # mini-batches: the last whole epoch's mean
        self.stalled: str | None = None

    def update(self, objective: float, exhausted: bool = False, samples: int = 1
               ) -> str | None:
        """Record one iteration (`samples`: its batch's); returns the reason once the run
        has stalled, else None."""
        if exhausted:
            self.stalled = NO_STEP
            return self.stalled
        if self.per_epoch > 1:
            self._epoch.append((objective, samples))
            if len(self._epoch) < self.per_epoch:
                return None
            objective = self.last_epoch = epoch_mean(self._epoch)
            self._epoch = []
        if objective < self.best:
            self.best, self.since = objective, 0
        else:
            self.since += 1
        if self.patience and self.since >= self.patience:
            unit, best = ("iteration", "best") if self.per_epoch == 1 else \
                ("epoch", "best epoch mean")
            self.stalled = f"the objective has not decreased for {counted(self.since, unit)} " \
                           f"({best} {self.best:.6g})"
        return self.stalled

    def state_dict(self) -> dict:
        """The objectives under "epoch" as before the weights (a checkpoint stays readable
        by the code before them), their samples beside them."""
        return {"best": self.best, "since": self.since, "epoch": [o for o, _ in self._epoch],
                "epoch_samples": [n for _, n in self._epoch], "last_epoch": self.last_epoch}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state`; a run that had stalled and is resumed gets its patience
        afresh (else the first iteration without progress would stall it again)."""
        self.best, self.since = state["best"], state["since"]
        # older checkpoints kept the objectives alone: samples unknown (the plain mean)
        samples = state.get("epoch_samples") or [None] * len(state["epoch"])
        self._epoch = list(zip(state["epoch"], samples))
        self.last_epoch = state.get("last_epoch")      # (absent from older checkpoints)
        if self.patience and self.since >= self.patience:
            self.since = 0


def epoch_mean(batches: list[tuple[float, int | None]]) -> float:
    """The mean objective of an epoch's (objective, samples) batches, each weighed by its
    samples; the plain mean where they are of one size (the same number, to the bit) or
    a size is unknown (None: a batch before a resume from an older checkpoint)."""
    sizes = {n for _, n in batches}
    if len(sizes) == 1 or None in sizes:
        return sum(o for o, _ in batches) / len(batches)
    return sum(o * n for o, n in batches) / sum(n for _, n in batches)
