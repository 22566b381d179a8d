"""Which steps, messages and allreduces one MGRIT solve performs on every rank: pure.

The generator below walks the same recursion as `lptrain.mgrit.solver.MGRIT`
(`_iterate`, `_cycle`, `_relax`, `_f_relax`, `_c_steps`, `_serial_solve`; the
transfers `_restrict`, `_restrict_again`, `_coarse_phis` in restriction.py) and
records, per rank and in program order,
what the solver does there: a `Step` for every batch of states a rank
advances, a `Send`/`Recv` for every neighbour state, an `Allreduce` for the
residual norm.  Nothing is computed; a schedule is a list of op lists,
`schedule[rank]`.  Ranks are the solver's own numbering (for the adjoint,
the mirrored one: see `mirrored`).
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, replace
from typing import Union

from lptrain.mgrit.hierarchy import Hierarchy, build_hierarchy, build_levels
from lptrain.mgrit.indexing import arithmetic_runs
from lptrain.mgrit.solver import CycleOptions

# which measured cost a step is charged (see simulate.StepCosts)
FORWARD = "forward"        # u ← u + H σ(K u + b)
ADJOINT = "adjoint"        # λ ← λ + H Kᵀ[σ′ ⊙ λ] with σ′ stored
DERIVATIVE = "derivative"  # σ′ of a layer from the activations its forward step saved
LINEARIZE = "linearize"    # σ′(K u + b) of a layer recomputed from its input state
WEIGHTS = "weights"        # weight-gradient product of a layer
COSTS = (FORWARD, ADJOINT, DERIVATIVE, LINEARIZE, WEIGHTS)

# which iteration of `_iterate` (see iteration_schedule)
COLD, FIRST, FRESH = "cold", "first", "fresh"
KINDS = (COLD, FIRST, FRESH)

CHUNK = max(CycleOptions().chunk, 1)   # intervals the solver stacks per call


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
            ops[-1] = replace(last, count=last.count + op.count, calls=last.calls + op.calls)
            return
    ops.append(op)


def count_runs(positions: list[int]) -> int:
    """Kernel calls the solver needs for these sorted positions: one per arithmetic run."""
    runs, first, last, stride = 0, None, None, None
    for p in positions:
        if first is not None and (stride is None or p - last == stride):
            stride, last = p - last, p
        else:
            runs, first, last, stride = runs + 1, p, p, None
    return runs


class _Builder:
    """Records the solver's operations for every rank of one hierarchy.

    Each method loops over the ranks and appends what that rank does in the
    solver method of the same name; since every rank runs the same program,
    appending method by method keeps each rank's program order.
    """

    def __init__(self, hier: Hierarchy, opts, nbytes: int, cost: str, linear: bool):
        self.h, self.opts, self.nbytes, self.cost = hier, opts, nbytes, cost
        self.linear = linear
        self.ops: Schedule = [[] for _ in range(hier.size)]

    # -- helpers -------------------------------------------------------------------
    def _owned(self, l: int):
        """(rank, lo, hi, C-points in [lo, hi)) for each rank with points on level l."""
        cps = self.h.levels[l].cpoints
        for r, (lo, hi) in enumerate(self.h.ranges[l]):
            if hi > lo:
                yield r, lo, hi, cps[bisect_left(cps, lo):bisect_left(cps, hi)]

    def _step(self, r: int, l: int, count: int, calls: int = 1):
        append(self.ops[r], Step(self.cost, count, calls, l))

    def _send(self, r: int, l: int, dest: int):
        self.ops[r].append(Send(dest, self.nbytes, l))

    def _recv(self, r: int, l: int):
        self.ops[r].append(Recv(self.h.left(l, r), self.nbytes, l))

    # -- level operations (solver.py names) ---------------------------------------------
    def f_relax(self, l: int, fused: bool = False):
        """fused: the F-relaxation feeds the residual after it (solver `_f_relax` with
        a sink): each chunk's C-steps follow its F-points, the one into the first
        C-point of a range begun on the left follows that interval, and the C-step
        that needs the left neighbour's state comes last (`c_steps(local=False)`)."""
        level = self.h.levels[l]
        for r, lo, hi, cs in self._owned(l):
            own = [c for c in cs if c < level.n_points - 1]
            ends = [min(_next_c(level.cpoints, c), hi) for c in own]
            lengths = [e - c - 1 for c, e in zip(own, ends)]
            for s in range(max(lengths, default=0)):   # calls: per chunk of intervals
                active = [[c + s for c, n in zip(own[i:i + CHUNK], lengths[i:i + CHUNK])
                           if n > s] for i in range(0, len(own), CHUNK)]
                self._step(r, l, sum(map(len, active)), sum(map(count_runs, active)))
            if fused:
                src = [[e - 1 for e in ends[i:i + CHUNK] if e < hi]
                       for i in range(0, len(own), CHUNK)]
                self._step(r, l, sum(map(len, src)), sum(map(count_runs, src)))
            right = self.h.right(l, r)
            send = right is not None and not level.is_c(hi)
            if send and own:
                self._send(r, l, right)
            if lo > 0 and not level.is_c(lo):
                self._recv(r, l)
                stop = cs[0] if cs else hi
                self._step(r, l, stop - lo, stop - lo)
                if send and not own:
                    self._send(r, l, right)
                if fused and cs:
                    self._step(r, l, 1)
        if fused:
            self.c_steps(l, local=False)

    def c_steps(self, l: int, local: bool = True):
        level = self.h.levels[l]
        for r, lo, hi, cs in self._owned(l):
            right = self.h.right(l, r)
            if right is not None and level.is_c(hi):
                self._send(r, l, right)
            targets = [c for c in cs if c > 0]
            remote = bool(targets) and targets[0] == lo
            chunks = [run[i:i + CHUNK] for run in arithmetic_runs([c - 1 for c in targets[remote:]])
                      for i in range(0, len(run), CHUNK)]
            if local:
                self._step(r, l, len(targets) - remote, len(chunks))
            if remote:                     # the solver does the received one last
                self._recv(r, l)
                self._step(r, l, 1)

    def coarse_phis(self, l: int, only_c: bool = False):
        """Φ^Δ(v) on coarse level l for the FAS rhs (`_inject`, or at its C-points only:
        `_restrict_again`)."""
        cps = set(self.h.levels[l].cpoints)
        for r, lo, hi, _ in self._owned(l):
            right = self.h.right(l, r)
            if right is not None:
                self._send(r, l, right)
            targets = [i for i in range(max(lo, 1), hi) if not only_c or i in cps]
            if lo > 0:
                self._recv(r, l)
            if targets and targets[0] == lo:
                self._step(r, l, 1)
                targets = targets[1:]
            chunks = [run[i:i + CHUNK] for run in arithmetic_runs([t - 1 for t in targets])
                      for i in range(0, len(run), CHUNK)]
            self._step(r, l, len(targets), len(chunks))

    def serial_solve(self, l: int):
        for r, lo, hi, _ in self._owned(l):
            if lo > 0:
                self._recv(r, l)
            self._step(r, l, hi - max(lo, 1), hi - max(lo, 1))
            right = self.h.right(l, r)
            if right is not None:
                self._send(r, l, right)

    def allreduce(self):
        for ops in self.ops:
            ops.append(Allreduce())

    # -- cycles ----------------------------------------------------------------------
    def relax(self, l: int, nrelax: int, skip_first_f: bool = False, fused: bool = False):
        """fused: the last sweep, if an F-relaxation, feeds the residual after it."""
        sweeps = ([] if skip_first_f else ["F"]) + ["C", "F"] * nrelax
        for i, kind in enumerate(sweeps):
            if kind == "C":
                self.c_steps(l)
            else:
                self.f_relax(l, fused=fused and i == len(sweeps) - 1)

    def restrict(self, l: int, again: bool = False, taken: bool = False):
        """Residual parked on level l+1, then Φ^Δ(v) for the FAS rhs (none if linear;
        again: at the coarse C-points only, the coarse level holding its last solution);
        taken: the F-relaxation before took its C-steps."""
        if not taken:
            self.c_steps(l)
        if not self.linear:
            self.coarse_phis(l + 1, only_c=again)

    def cycle(self, l: int, kind: str, skip: bool = False):
        last = len(self.h.levels) - 1
        if l == last:
            self.serial_solve(l)
            return
        if skip:
            self.cycle(l + 1, kind, skip=True)
        else:
            self.relax(l, self.opts.nrelax, fused=True)
            self.restrict(l, taken=True)
            self.cycle(l + 1, kind)
            if kind == "F" and l + 1 < last:
                self.cycle(l + 1, "V")
        self.f_relax(l)

    def check(self, which: str):
        """Level-0 relaxation, restriction and the residual norm opening an iteration."""
        self.relax(0, self.opts.nrelax0, skip_first_f=which == FRESH)
        fresh = which == FRESH and self.opts.nrelax0 == 0     # fed by the last F-relaxation
        self.restrict(0, again=fresh, taken=fresh)
        self.allreduce()

    def iteration(self, which: str):
        if which == COLD:
            self.cycle(1, "V", skip=True)
        else:
            self.check(which)
            self.cycle(1, self.opts.cycle)
        self.f_relax(0, fused=self.opts.nrelax0 == 0)   # feeds the next residual

    def solve(self, iterations: int, cold: bool, converged: bool):
        if len(self.h.levels) == 1:
            self.serial_solve(0)
            return
        skip = self.opts.skip_first_down and cold      # (warm solves relax first)
        first = COLD if skip else FIRST
        for k in range(iterations):
            self.iteration(first if k == 0 else FRESH)
        if not converged:              # the residual of the returned states
            if self.opts.nrelax0 > 0:  # (else the last F-relaxation took it)
                self.c_steps(0)
            self.allreduce()
        elif iterations == 0 and skip:
            raise ValueError("with skip_first_down a solve does at least one cycle")
        else:                          # the check that met the tolerance
            self.check(first if iterations == 0 else FRESH)


