"""Nonlinear MGRIT (FAS, V- and F-cycles) over any time stepper, on one or many ranks.

The solver sees only a propagator (`protocols.Propagator`: `step(u, start,
stop)` and `step_many(U, starts, stops)`, fine-grid indices of the step's two
ends; U stacks m states), a Hierarchy, an exchange for the few messages it
sends (`protocols.Exchange`) and, if given, an observer of its steps, messages
and sums (`protocols.Observer`).  This module is the iteration and the cycle
(docs/method.md §3); what each step of the cycle does to a level is a
level-operations object: `LevelOps` (levels.py, the reference) or
`FusedLevelOps` (fused.py, the default: the same iterates with fewer passes).
"""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

import torch

from lptrain.errors import SolverError
from lptrain.mgrit.fused import FusedLevelOps
from lptrain.mgrit.hierarchy import Hierarchy
from lptrain.mgrit.indexing import (fits_rows, gather, index_of, layout_order, new_rows,
                                    same_view, scatter, zeros_rows)
from lptrain.mgrit.levels import LevelOps, LevelState

# A level-0 residual below ROUNDOFF·eps·‖u_C‖ (eps of the states' dtype, u_C this solve's
# C-point states) is round-off: a solve stops there whatever its tolerance. Where that
# bound is coarse (ROUNDOFF·eps above COARSE: bfloat16, float16) it stops there only once
# an iteration no longer halves the residual (STALLED): stopping at the bound had ended
# bfloat16 solves after one iteration, 8x less accurate than a plain bfloat16 sweep.
ROUNDOFF = 10.0
COARSE = 1e-4
STALLED = 0.5


def fixed_solve(tol: float, rtol: float) -> bool:
    """Whether a solve to `tol` / `rtol` has no tolerance: it runs all its max_iter
    cycles, so its last sweep is known before it runs."""
    return tol <= 0 and rtol <= 0


def reached(history: list[float], tol: float, rtol: float, floor: float,
            coarse: bool = False) -> bool:
    """Whether a solve whose residual norms so far are `history` has converged: below
    the tolerances, or below the round-off bound `floor` (a `coarse` one: and no longer
    falling fast)."""
    norm = history[-1]
    if norm <= max(tol, rtol * history[0]):
        return True
    stalled = len(history) >= 2 and norm > STALLED * history[-2]
    return norm <= floor and (stalled or not coarse)


@dataclass
class SolveResult:
    """Level-0 states owned by this rank, shape (hi-lo, *state_shape), and convergence."""

    states: torch.Tensor
    history: list[float]   # residual norm at the start of each iteration
    iterations: int        # cycles performed
    converged: bool
    state_norm: float = 0.0  # ‖u_C‖ over all ranks when the last residual was measured

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
    level_ops: str = "fused"   # a key of LEVEL_OPS
    # False (mgrit.warm_down): a warm solve's first cycle restricts on the coarse levels
    # without relaxing them first; sound (tests/unit/test_warm_down.py), cheaper, and less
    # accurate per iteration (BENCHMARKS.md "The one-shot step at the method's cost").
    warm_down: bool = True


# the solver's choices, by their config names (MGRITOptions validates mgrit.cycle and
# mgrit.level_ops against them once)
CYCLES = ("V", "F")
LEVEL_OPS = {"fused": FusedLevelOps, "plain": LevelOps}


