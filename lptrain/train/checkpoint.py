"""Checkpoints: everything a run needs to continue exactly where it stopped.

`<run dir>/checkpoint.pt` (written by rank 0, atomically: write + rename) holds the
parameters, the optimizer's state (L-BFGS memory and current point and gradient; the
torch.optim state_dict of SGD and Adam), the order of the mini-batches (generator state
and the rest of the epoch), the torch RNG state, the divergence rule's reference, the
best validated parameters so far (model.pt's), the
loop's validation record and elapsed time, and every rank's oracle state (its block of the warm-start
states: two state tensors per kept batch in the MGRIT modes, none in serial mode). The
world size is recorded: on another rank count the warm starts are dropped (cold start).

The file is an archive (model/saved.py AtomicArchive): the record as entry `record.pt`
and rank r's oracle state as `oracle-r.pt`. Rank 0 receives and writes the ranks' states
one at a time, so a checkpoint costs it one rank's warm starts, not all of them; on
resume every rank reads its own entry. Files of format 1 (one torch file) still load.

When: every `checkpoint_every` iterations; when the ranks stop for a signal; at the end.
Each checkpoint also rewrites model.pt (the `model` saver), so a run killed without warning
(SIGKILL, a cluster's time limit) leaves a model of its last checkpoint to evaluate.
`checkpoint_every=null` (the default) chooses the interval itself so that checkpoints
cost under 2 % of the run: the first checkpoint is at iteration AUTO_FIRST, then the
interval is max(AUTO_FIRST, 50 × (seconds per checkpoint) / (seconds per iteration)).
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from lptrain.errors import RunFileError
from lptrain.model.saved import (AtomicArchive, archive_entries, check_record, load_entry,
                                 load_record)
from lptrain.train.collective import agree_on_error

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = "lptrain-checkpoint"
FORMAT_VERSION = 2     # 1: one torch file with every rank's oracle state
RECORD_ENTRY = "record.pt"
AUTO_FIRST = 10
OVERHEAD = 0.02   # the share of the run time automatic checkpoints may take


class Checkpointer:
    """Saves checkpoints of one run (see the module docstring). Collective: every rank
    calls `save` at the same iterations."""

    def __init__(self, path: Path, every: int | None, exchange, enabled: bool,
                 optimizer, oracle, progress, meta: dict, model=None):
        self.path, self.every, self.exchange, self.enabled = Path(path), every, exchange, enabled
        self.optimizer, self.oracle, self.progress, self.meta = (optimizer, oracle, progress,
                                                                 meta)
        self.model = model          # app.ModelSaver: model.pt beside every checkpoint
        self.auto = every is None
        self.next = AUTO_FIRST if self.auto else every
        self.saved_at: int | None = None
        self.seconds = 0.0          # spent in the latest save (rank 0)

    def save(self, k: int, theta, batches, loop: dict, force: bool = False) -> None:
        if self.saved_at == k or (not force and (self.next <= 0 or k < self.next)):
            return
        t0 = time.perf_counter()
        archive, error = None, None
        if self.enabled:
            try:
                archive = AtomicArchive(self.path)
                archive.add(RECORD_ENTRY, {
                    "format": FORMAT, "format_version": FORMAT_VERSION, "iteration": k,
                    "theta": theta, "optimizer": self.optimizer.state_dict(),
                    "world_size": self.exchange.size, "batches": batches.state_dict(),
                    "rng": torch.get_rng_state(),
                    "first_objective": self.progress.first_objective,
                    "best": self.progress.best_state(),
                    "loop": {**loop, "iteration": k}, **self.meta})
            except RunFileError as exc:
                archive, error = None, exc

        def write(rank, state):          # every rank's state is received, written or not
            nonlocal archive, error
            if archive is not None:
                try:
                    archive.add(oracle_entry(rank), state)
                except RunFileError as exc:
                    archive.abort()
                    archive, error = None, exc

        self.exchange.gather_each(self.oracle.state_dict(), write)
        if archive is not None:
            try:
                archive.commit()
            except RunFileError as exc:
                error = exc
        agree_on_error(self.exchange, error)
        if self.model is not None:
            self.model.save(self.progress, self.exchange)
        self.saved_at = k
        self.seconds = time.perf_counter() - t0
        self.next = k + self._interval(k, loop["wall_time"])

    def _interval(self, k: int, wall: float) -> int:
        """Iterations to the next checkpoint; rank 0's times decide on every rank (each
        rank's clocks differ, and ranks that disagree would wait in different gathers)."""
        if not self.auto:
            return self.every
        seconds, wall = self.seconds, wall
        if self.exchange.size > 1:
            seconds, wall = (self.exchange.allreduce_sum(v if self.enabled else 0.0)
                             for v in (self.seconds, wall))
        per_iteration = wall / max(k, 1)
        return max(AUTO_FIRST, math.ceil(seconds / (OVERHEAD * max(per_iteration, 1e-9))))


def oracle_entry(rank: int) -> str:
    return f"oracle-{rank}.pt"


def load_checkpoint(path: Path, rank: int | None = None) -> dict:
    """The checkpoint's record; with `rank`, record["oracle"] is that rank's oracle state."""
    if archive_entries(path) is None:           # format 1: one torch file
        record = load_record(path, "checkpoint", FORMAT, FORMAT_VERSION)
        oracles = record.pop("oracles")
        if rank is not None:
            record["oracle"] = oracles[rank] if rank < len(oracles) else None
        return record
    record = check_record(load_entry(path, RECORD_ENTRY, "checkpoint"), path, FORMAT,
                          FORMAT_VERSION)
    if rank is not None:
        record["oracle"] = (load_entry(path, oracle_entry(rank), "checkpoint")
                            if rank < record["world_size"] else None)
    return record


def restore(record: dict, optimizer, oracle, progress, exchange) -> torch.Tensor:
    """Load a checkpoint's state (read with this rank's oracle entry) into the run's
    parts; returns θ.  The warm starts are restored only on the rank count that saved
    them."""
    theta = record["theta"]
    optimizer.load_state_dict(record["optimizer"])
    if record["world_size"] == exchange.size:
        oracle.load_state_dict(record["oracle"])
    torch.set_rng_state(record["rng"])
    progress.theta, progress.iteration = theta, record["iteration"]
    progress.first_objective = record["first_objective"]
    progress.load_best(record.get("best"))     # absent before the best was kept
    return theta
