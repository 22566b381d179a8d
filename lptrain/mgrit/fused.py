"""The level operations of `levels.LevelOps` with fewer passes and copies.

The same iterates as the reference (to rounding; tests compare them), by
six devices, each behind a `Fusions` switch (all on in every run; tests and
bench/ turn one off to compare the device with its plain version):

- stack: the intervals of a rank advance together, one propagator call per
  step index for up to CHUNK intervals (temporaries stay in cache; the
  sweeps themselves are stacked.py's);
- fuse_residual: an F-relaxation followed by a residual (`f_relax_restrict`,
  `f_relax_residual`) takes that residual's C-steps right after each chunk of
  F-points, while their inputs are in cache;
- share_coarse: FAS coarse states are views of the finer level's C-points,
  so injection and correction copy nothing;
- reuse_rhs: a finest-level restriction right after a full cycle
  (`after_cycle`) updates the coarse right-hand side, g_j += r_j, instead of
  rebuilding it (`_rhs_update`), which needs Φ^Δ only at the coarse C-points;
- skip_zero: a linear coarse level starts from a zero correction, and
  Φ(0) = 0 there, so its first F-relaxation takes u = g at the F-points right
  after its C-points instead of a step;
- reuse_phi: a full FAS restriction computes Φ^Δ(v_c) at every coarse point,
  and the coarse level's next F-relaxation starts with the same steps from the
  same C-points, so their values are kept (N/c² states on level 1) and the first
  F-points take Φ^Δ(v_c) + g_{c+1} without a step (cleared by anything that
  moves those C-points first: a C-relaxation, a correction);
- residual_rows: residuals that are not kept go into one contiguous buffer of the
  solver's, reused by every residual, instead of a new tensor each: no allocation,
  and rows in another memory format (channels_last) are summed where they lie,
  without the copy into logical order that flattening them took (`sq_norm`; the
  same values in the same order, so the same sums).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from lptrain.mgrit.indexing import gather, index_of, same_view, scatter
from lptrain.mgrit.levels import LevelState, sq_norm, timed
from lptrain.mgrit.stacked import CSteps, StackedSweeps


@dataclass(frozen=True)
class Fusions:
    """Which devices the fused operations use (see module); no configuration option
    reaches them.  Runs use them all (the default); a switch off is the plain version
    of that one device, which the tests compare with (tests/unit/test_mgrit_fusions.py,
    test_step_count.py) and bench/mgrit_cost.py times against."""

    stack: bool = True          # one propagator call per step index for many intervals
    reuse_rhs: bool = True      # later FAS restrictions update the coarse rhs
    share_coarse: bool = True   # FAS coarse states are views of the finer C-points
    fuse_residual: bool = True  # F-relaxations take the next residual's C-steps
    skip_zero: bool = True      # no steps from a linear coarse level's zero C-points
    reuse_phi: bool = True      # FAS: the first F-steps reuse the restriction's Φ^Δ
    residual_rows: bool = True  # residuals not kept go into one reused contiguous buffer


class FusedLevelOps(StackedSweeps):
    """`LevelOps` with stacked steps, fused residuals, shared coarse states and rhs reuse."""

    def __init__(self, hierarchy, exchange, options, levels, observer=None):
        super().__init__(hierarchy, exchange, options, levels, observer)
        self.fusions = Fusions()   # set before the first solve to compare one device off
        self.shared: list[bool] = []
        # level → {F-point j: Φ^Δ(v_{j−1})} a restriction kept for the level's next
        # F-relaxation (`reuse_phi`)
        self.kept: dict[int, dict[int, torch.Tensor]] = {}
        self._residuals: torch.Tensor | None = None    # `residual_rows`' buffer

    # -- set-up ----------------------------------------------------------------------
    def begin(self, prop, template, work):
        super().begin(prop, template, work)
        self.kept.clear()
        for l in range(1, len(self.levels)):
            if self.shared[l]:
                fine = self.levels[l - 1]
                self.levels[l].X = gather(fine.X, [c - fine.lo for c in fine.cs])

    def _coarse_views(self) -> list[bool]:
        self.shared = [False] + [self.can_share(l) for l in range(1, len(self.levels))]
        return self.shared

    def can_share(self, l: int) -> bool:
        """Whether level l's states can be a view of level l−1's C-points: FAS (a linear
        coarse level holds corrections) and evenly spaced C-points."""
        fine, coarse = self.levels[l - 1], self.levels[l]
        return self.fusions.share_coarse and not self.options.linear and not coarse.empty \
            and isinstance(index_of([c - fine.lo for c in fine.cs]), slice)

    # -- relaxation ------------------------------------------------------------------
    @timed("relax")
    def f_relax(self, lv: LevelState, last: bool = False) -> None:
        self._f_relax(lv, None, last)

    def f_relax_residual(self, lv: LevelState, last: bool = False) -> float:
        """F-relaxation and the residual of its states, in one pass (`fuse_residual`)."""
        if not self.fusions.fuse_residual:
            return super().f_relax_residual(lv, last)
        return self._f_relax_taking(lv, self._residual_norm(lv), last)

    def f_relax_restrict(self, lv: LevelState, last: bool = False,
                         after_cycle: bool = False) -> float:
        """F-relaxation and the restriction of its states; the residual's C-steps
        in the same pass (`fuse_residual`)."""
        if not self.fusions.fuse_residual:
            return super().f_relax_restrict(lv, last, after_cycle)
        update = self._updates_rhs(lv, after_cycle)
        sq = self._f_relax_taking(lv, self._restriction_residual(lv, update), last)
        self._transfer(lv, update)
        return sq

    def _f_relax_taking(self, lv: LevelState, consumer: CSteps, last: bool) -> float:
        """`_f_relax` with a consumer; its seconds split into relaxation and residual."""
        t0 = time.perf_counter()
        taken, spent = self._f_relax(lv, consumer, last)
        self.timers[(lv.index, "relax")] += time.perf_counter() - t0 - spent
        self.timers[(lv.index, "residual")] += spent
        return taken

    @timed("relax")
    def c_relax(self, lv: LevelState, last: bool = False) -> None:
        """u_c = Φ(u_{c−1}) + g_c at every C-point but the first, written in place."""
        lv.zero = False
        self.kept.pop(lv.index, None)

        def take(pos, phi, put):
            put(phi)
            return 0.0
        self._c_steps_fused(lv, CSteps(lambda pos: (lv.X, [p - lv.lo for p in pos]), take),
                            last)

    def coarse_solve(self, lv: LevelState, last: bool = False) -> None:
        lv.zero = False
        self.kept.pop(lv.index, None)
        super().coarse_solve(lv, last)

    # -- residual and transfers --------------------------------------------------------
    @timed("residual")
    def residual(self, lv: LevelState, last: bool = False) -> float:
        return self._c_steps_fused(lv, self._residual_norm(lv), last)

    def restrict(self, lv: LevelState, last: bool = False,
                 after_cycle: bool = False) -> float:
        update = self._updates_rhs(lv, after_cycle)
        sq = self._residual_of_restriction(lv, update, last)
        self._transfer(lv, update)
        return sq

    @timed("residual")
    def _residual_of_restriction(self, lv: LevelState, update: bool, last: bool) -> float:
        return self._c_steps_fused(lv, self._restriction_residual(lv, update), last)

    @timed("restrict")
    def _transfer(self, lv: LevelState, update: bool) -> None:
        if update:
            self._rhs_update(lv)
        else:
            self._inject(lv, keep_rhs=True)

    @timed("restrict")
    def inject(self, lv: LevelState) -> None:
        self._inject(lv, keep_rhs=False)

    @timed("correct")
    def correct(self, lv: LevelState) -> None:
        lv.zero = False
        self.kept.pop(lv.index, None)
        coarse = self.levels[lv.index + 1]
        if coarse.empty:
            return
        idx = [c - lv.lo for c in lv.cs]
        if coarse.correction:
            lv.X[index_of(idx)] += coarse.X
        elif not same_view(gather(lv.X, idx), coarse.X):
            scatter(lv.X, idx, coarse.X)

    def _updates_rhs(self, lv: LevelState, after_cycle: bool) -> bool:
        """Whether a restriction from lv updates level 1's rhs (`reuse_rhs`)."""
        return lv.index == 0 and after_cycle and self.fusions.reuse_rhs and \
            not self.options.linear

    def _residual_norm(self, lv: LevelState, to_rhs: bool = False) -> CSteps:
        """The C-steps' consumer of a residual: take → their Σ‖r_c‖².

        to_rhs: the next level's rhs receives r_c (linear) or Φ(u_{c−1}) + g_c
        (FAS, completed by _inject).
        """
        dest = None
        if to_rhs:
            coarse, level = self.levels[lv.index + 1], self._level(lv)
            dest = (lambda pos: (coarse.G, [level.count_c_below(p) - coarse.lo
                                            for p in pos]))
        in_place = to_rhs and self.options.linear

        def take(pos, phi, put):
            r = phi.sub_(_at(lv, pos)) if in_place else self._sub(phi, _at(lv, pos))
            put(phi)           # FAS keeps Φ + g, a linear rhs r
            return sq_norm(self.in_order(r))
        return CSteps(dest, take)

    def _sub(self, phi: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """phi − u, a residual the caller drops after use: into `residual_rows`' buffer
        (contiguous, valid until the next residual), else a new tensor."""
        if not self.fusions.residual_rows or phi.requires_grad or u.requires_grad:
            return torch.sub(phi, u)         # (out= takes no part in autograd)
        return torch.sub(phi, u, out=self._rows_buffer(phi))

    def in_order(self, t: torch.Tensor, rows: bool = False) -> torch.Tensor:
        """t itself where flattening it (all dims; with rows, each row) is a view, else its
        values in logical order in `residual_rows`' buffer (valid until the next
        residual): the copy flattening would make, without a new tensor each time."""
        if not self.fusions.residual_rows or t.requires_grad or \
                (t[0] if rows and t.shape[0] > 0 else t).is_contiguous():
            return t
        return self._rows_buffer(t).copy_(t)

    def _rows_buffer(self, like: torch.Tensor) -> torch.Tensor:
        """`residual_rows`' buffer as like's shape, contiguous (grown where too small)."""
        buf, k = self._residuals, like.shape[0]
        if buf is None or buf.shape[0] < k or buf.shape[1:] != like.shape[1:] or \
                buf.dtype != like.dtype or buf.device != like.device:
            buf = self._residuals = like.new_empty(like.shape)     # contiguous
        return buf[:k]

    def _restriction_residual(self, lv: LevelState, update: bool) -> CSteps:
        """The C-step consumer of a restriction from lv (update: `_rhs_update_residual`)."""
        if update:
            return self._rhs_update_residual(lv)
        return self._residual_norm(lv, to_rhs=True)

    def _inject(self, lv: LevelState, keep_rhs: bool) -> None:
        """v = u at the C-points; coarse rhs g_j = Φ(u_{c−1}) + g_c − Φ^Δ(v_{j−1})
        (the first term already in place), or without keep_rhs the fine rhs."""
        coarse = self.levels[lv.index + 1]
        self.kept.pop(coarse.index, None)
        if coarse.empty:
            return
        local = [c - lv.lo for c in lv.cs]
        coarse.correction = keep_rhs and self.options.linear
        if coarse.correction:              # linear: e = 0, rhs = r, e_0 = 0
            coarse.X.zero_()
            coarse.zero = True
            if coarse.lo == 0:
                coarse.G[0] = 0.0
            return
        source = gather(lv.X, local)
        if not same_view(source, coarse.X):       # else coarse.X is those states
            coarse.X.copy_(source)
        if not keep_rhs:
            if lv.G is None:
                coarse.G.zero_()
            else:
                coarse.G.copy_(gather(lv.G, local))
            return
        if coarse.lo == 0:
            coarse.G[0] = coarse.X[0]
        self._coarse_phis(coarse, self._subtract_from_rhs(coarse, self._keeper(coarse)))

    def _rhs_update_residual(self, lv: LevelState) -> CSteps:
        """The residual's consumer when level 1 still holds its last solution.

        Its F-relaxation (or the coarsest solve) left v_j = Φ^Δ(v_{j−1}) + g_j and
        the fine C-points are v, so the new rhs Φ(u_{c−1}) − Φ^Δ(v_{j−1}) is
        g_j + r_j there; only level 1's own C-points need Φ^Δ (`_rhs_update`).
        """
        coarse, level, cpts = self.levels[1], self._level(lv), self._level1_cpoints()

        def take(pos, phi, put):
            js = [level.count_c_below(p) for p in pos]
            idx = index_of([j - coarse.lo for j in js])
            g = coarse.G[idx]                       # a view, or a copy put back below
            r = self._sub(phi, _at(lv, pos))
            g += r
            if not isinstance(idx, slice):
                coarse.G[idx] = g
            for i, j in enumerate(js):
                if j in cpts:                       # g_j = Φ(u_{c−1}) − Φ^Δ(v_{j−1})
                    coarse.G[j - coarse.lo].copy_(phi[i])
            return sq_norm(r)
        return CSteps(None, take)

    def _rhs_update(self, lv: LevelState) -> None:
        """After `_rhs_update_residual`: Φ^Δ at level 1's C-points."""
        coarse, cpts = self.levels[1], self._level1_cpoints()
        self.kept.pop(1, None)
        todo = [j for j in range(max(coarse.lo, 1), coarse.hi) if j in cpts]
        self._coarse_phis(coarse, self._subtract_from_rhs(coarse), todo)

    @staticmethod
    def _subtract_from_rhs(coarse: LevelState, keep=None):
        """use(points, Φ^Δ) of `_coarse_phis`: g_j −= Φ^Δ(v_{j−1}) (and keep(points, Φ^Δ))."""
        def use(pos, phi):
            coarse.G[index_of([p - coarse.lo for p in pos])] -= phi
            if keep is not None:
                keep(pos, phi)
        return use

    def _keeper(self, coarse: LevelState):
        """keep(points, Φ^Δ) of a full restriction to `coarse`: the values at the F-points
        right after its own C-points, for its next F-relaxation (`reuse_phi`; none on
        the coarsest level, which is solved by stepping)."""
        self.kept.pop(coarse.index, None)
        if not self.fusions.reuse_phi or coarse.index == len(self.levels) - 1:
            return None
        after = {c + 1 for c in coarse.cs}
        store = self.kept[coarse.index] = {}

        def keep(pos, phi):
            for i, j in enumerate(pos):
                if j in after:
                    store[j] = phi[i].clone()
        return keep

    def _level1_cpoints(self) -> set[int]:
        """Level 1's C-points (none when it is the coarsest level)."""
        return set(self.hierarchy.levels[1].cpoints) if len(self.levels) > 2 else set()


def _at(lv: LevelState, pos: list[int]) -> torch.Tensor:
    """The states of lv at its points pos (a view where they are evenly spaced)."""
    return gather(lv.X, [p - lv.lo for p in pos])

