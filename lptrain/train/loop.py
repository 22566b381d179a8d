"""The training loop shared by every mode: batches, optimizer steps, validation, records."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from lptrain.errors import Interrupted, LptrainError
from lptrain.train.guard import Progress
from lptrain.train.notes import SolveNotes
from lptrain.train.protocol import Batch
from lptrain.train.run_state import LoopState, RunState
from lptrain.train.stall import StallRule
from lptrain.train.stop import NoStop


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed + 1)


def batch_parts(n: int, batch_size: int | None, gen: torch.Generator) -> list:
    """The fixed mini-batches of n samples (index tensors, drawn from `gen`); [None] for
    the full batch."""
    if batch_size is None or batch_size >= n:
        return [None]
    perm = torch.randperm(n, generator=gen)
    return [perm[i:i + batch_size] for i in range(0, n, batch_size)]


def batch_samples(n: int, batch_size: int | None, seed: int):
    """key -> the training-set indices of batch `key` in batch order, as Batches draws
    them (the full batch: 0..n−1); ValueError for a key no batch has."""
    parts = batch_parts(n, batch_size, _generator(seed))

    def samples(key: int) -> torch.Tensor:
        if not 0 <= key < len(parts):
            raise ValueError(f"batch {key}: the run has {len(parts)} batches")
        return torch.arange(n) if parts[key] is None else parts[key]
    return samples


def batches_of(data, opts) -> "Batches":
    """The training batches of this rank's shard of `data` (train.batch_size, seed)."""
    lo, n_total = data.meta.get("shard", (0, data.x_train.shape[0]))
    return Batches(data.x_train, data.y_train, opts.train.batch_size, opts.seed, n_total,
                   lo)


def validation_chunk(batches: "Batches") -> int:
    """The samples a validation pass takes at once on this rank: no more than a training
    batch (`train`; a saved model's `evaluate` steps the same, model/saved.py)."""
    return batches.local_size()


class Batches:
    """Fixed, seeded mini-batches visited in a fresh random order every epoch.

    Fixed batches let the simultaneous mode keep a warm start per batch;
    batch_size None gives the full batch (key 0) every iteration.  x and y
    may be a shard, samples offset..offset+len(x)−1 of n_total (a data
    group's): the batches are drawn from all n_total samples alike on every
    rank, and each rank gets the samples of its shard (possibly none).
    """

    def __init__(self, x, y, batch_size: int | None, seed: int, n_total: int | None = None,
                 offset: int = 0):
        self.x, self.y = x, y
        n = x.shape[0] if n_total is None else n_total
        self.n, self.lo, self.hi = n, offset, offset + x.shape[0]
        self.gen = _generator(seed)
        self.parts = batch_parts(n, batch_size, self.gen)
        self.order: list[int] = []

    def local_size(self) -> int:
        """The most samples of this shard one batch can hold (at least 1)."""
        if len(self.parts) == 1:
            return max(self.x.shape[0], 1)
        return max(1, *(int(((p >= self.lo) & (p < self.hi)).sum()) for p in self.parts))

    def state_dict(self) -> dict:
        """The generator and the rest of this epoch's order (the parts follow the seed)."""
        return {"generator": self.gen.get_state(), "order": list(self.order)}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["generator"])
        self.order = list(state["order"])

    def next(self) -> Batch:
        if len(self.parts) == 1:
            return Batch(self.x, self.y, 0, self.n)
        if not self.order:
            self.order = torch.randperm(len(self.parts), generator=self.gen).tolist()
        key = self.order.pop(0)
        part = self.parts[key]
        mine = part[(part >= self.lo) & (part < self.hi)] - self.lo
        idx = mine.to(self.x.device)
        return Batch(self.x[idx], self.y[idx], key, part.numel())


