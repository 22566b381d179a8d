"""Nonlinear MGRIT (FAS, V- and F-cycles) over any time stepper, on one or many ranks.

The solver sees only a propagator with `step(u, start, stop)` and
`step_many(U, starts, stops)` (fine-grid indices of the step's two ends;
U stacks m states), a Hierarchy, and an exchange object for the few
messages it sends.  Level equations: u_0 = g_0, u_i = Φ(u_{i-1}) + g_i;
g is zero on the finest level.
"""
from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections import defaultdict
from dataclasses import dataclass

import torch

from lptrain.mgrit.hierarchy import Hierarchy
from lptrain.mgrit.indexing import arithmetic_runs, destination, gather, index_of, scatter
from lptrain.mgrit.restriction import LevelState, Restriction


@dataclass
class SolveResult:
    """Level-0 states owned by this rank, shape (hi-lo, *state_shape), and convergence."""

    states: torch.Tensor
    history: list[float]   # residual norm at the start of each iteration
    iterations: int        # cycles performed
    converged: bool

    @property
    def residual(self) -> float:
        return self.history[-1] if self.history else 0.0


@dataclass
class CycleOptions:
    """What the solver itself needs of MGRITOptions."""

    nrelax0: int = 0
    nrelax: int = 1
    cycle: str = "V"
    skip_first_down: bool = True
    linear: bool = False   # Φ linear in u: coarse levels solve for corrections (no Φ^Δ(v))
    stack: bool = True     # advance all intervals of a rank with one operation per step
    chunk: int = 8        # ... in groups of this many intervals (temporaries in cache)
    reuse_rhs: bool = True  # later FAS restrictions update the coarse rhs (_restrict_again)
    share_coarse: bool = True  # FAS coarse states are views of the finer C-points (_bind)
    fuse_residual: bool = True  # F-relaxations take the next residual's C-steps (_f_relax)


