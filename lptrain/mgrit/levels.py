"""The level operations of the FAS cycle, written as docs/method.md §3 states them.

`LevelOps` is the reference: each level keeps its own buffers, each step is
one propagator call, each operation its own pass over the level.
`FusedLevelOps` (fused.py) computes the same iterates with fewer passes and
copies; the solver (solver.py) runs either, and the tests compare them.
The solver names the pairs of operations it runs back to back
(`f_relax_restrict`, `f_relax_residual`): the reference runs one after the
other, the fused operations in one pass.

`last` (every operation on level 0): its steps belong to a sweep whose states
the solve may return; the propagator decides from it and the level what to
keep (protocols.Propagator).

A level's equations: u_0 = g_0, u_i = Φ(u_{i−1}) + g_i, with g = 0 on the
finest level.  Positions are level indices; a rank holds its points
[lo, hi) of every level and receives the state just before lo from its
left neighbour when an operation needs it.
"""
from __future__ import annotations

import functools
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from lptrain.mgrit.indexing import layout_order, zeros_rows


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
    zero: bool = False              # its C-points hold zeros (a linear level just restricted)

    @property
    def empty(self) -> bool:
        return self.hi <= self.lo


def timed(kind: str):
    """Add the operation's seconds to timers[(level, kind)]."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(self, lv, *args, **kw):
            t0 = time.perf_counter()
            out = fn(self, lv, *args, **kw)
            self.timers[(lv.index, kind)] += time.perf_counter() - t0
            return out
        return run
    return wrap


class LevelOps:
    """Relaxation, residual, restriction, correction and the coarse solve of one level."""

    def __init__(self, hierarchy, exchange, options, levels: list[LevelState],
                 observer=None):
        self.hierarchy, self.exchange, self.options = hierarchy, exchange, options
        self.levels, self.observer = levels, observer
        self.timers: dict[tuple[int, str], float] = defaultdict(float)
        self.prop = None
        self.template = None

    # -- set-up ------------------------------------------------------------------
    def begin(self, prop, template: torch.Tensor, work: torch.Tensor) -> None:
        """A new solve with this propagator; level 0's states live in `work`."""
        self.prop = prop
        self._allocate(template)
        self.levels[0].X = work

    def _allocate(self, template: torch.Tensor) -> None:
        if self.template is not None and self.template.shape == template.shape and \
                self.template.dtype == template.dtype and \
                self.template.device == template.device and \
                layout_order(self.template) == layout_order(template):
            return
        views = self._coarse_views()
        for l, lv in enumerate(self.levels[1:], start=1):     # rows laid out as template
            lv.X = None if views[l] else zeros_rows(template, lv.hi - lv.lo)
            lv.G = zeros_rows(template, lv.hi - lv.lo)
        self.template = template

    def in_order(self, t: torch.Tensor, rows: bool = False) -> torch.Tensor:
        """t for a sum over its flattened values (rows: each row's): here t itself
        (`FusedLevelOps` gives the copy flattening makes a buffer of its own)."""
        return t

    def _coarse_views(self) -> list[bool]:
        """Per level, whether its states are a view set by `begin` (no buffer of its own)."""
        return [False] * len(self.levels)

    # -- relaxation ----------------------------------------------------------------
    @timed("relax")
    def f_relax(self, lv: LevelState, last: bool = False) -> None:
        """u_i = Φ(u_{i−1}) + g_i at every F-point, in order from each C-point.

        An F-range at the start of this rank continues its left neighbour's
        interval: it waits for that neighbour's last state.
        """
        if lv.empty:
            return
        level, x = self._level(lv), None
        for i in range(lv.lo, lv.hi):
            if level.is_c(i):
                x = lv.X[i - lv.lo]
                continue
            if x is None:
                x = self._recv(lv)
            x = self._phi(lv, i, x, out=lv.X[i - lv.lo], last=last)
        if lv.right is not None and not level.is_c(lv.hi):
            self._send(lv)
        self.exchange.wait()

    @timed("relax")
    def c_relax(self, lv: LevelState, last: bool = False) -> None:
        """u_c = Φ(u_{c−1}) + g_c at every C-point c > 0, all from the old states."""
        for c, phi in self._c_steps(lv, last):
            lv.X[c - lv.lo] = phi

    # -- residual and transfers ------------------------------------------------------
    @timed("residual")
    def residual(self, lv: LevelState, last: bool = False) -> float:
        """Σ‖r_c‖² over this rank's C-points c > 0, r_c = Φ(u_{c−1}) + g_c − u_c."""
        return sum(sq_norm(phi - lv.X[c - lv.lo]) for c, phi in self._c_steps(lv, last))

    def f_relax_residual(self, lv: LevelState, last: bool = False) -> float:
        """F-relaxation, then the residual (`residual`) of the states it leaves."""
        self.f_relax(lv, last)
        return self.residual(lv, last)

    def f_relax_restrict(self, lv: LevelState, last: bool = False,
                         after_cycle: bool = False) -> float:
        """F-relaxation, then the restriction (`restrict`) of the states it leaves."""
        self.f_relax(lv, last)
        return self.restrict(lv, last, after_cycle)

    @timed("restrict")
    def restrict(self, lv: LevelState, last: bool = False,
                 after_cycle: bool = False) -> float:
        """The next level's problem from this one's; returns Σ‖r_c‖².

        after_cycle: level 1 holds what a full cycle left and the finer C-points
        are unchanged since (fused.py's rhs reuse; the reference rebuilds).

        FAS: v_j = u_c and g_j = Φ(u_{c−1}) + g_c − Φ^Δ(v_{j−1}), g_0 = v_0.
        Linear (Φ linear in u): the coarse level solves for the correction
        e, e = 0 to start, g_j = r_c, g_0 = 0.
        """
        coarse, level, sq = self.levels[lv.index + 1], self._level(lv), 0.0
        coarse.correction = self.options.linear
        for c, phi in self._c_steps(lv, last):
            r = phi - lv.X[c - lv.lo]
            sq += sq_norm(r)
            coarse.G[level.count_c_below(c) - coarse.lo] = r if coarse.correction else phi
        if coarse.empty:
            return sq
        if coarse.correction:
            coarse.X.zero_()
            if coarse.lo == 0:
                coarse.G[0] = 0.0
            return sq
        self._inject_states(lv)
        if coarse.lo == 0:
            coarse.G[0] = coarse.X[0]
        for j, phi in self._coarse_steps(coarse):
            coarse.G[j - coarse.lo] -= phi
        return sq

    @timed("restrict")
    def inject(self, lv: LevelState) -> None:
        """The first down-cycle of a cold start: v_j = u_c and g_j = g_c."""
        coarse = self.levels[lv.index + 1]
        coarse.correction = False
        if coarse.empty:
            return
        self._inject_states(lv)
        for j, c in enumerate(lv.cs):
            if lv.G is None:
                coarse.G[j].zero_()
            else:
                coarse.G[j] = lv.G[c - lv.lo]

    @timed("correct")
    def correct(self, lv: LevelState) -> None:
        """u_c ← v_j (FAS), or u_c ← u_c + e_j (linear)."""
        coarse = self.levels[lv.index + 1]
        for j, c in enumerate(lv.cs):
            if coarse.correction:
                lv.X[c - lv.lo] += coarse.X[j]
            else:
                lv.X[c - lv.lo] = coarse.X[j]

    @timed("coarse")
    def coarse_solve(self, lv: LevelState, last: bool = False) -> None:
        """Serial stepping through the level, pipelined across the ranks."""
        if lv.empty:
            return
        x = self._recv(lv) if lv.lo > 0 else lv.X[0]
        for i in range(max(lv.lo, 1), lv.hi):
            x = self._phi(lv, i, x, out=lv.X[i - lv.lo], last=last)
        if lv.right is not None:
            self._send(lv)
        self.exchange.wait()

    # -- helpers ---------------------------------------------------------------------
    def _c_steps(self, lv: LevelState, last: bool = False
                 ) -> list[tuple[int, torch.Tensor]]:
        """(c, Φ(u_{c−1}) + g_c) for this rank's C-points c > 0."""
        if lv.empty:
            return []
        if lv.right is not None and self._level(lv).is_c(lv.hi):
            self._send(lv)
        out = []
        for c in lv.cs:
            if c > 0:
                x = self._recv(lv) if c == lv.lo else lv.X[c - 1 - lv.lo]
                out.append((c, self._phi(lv, c, x, last=last)))
        self.exchange.wait()
        return out

    def _coarse_steps(self, coarse: LevelState) -> list[tuple[int, torch.Tensor]]:
        """(j, Φ^Δ(v_{j−1})) for the coarse points j > 0 of this rank (no rhs)."""
        if coarse.right is not None:
            self._send(coarse)
        out = []
        for j in range(max(coarse.lo, 1), coarse.hi):
            x = self._recv(coarse) if j == coarse.lo else coarse.X[j - 1 - coarse.lo]
            out.append((j, self._step(coarse, j, x)))
        self.exchange.wait()
        return out

    def _inject_states(self, lv: LevelState) -> None:
        coarse = self.levels[lv.index + 1]
        for j, c in enumerate(lv.cs):
            coarse.X[j] = lv.X[c - lv.lo]

    def _level(self, lv: LevelState):
        return self.hierarchy.levels[lv.index]

    def _send(self, lv: LevelState) -> None:
        """This rank's last state of lv to the right neighbour."""
        self.exchange.send(lv.X[-1], lv.right)
        if self.observer is not None:
            self.observer.message(lv.index, lv.right, True)

    def _recv(self, lv: LevelState) -> torch.Tensor:
        """The state just before lv's points, from the left neighbour."""
        x = self.exchange.recv(self.template, lv.left)
        if self.observer is not None:
            self.observer.message(lv.index, lv.left, False)
        return x

    def _step(self, lv: LevelState, i: int, x: torch.Tensor, out=None, plus=None,
              last: bool = False):
        """Φ(x) for the step into point i of lv's level (+ plus)."""
        pts = self._level(lv).points
        y = self.prop.step(x, pts[i - 1], pts[i], out=out, plus=plus, level=lv.index,
                           last=last)
        if self.observer is not None:
            self.observer.step(lv.index, 1, last)
        return y

    def _phi(self, lv: LevelState, i: int, x: torch.Tensor, out=None,
             last: bool = False) -> torch.Tensor:
        """Φ(x) + g_i for the step into point i."""
        return self._step(lv, i, x, out, None if lv.G is None else lv.G[i - lv.lo], last)


def sq_norm(r: torch.Tensor) -> float:
    """Σ r², over all elements."""
    flat = r.reshape(-1)
    return float(torch.dot(flat, flat))
