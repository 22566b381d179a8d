"""The fused level operations' sweeps: a rank's intervals step together, CHUNK at a time.

`FusedLevelOps` (fused.py) builds on these: the F-relaxation advances up to CHUNK
intervals per propagator call (one call per step index), and the C-steps that follow
a chunk, or a pass of C-steps alone, go to a consumer (`CSteps`) while their inputs
are in cache.  A subclass sets `fusions` (fused.Fusions) and `kept` (the Φ^Δ a
restriction kept for a level's next F-relaxation: `reuse_phi`).
"""
from __future__ import annotations

import time
from typing import Callable, NamedTuple

import torch

from lptrain.mgrit.indexing import arithmetic_runs, destination, gather, index_of
from lptrain.mgrit.levels import LevelOps, LevelState

# intervals (or C-points) per stacked propagator call: their temporaries stay in cache
CHUNK = 8


class CSteps(NamedTuple):
    """What a pass of C-steps does with Φ(u_{c−1}) + g_c at a chunk of C-points.

    dest(C-points) → (tensor, positions) says where the values belong (they are
    computed there where possible; None: a temporary); take(C-points, values, put)
    uses them, calls put(values) to store them, and returns its share of Σ‖r‖².
    """

    dest: Callable | None
    take: Callable


class StackedSweeps(LevelOps):
    """`LevelOps`' F-relaxation and C-steps in stacked propagator calls (see module)."""

    # -- F-relaxation ------------------------------------------------------------------
    def _f_relax(self, lv: LevelState, consumer: CSteps | None, last: bool
                 ) -> tuple[float, float]:
        """F-relaxation; with a consumer, the C-steps that follow each chunk of F-points
        go to it.  Returns (Σ‖r‖² it took, seconds spent on those C-steps)."""
        if lv.empty:
            return 0.0, 0.0
        level = self._level(lv)
        own = [c for c in lv.cs if c < level.n_points - 1]
        ends = [min(_next_c(level, c), lv.hi) for c in own]
        lengths = [e - c - 1 for c, e in zip(own, ends)]
        taken, spent = 0.0, 0.0
        kept = self.kept.pop(lv.index, {})
        for first in range(0, len(own), CHUNK):    # a chunk through all its F-points
            cs, ls = own[first:first + CHUNK], lengths[first:first + CHUNK]
            for sub in range(max(ls, default=0)):
                src = [c + sub for c, n in zip(cs, ls) if n > sub]
                if sub == 0 and lv.zero and self.fusions.skip_zero:
                    self._take_rhs(lv, src)         # Φ(0) + g = g
                    continue
                if sub == 0 and kept:               # Φ^Δ(v_c) + g, Φ^Δ kept
                    src = self._take_kept(lv, src, kept)
                self._advance(lv, src, last)
            if consumer:
                t0 = time.perf_counter()
                src = [e - 1 for e in ends[first:first + CHUNK] if e < lv.hi]
                for part in arithmetic_runs(src):
                    taken += consumer.take(*self._c_chunk(lv, part, consumer.dest, last))
                spent += time.perf_counter() - t0
        lv.zero = False
        send = lv.right is not None and not level.is_c(lv.hi)
        if send and own:
            self._send(lv)
        if lv.lo > 0 and not level.is_c(lv.lo):     # the interval begun on the left
            x = self._recv(lv)
            stop = lv.cs[0] if lv.cs else lv.hi
            for i in range(lv.lo, stop):
                x = self._phi(lv, i, x, out=lv.X[i - lv.lo], last=last)
            if send and not own:
                self._send(lv)
        if not consumer:
            self.exchange.wait()
            return 0.0, 0.0
        t0 = time.perf_counter()
        if lv.lo > 0 and not level.is_c(lv.lo) and lv.cs:
            taken += consumer.take(*self._c_chunk(lv, [lv.cs[0] - 1], consumer.dest, last))
        self.exchange.wait()
        taken += self._c_steps_fused(lv, consumer, last, local=False)
        spent += time.perf_counter() - t0
        return taken, spent

    def _take_kept(self, lv: LevelState, src: list[int], kept) -> list[int]:
        """u = Φ^Δ(v_c) + g at the points after src whose Φ^Δ was kept (the same sum a
        step with its rhs takes); returns the points of src still to step from."""
        rest = []
        for c in src:
            phi = kept.get(c + 1)
            if phi is None:
                rest.append(c)
            else:
                torch.add(phi, lv.G[c + 1 - lv.lo], out=lv.X[c + 1 - lv.lo])
        return rest

    # -- C-steps ------------------------------------------------------------------------
    def _c_steps_fused(self, lv: LevelState, consumer: CSteps, last: bool = False,
                       local: bool = True) -> float:
        """Φ(u_{c−1}) + g_c for this rank's C-points c > 0, to `consumer`; Σ of its takes.

        A chunk of CHUNK C-points at a time, from the last C-point back, so that
        writing into the states reads only old values.  local=False: only the
        C-point whose F-point lies on the left neighbour (the F-relaxation took
        the others).
        """
        if lv.empty:
            return 0
        level = self._level(lv)
        if lv.right is not None and level.is_c(lv.hi):
            self._send(lv)
        targets = [c for c in lv.cs if c > 0]
        remote = bool(targets) and targets[0] == lv.lo
        chunks = [run[first:first + CHUNK]
                  for run in arithmetic_runs([c - 1 for c in targets[remote:]])
                  for first in range(0, len(run), CHUNK)] if local else []
        total = 0
        for part in reversed(chunks):
            total += consumer.take(*self._c_chunk(lv, part, consumer.dest, last))
        if remote:
            x = self._recv(lv)
            out, put = destination(consumer.dest, [lv.lo])
            one = self._phi(lv, lv.lo, x, out=None if out is None else out[0], last=last)
            total += consumer.take([lv.lo], one.unsqueeze(0), put)
        self.exchange.wait()
        return total

    def _c_chunk(self, lv: LevelState, part: list[int], dest, last: bool = False):
        """(C-points, Φ + g, put) of the C-steps from the local points `part`."""
        pos = [p + 1 for p in part]
        out, put = destination(dest, pos, clash=not set(part).isdisjoint(pos))
        return pos, self._phi_many(lv, part, out=out, last=last), put

    def _coarse_phis(self, lv: LevelState, use, targets: list[int] | None = None) -> None:
        """use(points i, Φ(v_{i−1})) for this rank's points i > 0 of level lv (only
        `targets`, sorted, if given; the messages are the same)."""
        if lv.right is not None:
            self._send(lv)
        if targets is None:
            targets = list(range(max(lv.lo, 1), lv.hi))
        if targets and targets[0] == lv.lo:
            x = self._recv(lv)
            use([lv.lo], self._step(lv, lv.lo, x).unsqueeze(0))
            targets = targets[1:]
        elif lv.lo > 0:
            self._recv(lv)
        for run in arithmetic_runs([i - 1 for i in targets]):
            for first in range(0, len(run), CHUNK):
                src = run[first:first + CHUNK]
                use([p + 1 for p in src], self._steps(lv, src))
        self.exchange.wait()

    # -- stacked steps -------------------------------------------------------------------
    def _steps(self, lv: LevelState, src: list[int], out=None, plus=None,
               last: bool = False) -> torch.Tensor:
        """Φ from each point in src, one propagator call."""
        pts = self._level(lv).points
        U = gather(lv.X, [i - lv.lo for i in src])
        y = self.prop.step_many(U, [pts[i] for i in src], [pts[i + 1] for i in src],
                                out=out, plus=plus, level=lv.index, last=last)
        if self.observer is not None:
            self.observer.step(lv.index, len(src), last)
        return y

    def _phi_many(self, lv: LevelState, src: list[int], out=None,
                  last: bool = False) -> torch.Tensor:
        g = None if lv.G is None else gather(lv.G, [i + 1 - lv.lo for i in src])
        return self._steps(lv, src, out, g, last)

    def _take_rhs(self, lv: LevelState, src: list[int]) -> None:
        """u = g at the points after src (their Φ(0) is zero: `skip_zero`)."""
        for run in arithmetic_runs(src):
            idx = index_of([i + 1 - lv.lo for i in run])
            lv.X[idx] = lv.G[idx]

    def _advance(self, lv: LevelState, src: list[int], last: bool = False) -> None:
        """Φ + g from each point in src into the next point, written in place."""
        runs = arithmetic_runs(src) if self.fusions.stack else [[i] for i in src]
        for run in runs:
            idx = index_of([i + 1 - lv.lo for i in run])
            if isinstance(idx, slice):
                self._phi_many(lv, run, out=lv.X[idx], last=last)
            else:
                lv.X[idx] = self._phi_many(lv, run, last=last)


def _next_c(level, c: int) -> int:
    return level.cpoints[level.count_c_below(c + 1)]
