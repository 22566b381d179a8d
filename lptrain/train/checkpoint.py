"""Checkpoints: everything a run needs to continue exactly where it stopped.

`<run dir>/checkpoint.pt` (written by rank 0, atomically: write + rename) holds the
parameters, the optimizer's state (L-BFGS memory, current point and gradient; the
torch.optim state_dict of SGD and Adam), the order of the mini-batches (generator state
and the rest of the epoch), the torch RNG state, the divergence rule's reference, the
best validated parameters so far (model.pt's), the loop's validation record and elapsed
time, and every rank's oracle state (its block of the warm-start states, compact: two
state tensors per C-point of it and kept batch in the MGRIT modes, train/warm.py; none
in serial mode). The world size and the layer × data grid that saved it are recorded.

The file is an archive (model/saved.py AtomicArchive): the record as entry `record.pt`,
L-BFGS's pairs raw as `pairs.bin` (train/stored_pairs.py: a resuming rank reads its part
of them only) and rank r's oracle state as `oracle-r.pt`. Rank 0 receives and writes the
pairs one vector at a time and the ranks' states one rank at a time, so a checkpoint
costs it one vector and one rank's warm starts, not all of them.

Resume: on the grid that saved it every rank reads its own entry. On another rank count
or grid each rank reads the entries of the old ranks that held some of its layers and
samples, one at a time, and assembles its blocks (train/regrid.py; which layers and
samples an old rank held follows from the grid, the hierarchy and the batches, so none
of it is stored). MGRIT's iterates do not depend on the partition, so either way the
resumed run continues the uninterrupted one. Files of format 2 (no grid recorded) still
load: on the rank count that saved them as before, on another one without their warm
starts (a cold start at the next iteration); files of format 3 (the pairs in the record)
load whole on every rank. Format 1 (one torch file, from development versions before the
archive) is refused, naming it.

When: every `checkpoint_every` iterations; when the ranks stop for a signal or because
metrics.h5 can no longer be written (a full disk: the checkpoint may then use the space
that file kept in reserve); at the end. When a checkpoint cannot be written (a full disk)
and this start has written no full one (nor resumed from one, which is exact to resume),
rank 0 tries a lean one, the same record with every rank's warm starts left out (a few
parameter-sized tensors instead of up to 2 × (N/(cP)) × batch × width values per rank and batch):
the run still ends with the error, but its finished iterations can be resumed once the
cause is fixed (the MGRIT solves then start cold). An earlier checkpoint is only replaced
by a complete new file (write + rename).
Each checkpoint also rewrites model.pt and model-last.pt (the `model` saver), before the
checkpoint itself, so a run killed without warning (SIGKILL, a cluster's time limit) leaves
models at least as new as its last checkpoint; a model that cannot be written does not keep
the checkpoint from being written (its error is raised after).
`checkpoint_every=null` (the default) chooses the interval itself so that checkpoints
cost under 2 % of the run: the first checkpoint is at iteration AUTO_FIRST, then the
interval is max(AUTO_FIRST, 50 × (seconds per checkpoint) / (seconds per iteration)),
or longer where this start's checkpoints with the next would take more than 2 % of
the wall time by then (checkpoints that grow).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from lptrain.errors import InputFileError, LptrainError, RunFileError
from lptrain.model.saved import (AtomicArchive, archive_entries, check_record, load_entry,
                                 load_record)
from lptrain.parallel.blocks import Layout, sources
from lptrain.parallel.grid import Grid
from lptrain.train.collective import agree_on_error, collectively, in_turns
from lptrain.train.regrid import fits, regrid
from lptrain.train.run_state import FORMAT, FORMAT_VERSION, LoopState, RunState
from lptrain.train.stored_pairs import (PAIRS_ENTRY, StoredVector, has_pairs, stored_in,
                                        with_places)

CHECKPOINT_FILE = "checkpoint.pt"
RECORD_ENTRY = "record.pt"
AUTO_FIRST = 10
OVERHEAD = 0.02   # the share of the run time automatic checkpoints may take


class Checkpointer:
    """Saves checkpoints of one run (see the module docstring). Collective: every rank
    calls `save` at the same iterations."""

    def __init__(self, path: Path, every: int | None, exchange, enabled: bool,
                 optimizer, oracle, progress, config: str, grid: Grid | None = None,
                 model=None, signature: dict | None = None):
        self.path, self.every, self.exchange, self.enabled = Path(path), every, exchange, enabled
        self.optimizer, self.oracle, self.progress = optimizer, oracle, progress
        self.config, self.grid = config, grid
        self.model = model          # model_files.ModelSaver: model.pt beside each checkpoint
        self.signature = signature  # θ's names and shapes (ResNet.signature)
        self.auto = every is None
        self.next = AUTO_FIRST if self.auto else every
        self.saved_at: int | None = None
        self.full_at: int | None = None   # the iteration of this start's latest full file
        self.seconds = 0.0          # spent in the latest save (rank 0)
        self.total = 0.0            # ... in all saves of this start (rank 0)

    def save(self, k: int, theta, batches, loop: LoopState, force: bool = False) -> None:
        """Write the checkpoint of iteration k (collective); when it cannot be written,
        write a lean one if that can be, and raise RunFileError on every rank saying what
        was kept."""
        if self.saved_at == k or (not force and (self.next <= 0 or k < self.next)):
            return
        t0 = time.perf_counter()
        # the models first: a kill between the two files leaves models at least as new as
        # the checkpoint's checked parameters (SGD, Adam: its θ waits for the next step's
        # objective); the checkpoint is written even when they cannot be
        model_error = None
        if self.model is not None:
            try:
                self.model.save(self.progress, self.exchange)
            except LptrainError as exc:       # raised alike on every rank
                model_error = exc
        run = None
        optimizer, vectors = self.optimizer.state_and_vectors()
        if self.enabled:
            run = RunState(iteration=k, theta=theta, optimizer=optimizer,
                           batches=batches.state_dict(), rng=torch.get_rng_state(),
                           first_objective=self.progress.first_objective,
                           best=self.progress.best_state(),
                           pending=self.progress.pending_state(), loop=loop,
                           config=self.config, world_size=self.exchange.size, grid=self.grid,
                           signature=self.signature)
        state = self.oracle.state_dict()
        error = self._write(run and run.to_record(), vectors, state)
        lean = False
        # a full checkpoint of this start on disk is kept rather than replaced by a lean
        # newer one: its resume is exact and redoes a few iterations, a lean one's starts
        # cold and drifts from the run it carries on
        if _anywhere(self.exchange, error is not None) and self.full_at is None and \
                _anywhere(self.exchange, bool(self.oracle.warm_entries(state))):
            run = run and replace(run, warm_starts=False)
            lean = self._write(run and run.to_record(), vectors,
                               self.oracle.with_warm_entries(state, [])) is None
        agree_on_error(self.exchange, error and RunFileError(f"{error}; {self._kept(k, lean)}"))
        if model_error is not None:
            raise model_error
        self.saved_at = self.full_at = k
        self.seconds = time.perf_counter() - t0
        self.total += self.seconds
        self.next = k + self._interval(k, loop.wall_time)

    def _kept(self, k: int, lean: bool) -> str:
        """What a failed checkpoint leaves to resume from (rank 0)."""
        if lean:      # the resume command follows (stops.resume_hint)
            return (f"wrote {self.path.name} of iteration {k} without the warm starts "
                    f"instead (a resume's MGRIT solves start cold)")
        if self.full_at is not None:
            return (f"the {self.path.name} of iteration {self.full_at} is kept (a resume "
                    f"goes on from there exactly)")
        if self.path.is_file():
            return f"the {self.path.name} written before is kept"
        return "no checkpoint was written"

    def _write(self, record: dict | None, vectors, state) -> RunFileError | None:
        """Rank 0 writes `record`, the optimizer's `vectors()` (stored_pairs.py: each
        received whole and written, one at a time) and every rank's oracle `state` (each
        rank's is received, written or not: collective); the error on rank 0, if any."""
        archive, error = None, None
        whole = vectors()        # collective: every rank runs it through
        if self.enabled:
            try:
                archive = AtomicArchive(self.path)
                places = archive.add_raw(PAIRS_ENTRY, whole) if has_pairs(record) else []
                archive.add(RECORD_ENTRY, with_places(record, places))
            except RunFileError as exc:
                archive, error = None, exc
        for _ in whole:          # the other ranks' parts, and what a failed write left
            pass

        def write(rank, part):
            nonlocal archive, error
            if archive is not None:
                try:
                    archive.add(oracle_entry(rank), part)
                except RunFileError as exc:
                    archive.abort()
                    archive, error = None, exc

        self.exchange.gather_each(state, write)
        if archive is not None:
            try:
                archive.commit()
            except RunFileError as exc:
                error = exc
        return error

    def _interval(self, k: int, wall: float) -> int:
        """Iterations to the next checkpoint: the latest one's seconds at most OVERHEAD of
        the iterations to the next, and all of this start's with the next at most OVERHEAD
        of the run's wall time by then (checkpoints that grow, as the image recipes' kept
        warm starts do in their first epoch, had the next one chosen from a cheaper one).
        Rank 0's times decide on every rank (each rank's clocks differ, and ranks that
        disagree would wait in different gathers)."""
        if not self.auto:
            return self.every
        seconds, total = self.seconds, self.total
        if self.exchange.size > 1:
            seconds, total, wall = (self.exchange.allreduce_sum(v if self.enabled else 0.0)
                                    for v in (self.seconds, self.total, wall))
        per_iteration = max(wall / max(k, 1), 1e-9)
        each = seconds / (OVERHEAD * per_iteration)
        overall = ((total + seconds) / OVERHEAD - wall) / per_iteration
        return max(AUTO_FIRST, math.ceil(max(each, overall)))


