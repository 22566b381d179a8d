"""The FAS transfers between MGRIT levels: residual, restriction, injection, correction.

A mixin of `MGRIT` (solver.py), which provides the levels, the propagator
steps (`_step`, `_steps`, `_c_steps`) and the exchange.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from lptrain.mgrit.indexing import arithmetic_runs, gather, index_of, same_view, scatter


@dataclass
class LevelState:
    """One level as this rank holds it: its point range, neighbours and buffers."""

    index: int
    lo: int
    hi: int
    left: int | None
    right: int | None
    X: torch.Tensor | None = None   # states at this rank's points
    G: torch.Tensor | None = None   # FAS right-hand side (None: zero, level 0)
    cs: tuple[int, ...] = field(default=())  # this rank's C-points
    correction: bool = False        # X holds a correction (linear coarse level)

    @property
    def empty(self) -> bool:
        return self.hi <= self.lo


class Restriction:
    """Level-to-level operations of the FAS cycle (see MGRIT)."""

    def _residual(self, lv: LevelState, park: bool = False, taken: float | None = None) -> float:
        """Σ‖r_c‖² over this rank's C-points, r_c = Φ(u_{c-1}) + g_c − u_c.

        With park, the next level's rhs receives r_c (linear) or Φ(u_{c-1}) + g_c
        (FAS, completed by _inject).  taken: the sum, when an F-relaxation
        already fed its C-steps to this residual's sink (see _f_relax).
        """
        return self._take(lv, self._residual_sink(lv, park)) if taken is None else taken

    def _residual_sink(self, lv: LevelState, park: bool = False):
        """(dest, take) for `_c_steps`: take(C-points, Φ + g, put) → their Σ‖r_c‖²."""
        dest = None
        if park:
            coarse, level = self.levels[lv.index + 1], self.h.levels[lv.index]
            dest = (lambda pos: (coarse.G, [level.count_c_below(p) - coarse.lo
                                            for p in pos]))
        linear = park and self.opt.linear

        def take(pos, phi, put):
            # r in place for a linear level's rhs, else only the norm: FAS keeps Φ + g
            sq = _residual_sq(phi, _at(lv, pos), "in_place" if linear else "norm")
            put(phi)
            return sq
        return dest, take

    def _take(self, lv: LevelState, sink) -> float:
        t0 = time.perf_counter()
        sq = sum(sink[1](*step) for step in self._c_steps(lv, sink[0]))
        self.timers[(lv.index, "residual")] += time.perf_counter() - t0
        return sq

    def _restriction_sink(self, lv: LevelState):
        """The sink of the C-steps of the next FAS restriction from lv (see _restrict)."""
        if lv.index == 0 and self._rhs_reusable:
            return self._again_sink(lv)
        return self._residual_sink(lv, park=True)

    def _restrict(self, lv: LevelState, taken: float | None = None) -> float:
        """FAS restriction to the next level; returns this rank's Σ‖r_c‖².

        taken: its C-steps were fed to `_restriction_sink(lv)` already (by the
        F-relaxation just before, see _f_relax), this is what they summed.
        """
        again = lv.index == 0 and self._rhs_reusable
        sq = self._take(lv, self._restriction_sink(lv)) if taken is None else taken
        t0 = time.perf_counter()
        if again:
            self._restrict_again(lv)
        else:
            self._inject(lv, keep_rhs=True)
        self.timers[(lv.index, "restrict")] += time.perf_counter() - t0
        return sq

    def _inject(self, lv: LevelState, keep_rhs: bool = False):
        """v = u at the C-points; coarse rhs g_j = v_j + r_j − Φ^Δ(v_{j−1}).

        Without keep_rhs (first cold down-cycle) r is replaced by the fine rhs.
        """
        coarse = self.levels[lv.index + 1]
        if coarse.empty:
            return
        local = [c - lv.lo for c in lv.cs]
        coarse.correction = keep_rhs and self.opt.linear
        if coarse.correction:              # linear: e = 0, rhs = r (parked), e_0 = 0
            coarse.X.zero_()
            if coarse.lo == 0:
                coarse.G[0] = 0.0
            return
        source = gather(lv.X, local)
        if not same_view(source, coarse.X):       # else coarse.X is those states (_bind)
            coarse.X.copy_(source)
        if not keep_rhs:
            if lv.G is None:
                coarse.G.zero_()
            else:
                coarse.G.copy_(gather(lv.G, local))
            return
        # g_j = Φ(u_{c−1}) + g_c − Φ^Δ(v_{j−1}) (the first term parked), g_0 = v_0
        if coarse.lo == 0:
            coarse.G[0] = coarse.X[0]
        for pos, phi in self._coarse_phis(coarse):
            idx = index_of([p - coarse.lo for p in pos])
            coarse.G[idx] -= phi

    def _again_sink(self, lv: LevelState):
        """The residual's sink when the coarse level still holds its last solution.

        That is the case after a full cycle with F-relaxation only on this level:
        the C-points are the coarse values v, and the coarse F-relaxation (or the
        coarsest solve) left v_j = Φ^Δ(v_{j−1}) + g_j, so the new rhs
        Φ(u_{c−1}) − Φ^Δ(v_{j−1}) is g_j + r_j there.  Only the coarse C-points
        need Φ^Δ (_restrict_again): 1/c of the coarse steps of a fresh
        restriction, and no injection.
        """
        coarse, level, cpts = self.levels[1], self.h.levels[0], self._level1_cpoints()

        def take(pos, phi, put):
            js = [level.count_c_below(p) for p in pos]
            idx = index_of([j - coarse.lo for j in js])
            g = coarse.G[idx]                       # a view, or a copy put back below
            sq = _residual_sq(phi, _at(lv, pos), "add_to", g)
            if not isinstance(idx, slice):
                coarse.G[idx] = g
            for i, j in enumerate(js):
                if j in cpts:                       # g_j = Φ(u_{c−1}) − Φ^Δ(v_{j−1})
                    coarse.G[j - coarse.lo].copy_(phi[i])
            return sq
        return None, take

    def _restrict_again(self, lv: LevelState):
        """After `_again_sink` took the residual: Φ^Δ at the coarse C-points."""
        coarse, cpts = self.levels[1], self._level1_cpoints()
        redo = [j for j in range(max(coarse.lo, 1), coarse.hi) if j in cpts]
        for pos, phi in self._coarse_phis(coarse, redo):
            coarse.G[index_of([p - coarse.lo for p in pos])] -= phi

    def _level1_cpoints(self) -> set[int]:
        """Level 1's C-points (none when it is the coarsest level)."""
        return set(self.h.levels[1].cpoints) if len(self.levels) > 2 else set()

    def _coarse_phis(self, lv: LevelState, targets: list[int] | None = None):
        """Yield (points i, Φ(v_{i−1})) for the points i > 0 of this rank on level lv
        (only those in `targets`, sorted, if given; the messages are the same)."""
        if lv.right is not None:
            self.ex.send(lv.X[-1], lv.right)
        if targets is None:
            targets = list(range(max(lv.lo, 1), lv.hi))
        if targets and targets[0] == lv.lo:
            x = self._recv(lv)
            yield [lv.lo], self._step(lv, lv.lo - 1, x).unsqueeze(0)
            targets = targets[1:]
        elif lv.lo > 0:
            self._recv(lv)
        k = max(self.opt.chunk, 1)
        for run in arithmetic_runs([i - 1 for i in targets]):   # chunks that stay in cache
            for first in range(0, len(run), k):
                src = run[first:first + k]
                yield [p + 1 for p in src], self._steps(lv, src)
        self.ex.wait()

    def _correct(self, lv: LevelState):
        """u_c ← coarse solution (FAS with injection), or u_c += correction (linear)."""
        coarse = self.levels[lv.index + 1]
        if coarse.empty:
            return
        idx = [c - lv.lo for c in lv.cs]
        if coarse.correction:
            lv.X[index_of(idx)] += coarse.X
        elif not same_view(gather(lv.X, idx), coarse.X):
            scatter(lv.X, idx, coarse.X)


def _at(lv: LevelState, pos: list[int]) -> torch.Tensor:
    """The states of lv at its points pos (a view where they are evenly spaced)."""
    return gather(lv.X, [p - lv.lo for p in pos])



def _residual_sq(phi: torch.Tensor, target: torch.Tensor, mode: str = "norm",
                 out: torch.Tensor | None = None) -> float:
    """Σ‖phi − target‖², and by mode: nothing else ("norm"), phi ← phi − target
    ("in_place"), out += phi − target ("add_to")."""
    r = phi.sub_(target) if mode == "in_place" else torch.sub(phi, target)
    if mode == "add_to":
        out += r
    flat = r.reshape(-1)
    return float(torch.dot(flat, flat))
