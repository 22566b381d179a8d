"""Which steps, messages and allreduces one MGRIT solve performs on every rank.

The schedule is recorded from the solver itself, not re-derived: for each
rank, `MGRIT` solves with a recording exchange (it logs each message and
receives zeros; the residual-norm sums return scripted values, which decide
where a solve stops) and a counting propagator (it logs how many states each
call advances and computes nothing).  The solver's control flow depends on
nothing else, so the log is what that rank does on P ranks, and a change to
the solver changes the model with it.  A schedule is a list of op lists,
`schedule[rank]`, in program order; ranks are the solver's own numbering (for
the adjoint, the mirrored one: see `mirrored`).  The method is docs/method.md §3–§4.
"""
from __future__ import annotations

from dataclasses import astuple, dataclass, replace
from functools import lru_cache
from typing import Union

import torch

from lptrain.errors import LptrainError
from lptrain.mgrit.hierarchy import Hierarchy, build_hierarchy, build_levels
from lptrain.mgrit.solver import MGRIT, CycleOptions

# which measured cost a step is charged (see simulate.StepCosts)
FORWARD = "forward"        # u ← u + H σ(K u + b)
ADJOINT = "adjoint"        # λ ← λ + H Kᵀ[σ′ ⊙ λ] with σ′ stored
DERIVATIVE = "derivative"  # σ′ of a layer from the activations its forward step saved
LINEARIZE = "linearize"    # σ′(K u + b) of a layer recomputed from its input state
WEIGHTS = "weights"        # weight-gradient product of a layer
COSTS = (FORWARD, ADJOINT, DERIVATIVE, LINEARIZE, WEIGHTS)

# which iteration of `MGRIT._iterate` (see iteration_schedule)
COLD, FIRST, FRESH = "cold", "first", "fresh"
KINDS = (COLD, FIRST, FRESH)


class RecordingError(LptrainError):
    """A recorded solve did not do what the model reads from it (stop at the scripted
    check, end with its closing residual, name its levels): the model needs updating."""


@dataclass(frozen=True)
class Step:
    """`count` states advanced by one step each, in `calls` kernel calls."""

    cost: str
    count: int
    calls: int = 1
    level: int = 0
    share: float = 1.0   # fraction of the full batch in each state (data parallel)


@dataclass(frozen=True)
class Send:
    """A non-blocking send of one state to rank `peer`."""

    peer: int
    nbytes: int
    level: int = 0


@dataclass(frozen=True)
class Recv:
    """A blocking receive of one state from rank `peer`."""

    peer: int
    nbytes: int
    level: int = 0


@dataclass(frozen=True)
class Allreduce:
    """A sum over all ranks: every rank waits for the last one."""

    nbytes: int = 8


Op = Union[Step, Send, Recv, Allreduce]
Schedule = list[list[Op]]


def hierarchy_for(n_layers: int, opts, size: int) -> Hierarchy:
    """The solver's hierarchy for `opts` (MGRITOptions) on `size` ranks.

    Raises SolverError, as the solver does, when size exceeds max_ranks.
    """
    return build_hierarchy(n_layers, opts.cfactor0, opts.cfactor, opts.levels,
                           opts.min_coarse, size)


def max_ranks(n_layers: int, opts) -> int:
    """The most ranks the solver accepts: C-intervals of the finest level (steps if 1 level)."""
    levels = build_levels(n_layers, opts.cfactor0, opts.cfactor, opts.levels, opts.min_coarse)
    return len(levels[0].cpoints) - 1 if len(levels) > 1 else n_layers


def append(ops: list, op: Op) -> None:
    """Append op, merging it into a directly preceding step of the same kind.

    Steps merge only with the same states per call, so count / calls stays exact.
    """
    if isinstance(op, Step):
        if op.count <= 0:
            return
        last = ops[-1] if ops else None
        if isinstance(last, Step) and (last.cost, last.level, last.share) == \
                (op.cost, op.level, op.share) and last.count * op.calls == op.count * last.calls:
            ops[-1] = Step(op.cost, last.count + op.count, last.calls + op.calls, op.level,
                           op.share)
            return
    ops.append(op)