class MGRIT:
    """An MGRIT solver bound to one hierarchy and one rank of it."""

    def __init__(self, hierarchy: Hierarchy, exchange, options: CycleOptions, observer=None):
        self.hierarchy, self.exchange, self.options = hierarchy, exchange, options
        self.observer = observer
        rank = exchange.rank
        self.levels = []
        for l, level in enumerate(hierarchy.levels):
            lo, hi = hierarchy.ranges[l][rank]
            cs = level.cpoints[bisect_left(level.cpoints, lo):bisect_left(level.cpoints, hi)]
            self.levels.append(LevelState(l, lo, hi, hierarchy.left(l, rank),
                                          hierarchy.right(l, rank), cs=tuple(cs)))
        self.ops = LEVEL_OPS[options.level_ops](hierarchy, exchange, options, self.levels,
                                                observer)
        self.timers = self.ops.timers      # seconds by (level, operation)
        self._buffers: list[torch.Tensor] = []
        self._cycled = False   # the last solve ended with its last cycle's F-relaxation
        self._u0 = None        # the running solve's u_0 (on the rank owning point 0)

    # -- public ----------------------------------------------------------------
    def solve(self, prop, template: torch.Tensor, u0: torch.Tensor | None = None,
              warm: torch.Tensor | None = None, max_iter: int = 1, tol: float = 0.0,
              rtol: float = 0.0, reuse_warm: bool = False) -> SolveResult:
        """Iterate until the level-0 residual norm <= max(tol, rtol·first) or max_iter.

        template: a tensor of the state's shape, dtype and device (every rank);
        u0: the initial state, needed on the rank owning point 0;
        warm: this rank's states from an earlier solve (else cold start): all its
        level-0 rows, or only its C-point rows (`c_rows`), told apart by the first
        dimension; only the C-points are read (its F-points belong to another θ).
        The result lives in a buffer of the solver's (reused by later solves unless
        `take` lends it out), never in `warm`, so a warm start stays valid until
        the next solve; except with reuse_warm (the caller replaces its warm start
        after this solve), where a warm start that is the C-point rows of one of the
        solver's free buffers (`c_point_rows`) is solved in that buffer, its
        C-points taken where they lie.  `warm` itself is never written.
        """
        top = self.levels[0]
        if warm is not None and warm.shape[0] not in (top.hi - top.lo, len(top.cs)):
            raise SolverError(f"warm start with {warm.shape[0]} rows: this rank's block has "
                              f"{top.hi - top.lo} rows, {len(top.cs)} of them C-points")
        work = self._work_buffer(template, warm, reuse_warm)
        self.ops.begin(prop, template, work)
        self._cycled = False
        if warm is None and len(self.levels) > 1:      # a cold start: C-points from zero
            scatter(work, [c - top.lo for c in top.cs], torch.zeros_like(work[:1]))
        self._u0 = None
        if top.lo == 0 and work.shape[0] > 0:     # point 0 is the first C-point
            work[0] = self._u0 = u0
        if len(self.levels) == 1:
            self.ops.coarse_solve(top, last=True)     # serial stepping: its states returned
            return SolveResult(work, [0.0], 1, True)
        return self._iterate(warm, max_iter, tol, rtol)

    @property
    def c_rows(self) -> tuple[int, ...]:
        """Rows of this rank's level-0 block that are C-points: the rows a warm start
        needs (a compact warm start holds these rows, in this order)."""
        top = self.levels[0]
        return tuple(c - top.lo for c in top.cs)

    def c_point_states(self, states: torch.Tensor, out: torch.Tensor | None = None
                       ) -> torch.Tensor:
        """A compact copy of the C-point rows of this rank's level-0 `states`, each row laid
        out as theirs (so that a warm start is copied back without a conversion); written
        into `out` where it has that form (a block of the caller's to reuse)."""
        if not self.c_rows:
            return states[:0].clone()
        n = len(self.c_rows)
        buf = out if fits_rows(out, states[0], n) else new_rows(states[0], n)
        return buf.copy_(gather(states, list(self.c_rows)))

    def c_point_rows(self, states: torch.Tensor) -> torch.Tensor:
        """The C-point rows of this rank's level-0 `states` as a view where they are evenly
        spaced (else `c_point_states`' copy): a warm start kept where it lies, for a
        caller that solves next with reuse_warm and keeps `states` from other writes
        meanwhile (a buffer of this solver's: only solves write there)."""
        idx = index_of(list(self.c_rows)) if self.c_rows else None
        if not isinstance(idx, slice):
            return self.c_point_states(states)
        return states[idx]

    def resume(self, max_iter: int, tol: float = 0.0, rtol: float = 0.0) -> SolveResult:
        """More iterations on the result of the last solve, in place, same propagator."""
        top = self.levels[0]
        if len(self.levels) == 1:
            return SolveResult(top.X, [0.0], 0, True)
        return self._iterate(None, max_iter, tol, rtol, resumed=True)

    # -- the iteration ---------------------------------------------------------------
    def _iterate(self, warm, max_iter, tol, rtol, resumed=False) -> SolveResult:
        """Relax, measure the residual, restrict; the cycle; correct; F-relax.

        A cold start with skip_first_down opens with the coarse propagation of
        u_0.  A warm start relaxes before its first residual: its F-points
        belong to the states it came from (another θ).  Later iterations skip
        the first F-relaxation, their F-points being fresh: the F-relaxation
        closing an iteration restricts at once (`f_relax_restrict`), the next
        iteration measures what it found.  Without warm_down the warm first
        cycle restricts on the coarse levels without relaxing them first (the
        exact solution stays a fixed point: its coarse residuals are zero).
        Level-0 operations say whether their sweep may be the solve's last
        (`last`): with a tolerance every sweep may, without one only the last
        iteration's closing F-relaxation and the residual of the returned states.
        """
        ops, top, opt, history = self.ops, self.levels[0], self.options, []
        fixed = fixed_solve(tol, rtol)
        final = not fixed
        # a resumed solve's first restriction follows the last solve's cycle
        cycled = resumed and self._cycled
        after_cycle = cycled and opt.nrelax0 == 0
        self._cycled = False
        sq = None                  # Σ r² of the restriction the closing sweep took
        for k in range(max_iter):
            if k == 0 and opt.skip_first_down and warm is None and not resumed:
                self._cold_cycle(1)
            else:
                if sq is None:
                    if k == 0 and warm is not None:
                        self._take_c_points(warm)
                    self._relax(top, opt.nrelax0, skip_first_f=k > 0 or resumed, last=final)
                    sq = ops.restrict(top, final, after_cycle)
                norm, floor = self._measure(sq, fixed)
                history.append(norm)
                # a fixed solve runs all its iterations even at an exact zero: its
                # last sweep leaves the activations (and adjoint weight products)
                if not math.isfinite(norm) or not fixed and \
                        reached(history, tol, rtol, floor, self._coarse()):
                    return SolveResult(top.X, history, k, math.isfinite(norm),
                                       self._state_norm)
                self._cycle(1, opt.cycle, down=opt.warm_down or k > 0 or warm is None)
            ops.correct(top)
            if k == max_iter - 1:
                break
            if opt.nrelax0 > 0:      # C-relaxations come before the next restriction
                ops.f_relax(top, final)
                sq, after_cycle = None, False
            else:
                sq = ops.f_relax_restrict(top, final, after_cycle=True)
        if max_iter < 1:
            res_sq = ops.residual(top, True)
        elif opt.nrelax0 > 0:
            ops.f_relax(top, True)
            res_sq = ops.residual(top, True)
        else:
            res_sq = ops.f_relax_residual(top, True)
        self._cycled = max_iter >= 1 or cycled
        norm, floor = self._measure(res_sq, fixed, states=True)   # returned states
        history.append(norm)
        return SolveResult(top.X, history, max_iter,
                           norm <= max(tol, rtol * history[0], floor), self._state_norm)

    def _cycle(self, l: int, kind: str, down: bool = True) -> None:
        """One V- or F-cycle on level l ≥ 1 (its problem set by the restriction);
        without `down` no relaxation before the restrictions."""
        lv, coarsest = self.levels[l], len(self.levels) - 1
        if l == coarsest:
            self.ops.coarse_solve(lv)
            return
        if down:
            self._relax_restrict(lv, self.options.nrelax)
        else:
            self.ops.restrict(lv)
        self._cycle(l + 1, kind, down)
        if kind == "F" and l + 1 < coarsest:
            self._cycle(l + 1, "V")
        self.ops.correct(lv)
        self.ops.f_relax(lv)

    def _cold_cycle(self, l: int) -> None:
        """The first cycle of a cold start: inject down to the coarsest level,
        solve there, correct and F-relax on the way up (no residual)."""
        lv = self.levels[l]
        self.ops.inject(self.levels[l - 1])
        if l == len(self.levels) - 1:
            self.ops.coarse_solve(lv)
            return
        self._cold_cycle(l + 1)
        self.ops.correct(lv)
        self.ops.f_relax(lv)

    def _relax(self, lv: LevelState, nrelax: int, skip_first_f: bool = False,
               last: bool = False) -> None:
        """F(CF)^nrelax, without the first F if skip_first_f."""
        if not skip_first_f:
            self.ops.f_relax(lv, last)
        for _ in range(nrelax):
            self.ops.c_relax(lv, last)
            self.ops.f_relax(lv, last)

    def _relax_restrict(self, lv: LevelState, nrelax: int) -> None:
        """F(CF)^nrelax, the last F-relaxation with the restriction of its states."""
        for _ in range(nrelax):
            self.ops.f_relax(lv)
            self.ops.c_relax(lv)
        self.ops.f_relax_restrict(lv)

    # -- helpers -------------------------------------------------------------------
    def _measure(self, local_sq: float, fixed: bool, states: bool = False
                 ) -> tuple[float, float]:
        """The level-0 residual norm from this rank's Σ r², and its round-off floor
        (ROUNDOFF); one allreduce for both.  Fixed solves ignore the floor (0).
        The C-point norm ‖u_C‖ goes into `state_norm` (the error estimate of
        docs/method.md §6) where a solve can end: every measurement of a solve to
        a tolerance, the closing one of a fixed solve (`states`)."""
        top = self.levels[0]
        state_sq = _c_point_sq_norm(top, self.ops) if states or not fixed else 0.0
        res_sq, state_sq = self.exchange.allreduce_sums((local_sq, state_sq))
        if self.observer is not None:
            self.observer.sum(0, 2)
        self._state_norm = math.sqrt(state_sq)
        eps = torch.finfo(top.X.dtype).eps
        return math.sqrt(res_sq), 0.0 if fixed else ROUNDOFF * eps * self._state_norm

    def _coarse(self) -> bool:
        """Whether the states' round-off bound is coarse (COARSE)."""
        return ROUNDOFF * torch.finfo(self.levels[0].X.dtype).eps > COARSE

    def _take_c_points(self, warm: torch.Tensor) -> None:
        """A warm start's C-points into the work buffer (its F-points come next); a
        compact warm start (only the C-point rows) is taken whole, and where it is the
        work buffer's own C-point rows (`reuse_warm`) it is there already.  Point 0
        keeps this solve's u_0."""
        top = self.levels[0]
        idx = list(self.c_rows)
        if not idx:
            return
        compact = warm.shape[0] == len(idx)     # (a block of C-points only is both)
        if compact and same_view(gather(top.X, idx), warm):
            return                              # (u_0 written there by solve)
        scatter(top.X, idx, warm if compact else gather(warm, idx))
        if self._u0 is not None:
            top.X[0] = self._u0

    def _work_buffer(self, template: torch.Tensor, warm, reuse_warm: bool = False
                     ) -> torch.Tensor:
        """A level-0 buffer of this solver's (with reuse_warm the one whose C-point rows
        `warm` is, else the first that `warm` does not lie in; a new one if none is
        free), each row laid out in memory as `template` is.  No row of it is read
        before the solve writes it (but the C-points of a warm start lying there)."""
        rows = self.levels[0].hi - self.levels[0].lo
        shape, order = (rows, *template.shape), layout_order(template)
        self._buffers = bufs = [b for b in self._buffers if b.shape == shape and
                                b.dtype == template.dtype and b.device == template.device
                                and layout_order(b[0]) == order]
        if reuse_warm and warm is not None and self.c_rows and \
                warm.shape[0] == len(self.c_rows):
            for buf in bufs:
                if same_view(gather(buf, list(self.c_rows)), warm):
                    return buf
        for buf in bufs:
            if warm is None or buf.numel() == 0 or \
                    warm.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr():
                return buf
        bufs.append(zeros_rows(template, rows))
        return bufs[-1]

    def take(self, states: torch.Tensor) -> torch.Tensor:
        """The last solve's `states` for the caller to keep (no copy): later solves write
        into other buffers until `release` gives this one back."""
        self._buffers = [b for b in self._buffers if b is not states]
        return states

    def release(self, states: torch.Tensor) -> None:
        """A buffer `take` handed out, free for later solves again (two are kept)."""
        if len(self._buffers) < 2 and all(b is not states for b in self._buffers):
            self._buffers.append(states)


def _c_point_sq_norm(lv: LevelState, ops) -> float:
    """Σ ‖u_c‖² over this rank's C-points of a level: one reduction per state, no copy
    (a reduction over the whole strided view of C-points runs a slower kernel) but
    where a state is not contiguous (channels_last: `ops.in_order`)."""
    if not lv.cs:
        return 0.0
    rows = ops.in_order(lv.X[index_of([c - lv.lo for c in lv.cs])], rows=True)
    rows = rows.reshape(rows.shape[0], -1)         # a 0-d state: one value a row
    return float(torch.linalg.vector_norm(rows, dim=1).square().sum())