@dataclass(kw_only=True)
class Outcome:
    """How a run ended: its last iteration's values and the last validation."""

    iterations: int
    objective: float
    loss: float
    accuracy: float
    val_loss: float
    val_accuracy: float
    best_val_accuracy: float
    wall_time: float
    converged: bool
    stalled: str | None = None    # why the run stopped making progress (train/stall.py)
    at_start: bool = False        # objective, loss, accuracy: of the last step's start
    # mini-batches: the mean objective of the last whole epoch (None: the full batch, or
    # no whole epoch yet); one batch's objective is too noisy to rank runs by
    epoch_objective: float | None = None

    @property
    def ranked(self) -> float:
        """What a sweep ranks this run by (cli.py returns it to the sweeper): the last
        whole epoch's mean objective with mini-batches, else the final objective."""
        return self.objective if self.epoch_objective is None else self.epoch_objective


def train(theta, optimizer, oracle, data, opts, writer, console, exchange,
          progress: Progress | None = None, stop=None, checkpoint=None,
          resume: RunState | None = None) -> tuple:
    """Run opts.train.iterations optimizer steps; returns (θ, Outcome).

    `progress` (a guard.Progress) is kept at the last iteration that passed the
    divergence rule, also when an exception ends the loop; `stop` (a
    guard.StopSignals) is asked after every iteration whether the ranks stop.
    `checkpoint` (a train.checkpoint.Checkpointer) saves every few iterations, when
    the ranks stop for a signal, and at the end; `resume` is the run state of a checkpoint
    whose other parts were loaded into θ, optimizer, oracle and progress (checkpoint.restore):
    the loop continues from its `loop` and `batches`.
    """
    progress = progress or Progress(theta)
    stop = stop or NoStop()
    batches = batches_of(data, opts)
    stall = StallRule(opts.train.patience, len(batches.parts))
    chunk = validation_chunk(batches)
    if resume is None:
        start = time.perf_counter()
        val = _validate(0, theta, oracle, data, writer, chunk, console)
        best, k0, val_at = val[1], 0, 0
        progress.validated(0, *val, theta)
    else:
        batches.load_state_dict(resume.batches)
        if resume.loop.stall is not None:    # None: written before the stall rule
            stall.load_state_dict(resume.loop.stall)
        start = time.perf_counter() - resume.loop.wall_time
        val, best, k0 = resume.loop.val, resume.loop.best, resume.iteration
        val_at = resume.loop.val_iteration
    info, k, wall = None, k0, time.perf_counter() - start
    notes = SolveNotes(console, opts.mgrit, opts.dtype, bool(opts.network.step))
    if resume is not None and resume.loop.notes is not None:
        notes.load_state_dict(resume.loop.notes)

    def save(k, force=False):
        if checkpoint is not None:
            loop = LoopState(val=val, val_iteration=val_at, best=best,
                             stall=stall.state_dict(), notes=notes.state_dict(),
                             wall_time=time.perf_counter() - start)
            checkpoint.save(k, theta, batches, loop, force)

    _checked(stop, exchange, k0, writer, save)
    for k in range(k0 + 1, opts.train.iterations + 1):
        batch = batches.next()
        oracle.begin(batch)
        t0, c0, w0 = time.perf_counter(), exchange.clock.comm, exchange.clock.wait
        theta, info = optimizer.step(theta, oracle)
        dt = time.perf_counter() - t0
        spent = (exchange.clock.comm - c0, exchange.clock.wait - w0)   # the step's alone
        stats = oracle.record()      # collective on a data grid: every rank, every time
        stalled = stall.update(info.objective, info.exhausted, batch.n or 1)
        last = k == opts.train.iterations or info.converged or stalled
        validate = k % opts.eval_every == 0 or last
        if validate:
            val = _validate(k, theta, oracle, data, writer, chunk, console)
            best, val_at = max(best, val[1]), k
        wall = time.perf_counter() - start   # the run's wall time: to the end of this
        _log_step(k, info, dt, wall, stats, writer)     # iteration, its validation included
        _log_timing(k, dt, exchange, *spent, writer)
        console.update(k, wall, objective=info.objective, loss=info.loss,
                       accuracy=info.accuracy, val_accuracy=val[1], val_iteration=val_at,
                       step_time=dt,
                       **_console_mgrit(stats))
        notes.after(k, stats)
        progress.check(k, info.objective, theta, info.at_start)
        if validate:                 # a candidate for the best once k passed the check
            progress.validated(k, *val, theta)
        # a signal in the run's last iteration stops nothing: the run ends anyway, and
        # the command says so (cli.py); only a failed metrics file still raises here
        _checked(stop, exchange, k, writer, save, signals=not last)
        save(k)
        if info.converged:
            console.message(f"gradient norm {info.grad_norm:.3e} below gtol: stopping")
            break
        if stalled:
            break
    progress.finish()
    save(k, force=True)
    return theta, _outcome(k, info, val, best, wall, stall)