# -- public schedules ------------------------------------------------------------------------
def solve_schedule(hier: Hierarchy, opts, iterations: int, cold: bool = False,
                   converged: bool = False, nbytes: int = 0, cost: str = FORWARD,
                   linear: bool = False) -> Schedule:
    """A whole `MGRIT.solve` that performs `iterations` cycles.

    converged: the solve stopped at the tolerance check that opens cycle
    `iterations` (fewer cycles than max_iter; mode=mgrit).  Otherwise it ran
    all its cycles and ends with the residual norm of the returned states
    (mode=simultaneous).  One level is serial stepping, whatever the rest.
    opts: MGRITOptions or CycleOptions; linear: the adjoint's solver.
    """
    cyc = _cycle_key(opts, linear)
    return _sized(_solve_ops(hier, cyc, iterations, cold, converged, cost), nbytes)


def iteration_schedule(hier: Hierarchy, opts, which: str = FRESH, nbytes: int = 0,
                       cost: str = FORWARD, linear: bool = False) -> Schedule:
    """One iteration of `MGRIT._iterate` (at least two levels), with nrelax0 = 0 counted
    with the residual its last F-relaxation takes for the next check (not in that
    check's count).

    which: COLD (first cycle of a cold start with skip_first_down: injection to
    the coarsest level, F-relaxations on the way up, no norm), FIRST (first
    cycle of a warm start, or of a cold one without skip_first_down: full
    level-0 relaxation) or FRESH (every later cycle:
    the first level-0 F-relaxation is skipped, its F-points being fresh).
    nbytes: bytes of one state message; opts: MGRITOptions or CycleOptions;
    linear: the adjoint's solver (coarse levels solve for corrections, so
    the restriction has no Φ^Δ(v)).
    """
    if len(hier.levels) < 2:
        raise ValueError("one level has no iterations: use solve_schedule")
    if which not in KINDS:
        raise ValueError(f"which={which!r}: choose one of {KINDS}")
    cyc = _cycle_key(opts, linear)
    return _sized(_iteration_ops(hier, cyc, which, cost), nbytes)


def mirrored(schedule: Schedule) -> Schedule:
    """An adjoint schedule (mirrored rank m = size−1−r) in physical rank numbers."""
    top = len(schedule) - 1

    def flip(op: Op) -> Op:
        return type(op)(top - op.peer, op.nbytes, op.level) if isinstance(op, (Send, Recv)) \
            else op
    return [[flip(op) for op in ops] for ops in reversed(schedule)]


def total_steps(schedule: Schedule, cost: str | None = None) -> int:
    """States advanced over all ranks (of one cost kind, or all)."""
    return sum(op.count for ops in schedule for op in ops
               if isinstance(op, Step) and (cost is None or op.cost == cost))


def clear_cache() -> None:
    """Forget the recorded solves (they are kept per hierarchy and options): for a
    solver changed while this process runs, e.g. by a test."""
    for cached in (_solve_ops, _iteration_ops, _record):
        cached.cache_clear()


def _sized(schedule: tuple, nbytes: int) -> Schedule:
    """Fresh lists of the (immutable, shared) ops, messages of nbytes: callers extend them."""
    return [[type(op)(op.peer, nbytes, op.level) if isinstance(op, (Send, Recv)) else op
             for op in ops] for ops in schedule]


def _cycle_key(opts, linear: bool) -> tuple:
    """The solver's CycleOptions for opts (MGRITOptions or CycleOptions), as a cache key."""
    cyc = replace(opts, linear=linear) if isinstance(opts, CycleOptions) \
        else opts.cycle_options(linear)
    return astuple(cyc)