def _anywhere(exchange, flag: bool) -> bool:
    """Whether `flag` holds on any rank (collective)."""
    return exchange.allreduce_sum(float(flag)) > 0 if exchange.size > 1 else flag


def oracle_entry(rank: int) -> str:
    return f"oracle-{rank}.pt"


def load_checkpoint(path: Path, rank: int | None = None) -> dict:
    """The checkpoint's record as stored (read_run_state gives it as a RunState); with
    `rank`, record["oracle"] is the oracle state that rank saved (None beyond the ranks
    that saved it)."""
    if archive_entries(path) is None:           # not an archive: what is it?
        record = load_record(path, "checkpoint", FORMAT, FORMAT_VERSION)
        raise InputFileError(f"{path}: checkpoint format {record.get('format_version', 1)} "
                             f"as one torch file (format 1, from development versions) is "
                             f"not read by this lptrain; start the run anew")
    record = stored_in(path, check_record(load_entry(path, RECORD_ENTRY, "checkpoint"),
                                          path, FORMAT, FORMAT_VERSION))
    if rank is not None:
        record["oracle"] = saved_state(path, rank) if rank < record["world_size"] else None
    return record


def read_run_state(path: Path) -> RunState:
    """The run state of the checkpoint at `path` (any format); InputFileError for a
    record without a part every checkpoint has."""
    try:
        return RunState.from_record(load_checkpoint(path))
    except KeyError as exc:
        raise InputFileError(f"{path}: not a whole checkpoint (its record has no "
                             f"{exc.args[0]!r})") from None