class MGRIT(Restriction):
    """An MGRIT solver bound to one hierarchy and one rank of it."""

    def __init__(self, hierarchy: Hierarchy, exchange, options: CycleOptions):
        self.h, self.ex, self.opt = hierarchy, exchange, options
        rank = exchange.rank
        self.levels = []
        for l, lv in enumerate(hierarchy.levels):
            lo, hi = hierarchy.ranges[l][rank]
            cs = lv.cpoints[bisect_left(lv.cpoints, lo):bisect_left(lv.cpoints, hi)]
            self.levels.append(LevelState(l, lo, hi, hierarchy.left(l, rank),
                                          hierarchy.right(l, rank), cs=tuple(cs)))
        self.timers: dict[tuple[int, str], float] = defaultdict(float)
        self.prop = None
        self._saving = True      # finest-level steps save activations (see _iterate)
        self._rhs_reusable = False

    # -- public ----------------------------------------------------------------
    def solve(self, prop, template: torch.Tensor, u0: torch.Tensor | None = None,
              warm: torch.Tensor | None = None, max_iter: int = 1, tol: float = 0.0,
              rtol: float = 0.0) -> SolveResult:
        """Iterate until the level-0 residual norm <= max(tol, rtol·first) or max_iter.

        template: a tensor of the state's shape, dtype and device (every rank);
        u0: the initial state, needed on the rank owning point 0;
        warm: this rank's level-0 states from an earlier solve (else cold start).
        The result lives in one of two buffers the solver alternates between,
        never in `warm`, so a warm start stays valid until the next solve.
        """
        self.prop = prop
        self._rhs_reusable = False         # see _restrict_again
        self._allocate(template)
        top = self.levels[0]
        work = self._buffers[1] if warm is not None and \
            warm.data_ptr() == self._buffers[0].data_ptr() else self._buffers[0]
        top.X = work
        self._bind()
        if warm is None and len(self.levels) > 1:
            scatter(work, [c - top.lo for c in top.cs], torch.zeros_like(work[:1]))
        if top.lo == 0:
            for buf in (work, warm):
                if buf is not None:
                    buf[0] = u0
        if len(self.levels) == 1:
            self._timed(0, "coarse", self._serial_solve, top)
            return SolveResult(work, [0.0], 1, True)
        return self._iterate(work, warm, max_iter, tol, rtol)

    def resume(self, max_iter: int, tol: float = 0.0, rtol: float = 0.0) -> SolveResult:
        """More iterations on the result of the last solve, in place, same propagator."""
        top = self.levels[0]
        if len(self.levels) == 1:
            return SolveResult(top.X, [0.0], 0, True)
        return self._iterate(top.X, None, max_iter, tol, rtol, fresh=True)

    def _iterate(self, work, warm, max_iter, tol, rtol, fresh=False) -> SolveResult:
        top, history = self.levels[0], []
        # skip_first_down applies to a cold start only: there the first cycle is the
        # coarse propagation of u_0.  A warm start's F-points belong to the states it
        # came from (another θ); an unrelaxed residual on them would carry their error
        # into the coarse correction, so a warm solve relaxes first.
        skip = self.opt.skip_first_down and not fresh and warm is None
        # Finest-level steps leave activations for the adjoint (prop.step save=True).
        # Without a tolerance the last sweep is known in advance: only its steps and
        # the closing residual's need to; with one, any iteration may be the last.
        fixed = tol <= 0 and rtol <= 0
        taken = None      # what the last F-relaxation fed to the residual after it
        for k in range(max_iter):
            self._saving = not fixed
            if k == 0 and skip:                       # cold: coarse propagation of u_0
                self._cycle(1, "V", skip=True)
                self._rhs_reusable = self._may_reuse_rhs()
            else:
                if k == 0 and warm is not None:
                    self._copy_c_points(warm, work)
                    self._relax(top, self.opt.nrelax0)
                else:
                    self._relax(top, self.opt.nrelax0, skip_first_f=fresh)
                norm = self._norm(self._restrict(top, taken))
                history.append(norm)
                # a fixed solve runs all its iterations even at an exact zero: its
                # last sweep leaves the activations (and adjoint weight products)
                stop = not fixed and norm <= max(tol, rtol * history[0])
                if stop or not math.isfinite(norm):
                    return SolveResult(work, history, k, math.isfinite(norm))
                self._cycle(1, self.opt.cycle)
                self._rhs_reusable = self._may_reuse_rhs()
            self._correct(top)
            self._saving = not fixed or k == max_iter - 1
            taken = self._timed(0, "relax", self._f_relax, top,
                                self._next_sink(top, last=k == max_iter - 1))
            fresh = True
        self._saving = True
        norm = self._norm(self._residual(top, taken=taken))   # of the returned states
        history.append(norm)
        return SolveResult(work, history, max_iter, norm <= max(tol, rtol * history[0]))

    def _next_sink(self, top: LevelState, last: bool):
        """The residual that follows the finest F-relaxation closing a cycle: the
        next restriction's, or after the last cycle the returned states'."""
        if self.opt.nrelax0 > 0 or not self.opt.fuse_residual:   # (a C-relaxation first)
            return None
        return self._residual_sink(top) if last else self._restriction_sink(top)

    def _may_reuse_rhs(self) -> bool:
        """After a full cycle: the finest C-points are untouched until the next restriction."""
        return self.opt.reuse_rhs and self.opt.nrelax0 == 0 and not self.opt.linear

    def _norm(self, local_sq: float) -> float:
        return math.sqrt(self.ex.allreduce_sum(local_sq))

    def _copy_c_points(self, src, dst):
        top = self.levels[0]
        idx = [c - top.lo for c in top.cs]
        scatter(dst, idx, gather(src, idx))

    # -- cycles ------------------------------------------------------------------
    def _cycle(self, l: int, kind: str, skip: bool = False):
        """One cycle on level l ≥ 1; skip: the first cycle of a cold start, which
        injects the finer level's states and relaxes only on the way up."""
        lv = self.levels[l]
        if skip:
            self._inject(self.levels[l - 1])
        if l == len(self.levels) - 1:
            self._timed(l, "coarse", self._serial_solve, lv)
            return
        if skip:
            self._cycle(l + 1, kind, skip=True)
        else:
            sink = self._restriction_sink(lv) if self.opt.fuse_residual else None
            taken = self._relax(lv, self.opt.nrelax, sink=sink)
            self._restrict(lv, taken)
            self._cycle(l + 1, kind)
            if kind == "F" and l + 1 < len(self.levels) - 1:
                self._cycle(l + 1, "V")
        self._correct(lv)
        self._timed(l, "relax", self._f_relax, lv)

    def _relax(self, lv: LevelState, nrelax: int, skip_first_f: bool = False, sink=None):
        """F(CF)^nrelax, without the first F if skip_first_f.

        sink: fed by the last sweep if that is an F-relaxation (see _f_relax);
        returns what it took, None if it took nothing.
        """
        sweeps = ([] if skip_first_f else ["F"]) + ["C", "F"] * nrelax
        taken = None
        for i, kind in enumerate(sweeps):
            if kind == "C":
                self._timed(lv.index, "relax", self._c_relax, lv)
            else:
                last = i == len(sweeps) - 1
                taken = self._timed(lv.index, "relax", self._f_relax, lv, sink if last else None)
        return taken

    # -- level operations --------------------------------------------------------
    def _f_relax(self, lv: LevelState, sink=None) -> float | None:
        """u_i = Φ(u_{i-1}) + g_i at every F-point, interval by interval.

        sink: a consumer of the C-steps that come next (a residual or
        restriction, see `_c_steps`): each chunk's C-steps are taken right after
        its F-points, while their inputs are in cache; returns what it summed.
        """
        if lv.empty:
            return 0.0 if sink else None
        level = self.h.levels[lv.index]
        n = level.n_points
        own = [c for c in lv.cs if c < n - 1]
        ends = [min(_next_c(level, c), lv.hi) for c in own]
        lengths = [e - c - 1 for c, e in zip(own, ends)]
        k, taken, spent = max(self.opt.chunk, 1), 0.0, 0.0
        for first in range(0, len(own), k):        # a chunk through all its F-points
            cs, ls = own[first:first + k], lengths[first:first + k]
            for sub in range(max(ls, default=0)):
                self._advance(lv, [c + sub for c, L in zip(cs, ls) if L > sub])
            if sink:
                t0 = time.perf_counter()
                src = [e - 1 for e in ends[first:first + k] if e < lv.hi]
                for part in arithmetic_runs(src):
                    taken += sink[1](*self._c_chunk(lv, part, sink[0]))
                spent += time.perf_counter() - t0
        send = lv.right is not None and not level.is_c(lv.hi)
        if send and own:
            self.ex.send(lv.X[-1], lv.right)
        if lv.lo > 0 and not level.is_c(lv.lo):
            x = self._recv(lv)
            stop = lv.cs[0] if lv.cs else lv.hi   # first C-point ends the interval
            for i in range(lv.lo, stop):
                x = self._phi(lv, i - 1, x, out=lv.X[i - lv.lo])
            if send and not own:
                self.ex.send(lv.X[-1], lv.right)
        if not sink:
            self.ex.wait()
            return None
        t0 = time.perf_counter()
        if lv.lo > 0 and not level.is_c(lv.lo) and lv.cs:   # the interval begun on the left
            taken += sink[1](*self._c_chunk(lv, [lv.cs[0] - 1], sink[0]))
        self.ex.wait()
        taken += sum(sink[1](*step) for step in self._c_steps(lv, sink[0], local=False))
        spent += time.perf_counter() - t0
        self.timers[(lv.index, "residual")] += spent   # not relaxation (see _timed)
        self.timers[(lv.index, "relax")] -= spent
        return taken

    def _c_relax(self, lv: LevelState):
        """u_i = Φ(u_{i-1}) + g_i at every C-point but the first, written in place."""
        for _, phi, put in self._c_steps(lv, lambda pos: (lv.X, [p - lv.lo for p in pos])):
            put(phi)

    def _c_steps(self, lv: LevelState, dest=None, local: bool = True):
        """Yield (C-points, Φ(u_{c-1}) + g_c, put) for this rank's C-points c > 0.

        A chunk of `opt.chunk` C-points at a time, so the temporaries stay in
        cache; `dest(C-points)` → (tensor, positions) says where the values
        belong: they are computed there directly where possible, and the
        consumer calls put(values) when done with them.  Chunks go from the last
        C-point back, so that writing into the states reads only old values
        (the last point may be a C-point right after another).  Consumers must
        exhaust the generator (it ends the exchange).  local=False: only the
        C-point whose F-point lies on the left neighbour (the F-relaxation took
        the others, see _f_relax).
        """
        if lv.empty:
            return
        level = self.h.levels[lv.index]
        if lv.right is not None and level.is_c(lv.hi):
            self.ex.send(lv.X[-1], lv.right)
        targets = [c for c in lv.cs if c > 0]
        remote = bool(targets) and targets[0] == lv.lo
        k = max(self.opt.chunk, 1)
        chunks = [run[first:first + k] for run in arithmetic_runs([c - 1 for c in targets[remote:]])
                  for first in range(0, len(run), k)] if local else []
        for part in reversed(chunks):
            yield self._c_chunk(lv, part, dest)
        if remote:
            x = self._recv(lv)
            out, put = destination(dest, [lv.lo])
            one = self._phi(lv, lv.lo - 1, x, out=None if out is None else out[0])
            yield [lv.lo], one.unsqueeze(0), put
        self.ex.wait()

    def _c_chunk(self, lv: LevelState, part: list[int], dest):
        """(C-points, Φ + g, put) of the C-steps from the local points `part`."""
        pos = [p + 1 for p in part]
        out, put = destination(dest, pos, clash=not set(part).isdisjoint(pos))
        return pos, self._phi_many(lv, part, out=out), put

    def _serial_solve(self, lv: LevelState):
        """Sequential stepping through the level, pipelined across ranks."""
        if lv.empty:
            return
        x = self._recv(lv) if lv.lo > 0 else lv.X[0]
        for i in range(max(lv.lo, 1), lv.hi):
            x = self._phi(lv, i - 1, x, out=lv.X[i - lv.lo])
        if lv.right is not None:
            self.ex.send(lv.X[-1], lv.right)
        self.ex.wait()

    # -- helpers -------------------------------------------------------------------
    def _can_share(self, l: int) -> bool:
        """Whether level l's states can live in level l−1's C-points (see _bind)."""
        fine, coarse = self.levels[l - 1], self.levels[l]
        return self.opt.share_coarse and not self.opt.linear and not coarse.empty and \
            isinstance(index_of([c - fine.lo for c in fine.cs]), slice)

    def _bind(self):
        """Point the coarse levels' states at the finer C-points of the work buffer.

        With FAS and injection the coarse level starts from the fine C-point
        values and the correction writes its solution back there, so one copy
        of those states serves both levels: injection and correction copy
        nothing, and the coarse buffers are not allocated.  (A linear coarse
        level holds corrections instead, and keeps its own buffer.)
        """
        for l in range(1, len(self.levels)):
            if self._shared[l]:
                fine = self.levels[l - 1]
                self.levels[l].X = gather(fine.X, [c - fine.lo for c in fine.cs])

    def _allocate(self, template: torch.Tensor):
        shape0 = (self.levels[0].hi - self.levels[0].lo, *template.shape)
        bufs = getattr(self, "_buffers", None)
        if bufs is not None and bufs[0].shape == shape0 and bufs[0].dtype == template.dtype \
                and bufs[0].device == template.device:
            return
        self._buffers = [template.new_zeros(shape0), template.new_zeros(shape0)]
        self._shared = [False] + [self._can_share(l) for l in range(1, len(self.levels))]
        for l, lv in enumerate(self.levels[1:], start=1):
            shape = (lv.hi - lv.lo, *template.shape)
            lv.X = None if self._shared[l] else template.new_zeros(shape)
            lv.G = template.new_zeros(shape)
        self._template = template

    def _recv(self, lv: LevelState) -> torch.Tensor:
        return self.ex.recv(self._template, lv.left)

    def _step(self, lv: LevelState, i: int, x: torch.Tensor, out=None, plus=None):
        pts = self.h.levels[lv.index].points
        return self.prop.step(x, pts[i], pts[i + 1], out=out, plus=plus,
                              save=self._saving and lv.index == 0)

    def _steps(self, lv: LevelState, src: list[int], out=None, plus=None) -> torch.Tensor:
        pts = self.h.levels[lv.index].points
        U = gather(lv.X, [i - lv.lo for i in src])
        return self.prop.step_many(U, [pts[i] for i in src], [pts[i + 1] for i in src],
                                   out=out, plus=plus, save=self._saving and lv.index == 0)

    def _phi(self, lv: LevelState, i: int, x: torch.Tensor, out=None) -> torch.Tensor:
        """Φ(x) + g_{i+1} for the step from point i (the rhs added by the step)."""
        return self._step(lv, i, x, out, None if lv.G is None else lv.G[i + 1 - lv.lo])

    def _phi_many(self, lv: LevelState, src: list[int], out=None) -> torch.Tensor:
        g = None if lv.G is None else gather(lv.G, [i + 1 - lv.lo for i in src])
        return self._steps(lv, src, out, g)

    def _advance(self, lv: LevelState, src: list[int]):
        """Φ + g from each point in src into the next point, written in place."""
        runs = arithmetic_runs(src) if self.opt.stack else [[i] for i in src]
        for run in runs:
            idx = index_of([i + 1 - lv.lo for i in run])
            if isinstance(idx, slice):
                self._phi_many(lv, run, out=lv.X[idx])
            else:
                lv.X[idx] = self._phi_many(lv, run)

    def _timed(self, level: int, kind: str, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        self.timers[(level, kind)] += time.perf_counter() - t0
        return out


def _next_c(level, c: int) -> int:
    k = bisect_left(level.cpoints, c + 1)
    return level.cpoints[k]