# -- schedules from recorded solves ------------------------------------------------------------
@lru_cache(maxsize=256)
def _solve_ops(hier, cyc: tuple, iterations: int, cold: bool, converged: bool,
               cost: str) -> tuple:
    """solve_schedule's ops, messages of 0 bytes (cyc: CycleOptions fields)."""
    if len(hier.levels) == 1:               # serial stepping: solve() ignores the rest
        return _ops_of(_record(hier, cyc, False, 1, None)[0], cost)
    skip = cold and CycleOptions(*cyc).skip_first_down
    if not converged:
        return _ops_of(_expect(hier, cyc, not cold, iterations, None, iterations, False), cost)
    if iterations == 0 and skip:
        raise ValueError("with skip_first_down a solve does at least one cycle")
    # the first cycle of a cold start with skip_first_down opens with no check
    events = _expect(hier, cyc, not cold, iterations + 1, iterations - skip, iterations, True)
    return _ops_of(events, cost)


@lru_cache(maxsize=256)
def _iteration_ops(hier, cyc: tuple, which: str, cost: str) -> tuple:
    """iteration_schedule's ops, from fixed solves of one and two cycles.

    No message or sum marks where an iteration ends (after the F-relaxation that
    closes it), but a fixed solve of k cycles is its first k iterations and then the
    residual norm of its states (`_closing`): iteration k is what a solve of k + 1
    cycles does beyond one of k, both less that closing residual.
    """
    if which == COLD:                       # whatever opts say: the cold kind skips down
        cyc = astuple(replace(CycleOptions(*cyc), skip_first_down=True))
    warm = which != COLD
    one = _expect(hier, cyc, warm, 1, None, 1, False)
    closing = _closing(hier, cyc, warm, one)
    if which != FRESH:
        return _ops_of(tuple(ev[:len(ev) - len(c)] for ev, c in zip(one, closing)), cost)
    two = _expect(hier, cyc, warm, 2, None, 2, False)
    fresh = []
    for r, (a, b, c) in enumerate(zip(one, two, closing)):
        start = len(a) - len(c)
        if b[:start] != a[:start] or b[len(b) - len(c):] != c:
            raise RecordingError(f"rank {r}: a solve of 2 cycles does not begin as one of "
                                 f"1 cycle and end with the same residual")
        fresh.append(b[start:len(b) - len(c)])
    return _ops_of(tuple(fresh), cost)


def _closing(hier, cyc: tuple, warm: bool, solved: tuple) -> tuple:
    """Each rank's events of the residual norm a fixed solve ends with.

    That is the sum alone where the last F-relaxation took the residual's C-steps
    (`MGRIT.closing_residual_taken`), else the residual of a solve of no cycles.
    This is the one thing the solver says rather than its record shows; `solved`
    must end with it.
    """
    solver = MGRIT(hier, _RecordingExchange(0, hier.size, _Log(), None), CycleOptions(*cyc))
    if solver.closing_residual_taken():
        closing = tuple(((_SUM,),) * hier.size)
    else:
        closing = _expect(hier, cyc, warm, 0, None, 0, False)
    for r, (ev, end) in enumerate(zip(solved, closing)):
        if ev[len(ev) - len(end):] != end:
            raise RecordingError(f"rank {r}: a fixed solve ends with {ev[-3:]}, not with "
                                 f"the residual norm of its states ({end[-3:]})")
    return closing


def _ops_of(events: tuple, cost: str) -> tuple:
    """Each rank's events as ops: steps merged (`append`), messages of 0 bytes (see _sized)."""
    out = []
    for rank_events in events:
        ops: list = []
        for kind, a, b in rank_events:
            if kind == "step":
                append(ops, Step(cost, a, 1, b))
            elif kind == "send":
                ops.append(Send(a, 0, b))
            elif kind == "recv":
                ops.append(Recv(a, 0, b))
            else:
                ops.append(Allreduce())
        out.append(tuple(ops))
    return tuple(out)


