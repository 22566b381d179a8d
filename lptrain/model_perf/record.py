"""One optimizer iteration of a mode on one layer group, recorded by running the real code.

For every rank of a layer group of `layer` ranks, the training oracle of the mode as
app.py builds it (train/oracles.py, mgrit_oracle.py, oneshot.py; data_parallel.py for
`data` > 1 groups; objective.py) runs optimizer iterations — `value` then `gradient` — on
a batch of the group's shard size.  Three parts with one role each:

- the network at zero cost (zero_cost.py) supplies the kernels: its stepper's give
  zeros instead of computing; it reports each call (name, states stacked), the serial
  mode's forward and adjoint sweeps as one call each of N layers;
- a scripted exchange per group (scripted.py) supplies the messages (zeros) and sums;
  the solvers' residual-norm sums are scripted: a solve to a tolerance stops after
  the cycles asked for;
- a `Recorder`, an `mgrit.protocols.Observer` given to the oracles (and through them
  to `LayerParallel` and its solvers), records what it is told: each kernel, each
  message and sum with its level (the layer group's, or the data groups' through
  `over_data()`), and the solvers' steps per level.  The record is what it saw.

Ranks run one after the other in this process: a rank only ever waits for messages,
and zeros do as well as states (the control flow depends on nothing else), so its log
is what it does on P ranks.  What the rank computes outside the reported kernels (the
solver's vector work, the Python around every call: `Glue`) is timed as it runs, in
this thread's CPU time, and logged before the next message or sum.  After a first
iteration, KEPT warm ones are recorded and each span of glue keeps its median over
them; their `value` and `gradient` stay apart (each ends in sums every rank waits
for).  The record is exactly what training calls, so a change to the solver, the
oracles or the adjoint changes the model with it.  Kernels are charged their measured
costs elsewhere (predict.py).
"""
from __future__ import annotations

import gc
import hashlib
import math
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Union

import torch

from lptrain.errors import LptrainError
from lptrain.model_perf.scripted import ScriptedExchange
from lptrain.model_perf.zero_cost import ZeroCostNetwork
from lptrain.modes import MGRIT, SIMULTANEOUS

LAYER, DATA = "layer", "data"     # which ranks a sum is over


class RecordingError(LptrainError):
    """A recorded iteration did not do what was asked (cycles per solve)."""


@dataclass(frozen=True)
class Kernel:
    """`calls` calls of kernel `name`, each on `states` states (stacked intervals)."""

    name: str
    states: int = 1
    calls: int = 1


@dataclass(frozen=True)
class Glue:
    """CPU seconds the rank computed outside the logged calls since its last op."""

    seconds: float


@dataclass(frozen=True)
class Send:
    """A non-blocking send of `states` states to layer rank `peer`."""

    peer: int
    states: int = 1


@dataclass(frozen=True)
class Recv:
    """A blocking receive of `states` states from layer rank `peer`."""

    peer: int
    states: int = 1


@dataclass(frozen=True)
class Allreduce:
    """A sum of `nbytes`: over the layer group (every rank waits for the last) or over
    the data groups (the same rank of every group, all alike: a delay)."""

    nbytes: int
    group: str = LAYER


Op = Union[Kernel, Glue, Send, Recv, Allreduce]
Schedule = tuple  # schedule[rank]: that rank's ops in program order


@dataclass(frozen=True)
class Record:
    """One optimizer iteration: an objective evaluation and a gradient, per layer rank.

    `steps`: per part (value, gradient) and rank, the states the solvers stepped by
    level ({level: states}), as their observer was told.
    """

    value: Schedule
    gradient: Schedule
    layer: int
    data: int
    steps: tuple = field(default=(), compare=False)

    def kernels(self) -> set[tuple[str, int]]:
        """(kernel, states per call) of every kernel call in the record."""
        return {(op.name, op.states) for part in (self.value, self.gradient)
                for ops in part for op in ops if isinstance(op, Kernel)}


