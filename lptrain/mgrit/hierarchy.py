"""MGRIT grid hierarchy and its distribution over ranks: pure index arithmetic.

Level 0 has the points 0..N (fine layer indices).  On every level the
C-points are every cf-th point counted from the start, plus the last point;
level ℓ+1 consists of level ℓ's C-points.  A rank owns a contiguous range
of points on every level: on level 0 whole C-intervals, on coarse levels the
points it already owned on the level below (so a coarse range may be empty).
The adjoint runs on the mirrored hierarchy (`reversed()`), in which the same
rank owns the same layers.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from lptrain.errors import SolverError, counted


@dataclass(frozen=True)
class Level:
    """One grid level: the fine indices of its points and which are C-points.

    `cpoints` are level indices (positions in `points`); empty on the coarsest level.
    """

    points: tuple[int, ...]
    cpoints: tuple[int, ...]

    @property
    def n_points(self) -> int:
        return len(self.points)

    def is_c(self, i: int) -> bool:
        k = bisect_left(self.cpoints, i)
        return k < len(self.cpoints) and self.cpoints[k] == i

    def count_c_below(self, i: int) -> int:
        """Number of C-points with level index < i."""
        return bisect_left(self.cpoints, i)


def c_points(n_points: int, cf: int) -> tuple[int, ...]:
    """Every cf-th level index from 0, plus the last point."""
    pts = list(range(0, n_points, cf))
    if pts[-1] != n_points - 1:
        pts.append(n_points - 1)
    return tuple(pts)


def build_levels(n_steps: int, cf0: int, cf: int, max_levels: int,
                 min_coarse: int) -> tuple[Level, ...]:
    """Coarsen while levels < max_levels and the coarse level keeps >= min_coarse steps."""
    if n_steps < 1 or cf0 < 2 or cf < 2 or max_levels < 1:
        raise SolverError(f"invalid hierarchy: N={n_steps}, cfactor0={cf0}, cfactor={cf}, "
                          f"levels={max_levels}")
    points = tuple(range(n_steps + 1))
    levels: list[Level] = []
    while True:
        factor = cf0 if not levels else cf
        cps = c_points(len(points), factor)
        coarse_steps = len(cps) - 1
        can_coarsen = (len(levels) + 1 < max_levels and coarse_steps >= max(min_coarse, 1)
                       and coarse_steps < len(points) - 1)
        if not can_coarsen:
            levels.append(Level(points, ()))
            return tuple(levels)
        levels.append(Level(points, cps))
        points = tuple(points[i] for i in cps)


@dataclass(frozen=True)
class Hierarchy:
    """The levels plus, per level, each rank's point range [lo, hi)."""

    levels: tuple[Level, ...]
    ranges: tuple[tuple[tuple[int, int], ...], ...]  # ranges[level][rank]

    @property
    def n_steps(self) -> int:
        return self.levels[0].points[-1] - self.levels[0].points[0]

    @property
    def size(self) -> int:
        return len(self.ranges[0])

    def owner(self, level: int, i: int) -> int:
        """Rank owning level point i."""
        for r, (lo, hi) in enumerate(self.ranges[level]):
            if lo <= i < hi:
                return r
        raise IndexError(f"point {i} outside level {level}")

    def left(self, level: int, rank: int) -> int | None:
        """Owner of the point just before this rank's range (None if none)."""
        lo, hi = self.ranges[level][rank]
        return self.owner(level, lo - 1) if hi > lo and lo > 0 else None

    def right(self, level: int, rank: int) -> int | None:
        """Owner of the point just after this rank's range (None if none)."""
        lo, hi = self.ranges[level][rank]
        n = self.levels[level].n_points
        return self.owner(level, hi) if hi > lo and hi < n else None

    def reversed(self) -> "Hierarchy":
        """The mirrored hierarchy for a solve backwards in layer time.

        Point i of level ℓ becomes n_ℓ−1−i and rank r becomes size−1−r; the
        rank that owned fine points [lo, hi) now owns mirrored points
        [N−hi, N−lo), i.e. the adjoint variables λ_{lo+1}..λ_{hi} its layers need.
        """
        N = self.n_steps
        levels = tuple(Level(tuple(N - p for p in reversed(lv.points)),
                             tuple(lv.n_points - 1 - c for c in reversed(lv.cpoints)))
                       for lv in self.levels)
        fine = [(N - hi, N - lo) for lo, hi in reversed(_interval_ranges(self))]
        return Hierarchy(levels, _coarse_ranges(levels, _close_last(fine, N + 1)))


def _interval_ranges(h: Hierarchy) -> list[tuple[int, int]]:
    """Level-0 ranges without the final point's extra ownership."""
    n = h.levels[0].n_points
    return [(lo, hi if hi < n else n - 1) for lo, hi in h.ranges[0]]


def _close_last(ranges: list[tuple[int, int]], n_points: int) -> list[tuple[int, int]]:
    lo, _ = ranges[-1]
    return ranges[:-1] + [(lo, n_points)]


def _coarse_ranges(levels, fine_ranges):
    ranges = [tuple(fine_ranges)]
    for lv in levels[:-1]:
        below = ranges[-1]
        ranges.append(tuple((lv.count_c_below(lo), lv.count_c_below(hi)) for lo, hi in below))
    return tuple(ranges)


def split_intervals(n_intervals: int, size: int) -> list[tuple[int, int]]:
    """Contiguous, balanced blocks [j0, j1) of C-intervals for each rank."""
    if size > n_intervals:
        raise SolverError(f"{size} ranks but only {counted(n_intervals, 'C-interval')} on "
                          f"the finest level: use at most {counted(n_intervals, 'rank')}, "
                          f"more layers or a smaller mgrit.cfactor0 (2 at least)")
    return [(r * n_intervals // size, (r + 1) * n_intervals // size) for r in range(size)]


def build_hierarchy(n_steps: int, cf0: int, cf: int, max_levels: int, min_coarse: int,
                    size: int) -> Hierarchy:
    """Levels and their distribution over `size` ranks."""
    levels = build_levels(n_steps, cf0, cf, max_levels, min_coarse)
    lv0 = levels[0]
    if not lv0.cpoints:  # one level: split the steps themselves
        cps = tuple(range(lv0.n_points))
    else:
        cps = lv0.cpoints
    blocks = split_intervals(len(cps) - 1, size)
    fine = [(cps[j0], cps[j1]) for j0, j1 in blocks]
    fine = _close_last(fine, lv0.n_points)
    return Hierarchy(levels, _coarse_ranges(levels, fine))