# -- the recorder ------------------------------------------------------------------------------
_SUM = ("sum", 0, 0)   # events: (kind, states or peer, level)


def _expect(hier, cyc: tuple, warm: bool, max_iter: int, stop_at, iterations: int,
            converged: bool) -> tuple:
    """_record's events, after checking the solve did `iterations` cycles as asked."""
    events, result = _record(hier, cyc, warm, max_iter, stop_at)
    if (result.iterations, result.converged) != (iterations, converged):
        raise RecordingError(f"asked for {iterations} cycles (converged={converged}), the "
                             f"solver did {result.iterations} (converged={result.converged})")
    return events


@lru_cache(maxsize=64)
def _record(hier: Hierarchy, cyc: tuple, warm: bool, max_iter: int, stop_at: int | None):
    """(every rank's events, rank 0's SolveResult) of one solve on `hier`.

    stop_at: the residual-norm sum (counted from 0) that reports convergence;
    None: a fixed-iteration solve (tol = 0), which runs all max_iter cycles.
    """
    options, events, result = CycleOptions(*cyc), [], None
    template = torch.zeros(1, dtype=torch.float64)
    for r in range(hier.size):
        log = _Log()
        exchange = _RecordingExchange(r, hier.size, log, stop_at)
        solver = MGRIT(hier, exchange, options)
        exchange.ops = solver.ops           # whose `level` says what a message belongs to
        lo, hi = hier.ranges[0][r]
        states = torch.zeros(hi - lo, 1, dtype=torch.float64) if warm else None
        got = solver.solve(_CountingPropagator(log, solver.ops), template, template if lo == 0 else None,
                           states, max_iter=max_iter, tol=0.0 if stop_at is None else 0.5)
        events.append(tuple(log))
        result = got if r == 0 else result
    return tuple(events), result


class _Log(list):
    """A rank's events; equal events are stored once (a schedule repeats them a lot,
    and there are few: kinds × peers or states per call × levels)."""

    _shared: dict = {}

    def add(self, event: tuple):
        self.append(self._shared.setdefault(event, event))


class _RecordingExchange:
    """The solver's exchange for rank `rank` of `size`, logging instead of sending.

    Receives give zeros; the k-th residual-norm sum gives 1 before `stop_at`,
    0 from it on (with tol = 0.5: not converged, converged).  A message belongs
    to the level the solver's level operations (`ops`) name as in progress.
    """

    def __init__(self, rank: int, size: int, log: _Log, stop_at: int | None):
        self.rank, self.size, self.log, self.stop_at = rank, size, log, stop_at
        self.sums, self.ops = 0, None

    def send(self, tensor, dest):
        self.log.add(("send", dest, self.ops.level))

    def recv(self, template, source):
        self.log.add(("recv", source, self.ops.level))
        return torch.zeros_like(template)

    def wait(self):
        pass

    def allreduce_sums(self, values) -> list[float]:
        """The residual norm's sum is scripted; the others (round-off scale) are 0."""
        self.log.add(_SUM)
        self.sums += 1
        res = 0.0 if self.stop_at is not None and self.sums > self.stop_at else 1.0
        return [res] + [0.0] * (len(values) - 1)


class _CountingPropagator:
    """Φ(u) = 0 (+ the rhs `plus`) for any step: logs how many states each call advances,
    on the level the solver's level operations (`ops`) name as in progress."""

    def __init__(self, log: _Log, ops):
        self.log, self.ops = log, ops

    def step(self, u, start, stop, out=None, plus=None, save=False):
        self.log.add(("step", 1, self.ops.level))
        return _zero_plus(u, out, plus)

    def step_many(self, U, starts, stops, out=None, plus=None, save=False):
        self.log.add(("step", len(starts), self.ops.level))
        return _zero_plus(U, out, plus)


def _zero_plus(u, out, plus):
    if out is None:
        return torch.zeros_like(u) if plus is None else plus.clone()
    return out.zero_() if plus is None else out.copy_(plus)