def record_iteration(net, mode: str, mgrit_opts, layer: int = 1, data: int = 1,
                     fwd: int = 1, adj: int = 1, mini_batches: bool = False,
                     dtype=torch.float64, batch: int = 2) -> Record:
    """The optimizer iteration of `mode` on a layer group of `layer` ranks (of `data`
    groups) on a shard of `batch` samples: mode=mgrit solves stop after fwd / adj
    cycles, mode=simultaneous runs them.

    Raises SolverError (as training would) for more layer ranks than C-intervals.
    """
    from lptrain.parallel.context import keep_freed_memory
    keep_freed_memory()     # as the lptrain command runs: its temporaries reuse pages
    if mode == SIMULTANEOUS:
        mgrit_opts = replace(mgrit_opts, control="fixed", fwd_iters=fwd, adj_iters=adj,
                             adaptive=False, calibrate_every=0)
    theta = net.init_params(0, dtype, "cpu")
    x = torch.randn((batch, *net.in_shape), generator=torch.Generator().manual_seed(0),
                    dtype=dtype)
    y = torch.arange(batch) % net.n_classes
    ops, steps = ([], []), ([], [])      # [value, gradient][rank]
    for r in range(layer):
        ex = ScriptedExchange(r, layer)
        data_ex = ScriptedExchange(0, data) if data > 1 else None
        with collector_paused():    # its pauses are not the rank's glue
            parts = _rank_iterations(net, mode, mgrit_opts, fwd, adj, mini_batches, ex,
                                     data_ex, (theta, x, y))
        if mode != "serial":
            _check(mode, mgrit_opts, net.opts.layers, layer, fwd, ex.checks, adj,
                   ex.reversed().checks)
        for k, (part_ops, part_steps) in enumerate(parts):
            ops[k].append(part_ops)
            steps[k].append(part_steps)
    return Record(tuple(ops[0]), tuple(ops[1]), layer, data,
                  (tuple(steps[0]), tuple(steps[1])))


def _rank_iterations(net, mode: str, mgrit_opts, fwd: int, adj: int, mini_batches: bool,
                     ex, data_ex, batch) -> tuple:
    """((value ops, steps), (gradient ops, steps)) of one rank's warm iteration at
    batch = (θ, x, y).  A first iteration warms up, KEPT more are recorded, and each
    glue op keeps its median time over them (an iteration's ops are the same every
    time; the median is a typical iteration's, which a pause in one does not move)."""
    rec = Recorder()
    zero = ZeroCostNetwork(net, rec, math.prod(net.state_dims(batch[1].shape[0])))
    oracle = iteration_oracle(zero, mode, mgrit_opts, ex, data_ex, mini_batches, rec,
                              rec.over_data())
    kept = []
    for k in range(1 + KEPT):
        ex.script(fwd if mode == MGRIT else None)
        ex.reversed().script(adj if mode == MGRIT else None)
        rec.begin(k > 0)
        ev = value_of(oracle, *batch)
        value = rec.end()
        rec.begin(k > 0)
        gradient_of(oracle, ev)
        kept.append((value, rec.end()))
    return tuple((median_glue([it[part][0] for it in kept[1:]]), kept[-1][part][1])
                 for part in (0, 1))


KEPT = 3    # recorded iterations per rank after the warm-up


def median_glue(runs: list[list]) -> tuple:
    """The ops of runs that agree but for their glue, with the glue before each other
    op (and after the last) at its median seconds over the runs; runs that differ in
    more: the last run's ops."""
    split = [_segments(ops) for ops in runs]
    last_ops = split[-1][0]
    if any(others != last_ops for others, _ in split):
        return tuple(runs[-1])
    return _joined(last_ops, [statistics.median(glue[i] for _, glue in split)
                              for i in range(len(last_ops) + 1)])


def _joined(others: list, glue: list[float]) -> tuple:
    """The ops `others` with glue[i] seconds before others[i] (and glue[-1] after the
    last), none where a span is 0: _segments undone."""
    out = []
    for op, seconds in zip([*others, None], glue):
        if seconds > 0:
            out.append(Glue(seconds))
        if op is not None:
            out.append(op)
    return tuple(out)


