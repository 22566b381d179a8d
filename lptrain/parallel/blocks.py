"""Which states each rank of a grid holds, and which old ranks' pieces make up a new block.

A rank's warm starts are blocks of MGRIT's level-0 states: rows = the points of its
layer rank's range (the forward hierarchy's; for the adjoint, the mirrored range of the
reversed hierarchy), columns = the samples of a batch that lie in its data group's shard,
in the batch's order. A compact block holds only the rows of the level-0 C-points (all a
warm start needs, mgrit/solver.py); its rows are counted among the C-points
(`Layout.c_points`), which every grid places alike. Resuming on another grid (or rank
count) builds each new rank's block from the pieces of the old ranks' blocks that
overlap it in rows and in samples.
Pure index arithmetic: ranges and index tensors; no state is moved here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lptrain.mgrit.hierarchy import Hierarchy
from lptrain.parallel.grid import Grid, shard

KINDS = ("fwd", "adj")     # the forward and the adjoint warm starts
ALL_ROWS, C_POINTS = "all", "c-points"   # rows a warm-start block holds


@dataclass(frozen=True)
class Layout:
    """Who holds what on one grid: per layer rank the forward and adjoint rows [lo, hi),
    per data group the training samples [lo, hi); `fwd_c`, `adj_c`: the rows of the
    compact blocks (C-points counted from 0 in either direction)."""

    grid: Grid
    fwd: tuple[tuple[int, int], ...]
    adj: tuple[tuple[int, int], ...]
    shards: tuple[tuple[int, int], ...]
    fwd_c: tuple[tuple[int, int], ...] = ()
    adj_c: tuple[tuple[int, int], ...] = ()

    def rows(self, kind: str, layer_rank: int) -> tuple[int, int]:
        return getattr(self, kind)[layer_rank]

    def c_points(self) -> "Layout":
        """The layout of compact blocks: the same grid and shards, rows among C-points."""
        return Layout(self.grid, self.fwd_c, self.adj_c, self.shards, self.fwd_c, self.adj_c)


def layout(grid: Grid, hier: Hierarchy, n_samples: int) -> Layout:
    """The layout of `grid` for a hierarchy distributed over grid.layer ranks and a
    training set of n_samples split into grid.data shards (parallel.grid.shard)."""
    if hier.size != grid.layer:
        raise ValueError(f"hierarchy over {hier.size} ranks for a grid of {grid.layer} "
                         f"layer ranks")
    rev, p = hier.reversed(), hier.size
    adj = tuple(rev.ranges[0][p - 1 - j] for j in range(p))   # rank j is p−1−j there
    shards = tuple(shard(n_samples, grid.data, g) for g in range(grid.data))
    fwd = tuple(hier.ranges[0])
    return Layout(grid, fwd, adj, shards, _c_rows(hier, fwd), _c_rows(rev, adj))


def _c_rows(hier: Hierarchy, ranges) -> tuple[tuple[int, int], ...]:
    """Level-0 ranges [lo, hi) as ranges among the C-points (none with one level)."""
    lv = hier.levels[0]
    return tuple((lv.count_c_below(lo), lv.count_c_below(hi)) for lo, hi in ranges)


def overlap(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int] | None:
    """The common part [lo, hi) of two ranges, None if empty."""
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    return (lo, hi) if lo < hi else None


def in_shard(batch: torch.Tensor, bounds: tuple[int, int]) -> torch.Tensor:
    """Mask of the batch's samples (training-set indices) inside a shard."""
    return (batch >= bounds[0]) & (batch < bounds[1])


def block_shape(lay: Layout, rank: int, kind: str, batch: torch.Tensor) -> tuple[int, int]:
    """(rows, samples) of world rank `rank`'s block of `kind` for a batch."""
    layer, group = lay.grid.coords(rank)
    lo, hi = lay.rows(kind, layer)
    return hi - lo, int(in_shard(batch, lay.shards[group]).sum())


@dataclass(frozen=True)
class Piece:
    """The part of old rank `source`'s block that goes into the new block: rows and
    samples `old_rows`, `old_samples` of the old block are `rows`, `samples` of the new
    one (slices, or index tensors where samples are not consecutive)."""

    source: int
    old_rows: slice
    rows: slice
    old_samples: slice | torch.Tensor
    samples: slice | torch.Tensor


def pieces(old: Layout, new: Layout, rank: int, kind: str, batch: torch.Tensor) -> list[Piece]:
    """The pieces of old ranks' blocks that make up new world rank `rank`'s block of
    `kind` for `batch` (its samples' training-set indices, in batch order); together
    they cover the new block exactly once."""
    layer, group = new.grid.coords(rank)
    rows, shard_new = new.rows(kind, layer), new.shards[group]
    mine = in_shard(batch, shard_new)
    position = torch.cumsum(mine, 0) - 1         # place in the new block's samples
    found = []
    for g, shard_old in enumerate(old.shards):
        theirs = in_shard(batch, shard_old)
        both = mine & theirs
        if not bool(both.any()):
            continue
        old_samples = _compact((torch.cumsum(theirs, 0) - 1)[both])
        samples = _compact(position[both])
        for j in range(old.grid.layer):
            common = overlap(old.rows(kind, j), rows)
            if common is None:
                continue
            lo_old = old.rows(kind, j)[0]
            found.append(Piece(g * old.grid.layer + j,
                               slice(common[0] - lo_old, common[1] - lo_old),
                               slice(common[0] - rows[0], common[1] - rows[0]),
                               old_samples, samples))
    return found


def sources(old: Layout, new: Layout, rank: int) -> list[int]:
    """Old world ranks whose blocks may hold part of new rank `rank`'s (rows of either
    kind and shards overlap), in rank order; old rank 0 when none does (a rank without
    samples still takes the state every rank holds alike from one)."""
    layer, group = new.grid.coords(rank)
    found = []
    for r in range(old.grid.size):
        j, g = old.grid.coords(r)
        rows = any(overlap(old.rows(k, j), new.rows(k, layer)) for k in KINDS)
        if rows and overlap(old.shards[g], new.shards[group]):
            found.append(r)
    return found or [0]


def _compact(index: torch.Tensor) -> slice | torch.Tensor:
    """A slice when the indices are consecutive and ascending (a view, no copy)."""
    if index.numel() and int(index[-1] - index[0]) == index.numel() - 1 and \
            bool((index[1:] - index[:-1] == 1).all()):
        return slice(int(index[0]), int(index[-1]) + 1)
    return index