def _outcome(k: int, info, val, best: float, wall: float, stall: StallRule) -> Outcome:
    """How the run ended (`info` None: resumed at its last iteration, nothing done)."""
    epoch = stall.last_epoch if stall.per_epoch > 1 else None
    if info is None:
        return Outcome(iterations=k, objective=math.nan, loss=math.nan, accuracy=math.nan,
                       val_loss=val[0], val_accuracy=val[1], best_val_accuracy=best,
                       wall_time=wall, converged=False, epoch_objective=epoch)
    return Outcome(iterations=k, objective=info.objective, loss=info.loss,
                   accuracy=info.accuracy, val_loss=val[0], val_accuracy=val[1],
                   best_val_accuracy=best, wall_time=wall,
                   converged=bool(info.converged), stalled=stall.stalled,
                   at_start=info.at_start, epoch_objective=epoch)


def _log_step(k: int, info, dt: float, wall: float, stats: dict | None, writer) -> None:
    """Iteration k's train/ row and its MGRIT row (stats: the oracle's record; None:
    none)."""
    writer.log_train(iteration=k, objective=info.objective, loss=info.loss,
                     accuracy=info.accuracy, grad_norm=info.grad_norm,
                     step_size=info.step_size, step_time=dt, wall_time=wall,
                     ls_trials=info.ls_trials, lbfgs_skipped=info.lbfgs_skipped,
                     lbfgs_reset=info.lbfgs_reset, ls_failed=info.ls_failed)
    if stats is not None:            # a non-finite objective's: its forward solve alone
        writer.log_mgrit(iteration=k, **stats)


def _checked(stop, exchange, k, writer, save, signals: bool = True):
    """stop.check; a stop for a signal is checkpointed first, and so is one because rank
    0's metrics file failed (a full disk: metrics.h5 is closed now, so the checkpoint may
    use the space it kept in reserve) if the checkpoint can be written; that failure is
    the one reported, with what became of the checkpoint (resume needs one). Where the
    failed write lost iteration k's rows, no checkpoint of k is written: a resume from
    the last one (if any) writes them again, and metrics.h5 has no gap."""
    try:
        stop.check(exchange, k, writer, signals)
    except Interrupted:
        save(k, force=True)
        raise
    except LptrainError as failure:     # raised alike on every rank: save collectively
        if getattr(failure, "rows_lost", False):
            failure.args = (f"{failure}; iteration {k}'s rows are not in the metrics "
                            f"file, so no checkpoint of it is written",)
            raise failure
        try:
            save(k, force=True)
        except LptrainError as also:
            failure.args = (f"{failure}; {also}",)
        raise failure


def _validate(k, theta, oracle, data, writer, chunk, console):
    console.doing("validating")     # the live display says so until the next update
    loss, acc = oracle.validate(theta, data.x_val, data.y_val, chunk)
    writer.log_validation(iteration=k, loss=loss, accuracy=acc)
    return loss, acc


def _log_timing(k, dt, exchange, comm, wait, writer):
    """Iteration k's timing/ row: each rank's step of dt seconds, of which comm and wait
    in communication calls and waiting for messages (not the validation after it)."""
    rows = exchange.gather([max(dt - comm - wait, 0.0), comm, wait])
    if rows is not None:
        writer.log_timing(iteration=k, compute=[r[0] for r in rows],
                          communication=[r[1] for r in rows], waiting=[r[2] for r in rows])


def _console_mgrit(stats):
    if stats is None:
        return {}
    keys = ("fwd_iterations", "fwd_residual", "adj_iterations", "adj_residual", "grad_error")
    return {key: stats[key] for key in keys}