def glue_of(record: Record) -> list:
    """The record's glue: per part (value, gradient) and rank, the seconds before each
    op but glue and after the last (what with_glue takes back)."""
    return [[_segments(ops)[1] for ops in part] for part in (record.value, record.gradient)]


def with_glue(record: Record, glue: list) -> Record:
    """`record` with the glue `glue` (glue_of's form, of a record of the same ops);
    ValueError where its shape is not the record's."""
    parts = (record.value, record.gradient)
    if len(glue) != 2 or any(len(g) != len(part) for g, part in zip(glue, parts)):
        raise ValueError("glue of another record: parts or ranks differ")
    out = []
    for part, part_glue in zip(parts, glue):
        ranks = []
        for ops, spans in zip(part, part_glue):
            others = _segments(ops)[0]
            if len(spans) != len(others) + 1:
                raise ValueError(f"glue of another record: {len(spans)} spans for "
                                 f"{len(others)} ops")
            ranks.append(_joined(others, [float(t) for t in spans]))
        out.append(tuple(ranks))
    return replace(record, value=out[0], gradient=out[1])


def ops_digest(record: Record) -> str:
    """A digest of the record's ops but glue: two records with the same one did the same
    (the same kernels, messages and sums in the same order on every rank)."""
    text = repr([[_segments(ops)[0] for ops in part]
                 for part in (record.value, record.gradient)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _segments(ops) -> tuple[list, list[float]]:
    """(the ops but glue, the glue seconds before each of them and after the last)."""
    others, glue = [], [0.0]
    for op in ops:
        if isinstance(op, Glue):
            glue[-1] += op.seconds
        else:
            others.append(op)
            glue.append(0.0)
    return others, glue


@contextmanager
def collector_paused():
    """Python's cycle collector off while a rank is recorded.  A full collection walks
    every object the process holds (a model's earlier records among them, 0.1 s and
    more) and would land, as glue, in whichever op it interrupted; a training process
    holds few objects.  Collections that fall due run before the next rank (the rank's
    solver is garbage in cycles: its buffers go then)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def iteration_oracle(net, mode: str, mgrit_opts, exchange, data_exchange=None,
                     mini_batches: bool = False, observer=None, data_observer=None):
    """A rank's training oracle as app.py builds it: the mode's data terms on the layer
    group's `exchange`, summed over the data groups (`data_exchange`, None: one group),
    and the regulariser; `observer` / `data_observer` (mgrit.protocols.Observer, None:
    none) are told of what the data terms / the sums over the groups do."""
    from lptrain.train.data_parallel import DataParallelOracle
    from lptrain.train.objective import Objective
    from lptrain.train.terms import make_oracle
    terms = make_oracle(SimpleNamespace(name=mode, warm_batches=1), net, exchange, mgrit_opts,
                        mini_batches, observer)
    if data_exchange is not None:
        terms = DataParallelOracle(terms, data_exchange, data_observer)
    return Objective(terms, net)


def value_of(oracle, theta, x, y):
    """The objective evaluation that opens an optimizer iteration on the batch (x, y)."""
    from lptrain.train.oracles import Batch
    oracle.begin(Batch(x, y, 0, x.shape[0]))
    return oracle.value(theta)


def gradient_of(oracle, ev):
    """The gradient of the evaluation `ev`, accepted."""
    grad = oracle.gradient(ev)
    oracle.accept(ev)
    return grad


def solve_cycles(mode: str, mgrit_opts, fwd: float, adj: float) -> tuple:
    """The (forward, adjoint) cycles a solve of `mode` runs when asked for fwd / adj, as
    training runs them: mode=mgrit stops at max_iter / adj_max_iter, and runs them all
    without a tolerance (tol = rtol = 0: a fixed solve); a one-shot solve runs fwd / adj,
    unless they reach both limits, where its first rung is already the top one
    (train/oneshot.py Rungs), which solves with max_iter / adj_max_iter."""
    o = mgrit_opts
    most = (o.max_iter, o.adjoint_max_iter)
    if mode == MGRIT:
        return tuple(n if f else min(k, n) for k, n, f in zip((fwd, adj), most,
                                                             o.fixed_solves))
    if mode == SIMULTANEOUS and fwd >= most[0] and adj >= most[1]:
        return most
    return fwd, adj


def _check(mode: str, mgrit_opts, n_layers: int, layer: int, fwd: int, fwd_checks: int,
           adj: int, adj_checks: int) -> None:
    """The solves did the cycles asked for: a warm solve of k cycles measures its
    residual k + 1 times (none with one level)."""
    hier = mgrit_opts.hierarchy(n_layers, layer)
    if len(hier.levels) < 2:
        want = (0, 0)
    else:
        want = tuple(k + 1 for k in solve_cycles(mode, mgrit_opts, fwd, adj))
    if (fwd_checks, adj_checks) != want:
        raise RecordingError(f"mode={mode}: asked for {fwd} forward and {adj} adjoint "
                             f"cycles, the solves measured their residual {fwd_checks} and "
                             f"{adj_checks} times (expected {want[0]} and {want[1]})")


class Recorder:
    """An `mgrit.protocols.Observer` that keeps one rank's ops, between begin() and
    end() (nothing unless kept), in the order it is told of them.

    Sums are the layer group's; `over_data()` is the same recorder for the sums over
    the data groups.  Consecutive calls of one kernel on as many states merge; the
    CPU time between reports, less the kernels' own, accumulates and goes in as one
    Glue before the next message or sum (where it falls among the kernels between
    two of those does not matter).
    """

    def __init__(self, tape: "_Tape | None" = None, group: str = LAYER):
        self.tape, self.group = tape or _Tape(), group

    def over_data(self) -> "Recorder":
        return Recorder(self.tape, DATA)

    def begin(self, kept: bool) -> None:
        self.tape.begin(kept)

    def end(self) -> tuple[list, dict]:
        """(the ops, {level: states stepped}) since begin()."""
        return self.tape.end()

    def step(self, level: int, states: int, last: bool) -> None:
        if self.tape.ops is not None:
            self.tape.steps[level] = self.tape.steps.get(level, 0) + states

    def message(self, level: int, peer: int, sent: bool) -> None:
        self.tape.add(Send(peer) if sent else Recv(peer))

    def sum(self, level: int, values: int, itemsize: int = 8) -> None:
        self.tape.add(Allreduce(values * itemsize, self.group))

    def kernel(self, name: str, states: int, seconds: float) -> None:
        self.tape.kernel(name, states, seconds)


class _Tape:
    """A rank's ops as its recorders are told of them, and the glue between."""

    def __init__(self):
        self.ops, self.steps = None, {}
        self.glue, self.mark = 0.0, time.thread_time()

    def begin(self, kept: bool) -> None:
        self.ops, self.steps = ([] if kept else None), {}
        self.glue, self.mark = 0.0, time.thread_time()

    def end(self) -> tuple[list, dict]:
        self._flush()
        ops, steps, self.ops = self.ops, self.steps, None
        return ops, steps

    def _flush(self) -> None:
        """The glue since the last report goes in (a message or sum follows)."""
        now = time.thread_time()
        self.glue += now - self.mark
        self.mark = now
        if self.ops is not None and self.glue > 0:
            self.ops.append(Glue(self.glue))
        self.glue = 0.0

    def add(self, op: Op) -> None:
        """A message or sum (instantaneous here)."""
        self._flush()
        if self.ops is not None:
            self.ops.append(op)

    def kernel(self, name: str, states: int, seconds: float) -> None:
        """A kernel call that took `seconds` (not glue) and ended just now."""
        now = time.thread_time()
        self.glue += now - self.mark - seconds
        self.mark = now
        if self.ops is None:
            return
        op, last = Kernel(name, states), self.ops[-1] if self.ops else None
        if isinstance(last, Kernel) and (last.name, last.states) == (name, states):
            op = Kernel(name, states, last.calls + 1)
            self.ops.pop()
        self.ops.append(op)