def saved_state(path: Path, rank: int) -> dict:
    """The oracle state old rank `rank` saved."""
    return load_entry(path, oracle_entry(rank), "checkpoint")


@dataclass(frozen=True)
class Placement:
    """Where a run keeps its warm starts: its grid, the layout of a grid for its network
    and data (parallel.blocks.layout), the samples of batch `key` (loop.batch_samples),
    and the samples' axis of a warm-start tensor (rows at axis 0, then a state)."""

    grid: Grid
    layout: Callable[[Grid], Layout]
    samples: Callable[[int], torch.Tensor]
    axis: int


def oracle_state(path: Path, run: RunState, rank: int, here: Placement,
                 oracle) -> dict | None:
    """This rank's oracle state for a run placed `here`: its own entry on the grid that
    saved the checkpoint, else assembled from the old ranks' entries it overlaps
    (train/regrid.py); None (cold start) for a format 2 checkpoint of another rank
    count, or of another grid (its blocks do not fit this rank's)."""
    saved = run.grid
    if saved == here.grid:
        return saved_state(path, rank)
    if saved is None:
        if run.world_size != here.grid.size:
            return None
        state = saved_state(path, rank)
        fit = fits(here.layout(here.grid), rank, here.samples, state, oracle, here.axis)
        return state if fit else None
    old, new = here.layout(saved), here.layout(here.grid)
    states = ((r, saved_state(path, r)) for r in sources(old, new, rank))
    try:
        return regrid(old, new, rank, here.samples, states, oracle, here.axis)
    except ValueError as exc:
        raise InputFileError(f"{path}: warm starts do not fit the {saved} grid that saved "
                             f"them ({exc})") from None


def read_oracle_state(exchange, path: Path, run: RunState, here: Placement, oracle):
    """oracle_state of every rank, collectively (a failure on one rank fails all); an
    older checkpoint's warm starts only if they fit on every rank. When the ranks
    assemble their states from old ranks' entries, the ranks of a node take turns: each
    holds an old rank's state meanwhile, which may be larger than its own."""
    def read():
        return oracle_state(path, run, exchange.rank, here, oracle)
    saved = run.grid
    if saved == here.grid:
        return collectively(exchange, read)
    if saved is None:      # warm starts on every rank or none: a layer group's ranks
        state = collectively(exchange, read)       # must all start warm or all cold
        cold = exchange.allreduce_sum(float(state is None)) if exchange.size > 1 else 0
        return None if cold else state
    return in_turns(exchange, read)


def restore(run: RunState, optimizer, oracle, progress, state: dict | None,
            device="cpu") -> torch.Tensor:
    """Load a checkpoint's run state and this rank's oracle `state` (oracle_state; None:
    the warm starts start cold) into the run's parts, their tensors on the run's `device`
    (a checkpoint is read onto the CPU; torch's RNG state stays there); returns θ. The
    loop's part (run.loop, run.batches) goes to train/loop.py train."""
    theta = run.theta.to(device)
    optimizer.load_state_dict(_on(run.optimizer, device))
    if state is not None:
        oracle.load_state_dict(_on(state, device))
    torch.set_rng_state(run.rng)
    progress.theta, progress.iteration = theta, run.iteration
    progress.first_objective = run.first_objective
    progress.load_best(_on(run.best, device))     # None before the best was kept
    progress.load_pending(_on(run.pending, device), theta, run.iteration)  # SGD, Adam
    return theta


def _on(value, device):
    """`value` with every tensor in it (and every stored vector) on `device`."""
    if isinstance(value, (torch.Tensor, StoredVector)):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _on(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on(v, device) for v in value)
    return value