def _next_c(cpoints: tuple[int, ...], c: int) -> int:
    return cpoints[bisect_left(cpoints, c + 1)]


def iteration_schedule(hier: Hierarchy, opts, which: str = FRESH, nbytes: int = 0,
                       cost: str = FORWARD, linear: bool = False) -> Schedule:
    """One iteration of `_iterate` (at least two levels), with nrelax0 = 0 counted
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
    b = _Builder(hier, opts, nbytes, cost, linear)
    b.iteration(which)
    return b.ops


def solve_schedule(hier: Hierarchy, opts, iterations: int, cold: bool = False,
                   converged: bool = False, nbytes: int = 0, cost: str = FORWARD,
                   linear: bool = False) -> Schedule:
    """A whole `MGRIT.solve` that performs `iterations` cycles.

    converged: the solve stopped at the tolerance check that opens cycle
    `iterations` (fewer cycles than max_iter; mode=mgrit).  Otherwise it ran
    all its cycles and ends with the residual norm of the returned states
    (mode=simultaneous).  One level is serial stepping, whatever the rest.
    """
    b = _Builder(hier, opts, nbytes, cost, linear)
    b.solve(iterations, cold, converged)
    return b.ops


def mirrored(schedule: Schedule) -> Schedule:
    """An adjoint schedule (mirrored rank m = size−1−r) in physical rank numbers."""
    top = len(schedule) - 1

    def flip(op: Op) -> Op:
        return replace(op, peer=top - op.peer) if isinstance(op, (Send, Recv)) else op
    return [[flip(op) for op in ops] for ops in reversed(schedule)]


def total_steps(schedule: Schedule, cost: str | None = None) -> int:
    """States advanced over all ranks (of one cost kind, or all)."""
    return sum(op.count for ops in schedule for op in ops
               if isinstance(op, Step) and (cost is None or op.cost == cost))
