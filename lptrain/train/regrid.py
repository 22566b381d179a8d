"""Warm starts saved on one grid, assembled for a rank of another (resume on any grid).

MGRIT's iterates do not depend on how the layers and the samples are split over ranks,
so a checkpoint's warm starts stay valid on another rank count or grid once each new
rank holds the states of its own layers and samples: its block of every kept batch is
put together from the pieces of the old ranks' blocks (parallel/blocks.py says which).
The adjoint states are derivatives of a rank's mean loss over its samples of the batch
(train/mgrit_oracle.py), so a piece moving from a data group holding n_old of the batch's
samples to one holding n_new is scaled by n_old / n_new (MEAN_SCALED).
Compact blocks (only the C-point rows, parallel/blocks.py) move as compact blocks, with
rows counted among the C-points (the state says which: `oracle.warm_rows`).
A batch's block is kept only when every piece arrived (else the batch starts cold); a
batch of which the new rank holds no samples keeps its place in the cache without
states, as on a rank that had none (DataParallelOracle). Tensors only, no files: the
old ranks' states come from an iterable, one at a time, so memory holds the new state
and one old rank's.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch

from lptrain.parallel.blocks import C_POINTS, KINDS, Layout, block_shape, pieces

MEAN_SCALED = ("adj",)     # warm starts scaled by 1 / (the rank's samples of the batch)


def regrid(old: Layout, new: Layout, rank: int, samples: Callable[[int], torch.Tensor],
           states: Iterable[tuple[int, dict]], oracle, axis: int = 1) -> dict:
    """New world rank `rank`'s oracle state from old ranks' (rank, state) pairs (those of
    blocks.sources, in any order); `samples(key)`: the training-set indices of batch
    `key` in batch order; `oracle` reads and writes the warm-start entries of a state
    (warm_entries / with_warm_entries); `axis`: the samples' axis of a warm-start
    tensor (its rows are axis 0). The rest of the state (what every rank holds alike:
    controller plans, rung) is the first old rank's. ValueError where an old block's
    shape is not the one its layout gives."""
    base, form, order, parts = None, None, [], {}
    for r, state in states:
        if base is None:          # without its warm starts: memory holds one old state
            base, form = oracle.with_warm_entries(state, []), oracle.warm_rows(state)
            old, new = _in_rows(old, form), _in_rows(new, form)
        elif oracle.warm_rows(state) != form:
            raise ValueError(f"rank {r}'s warm starts hold {oracle.warm_rows(state)} rows, "
                             f"the first rank's {form}")
        for key, *tensors in oracle.warm_entries(state):
            if key not in parts:
                order.append(key)
                parts[key] = _Entry(old, new, rank, key, samples(key), axis)
            parts[key].take(r, tensors)
        state = tensors = None    # freed before the next old state is read
    if base is None:
        raise ValueError("regrid: no old rank's state given")
    return oracle.with_warm_entries(base, [[key, *parts[key].done()] for key in order])


class _Entry:
    """One batch's forward and adjoint blocks of the new rank, filled piece by piece."""

    def __init__(self, old: Layout, new: Layout, rank: int, key: int, batch: torch.Tensor,
                 axis: int):
        self.old, self.key, self.batch, self.axis = old, key, batch, axis
        self.shape = {k: block_shape(new, rank, k, batch) for k in KINDS}
        self.wanted = {k: pieces(old, new, rank, k, batch) for k in KINDS}
        self.missing = {k: {p.source for p in self.wanted[k]} for k in KINDS}
        self.blocks: dict = {k: None for k in KINDS}

    def take(self, r: int, tensors: list) -> None:
        """Copy old rank r's pieces of this batch (None where r kept no such state)."""
        for kind, t in zip(KINDS, tensors):
            mine = [p for p in self.wanted[kind] if p.source == r]
            if t is None or not mine:
                continue
            want = block_shape(self.old, r, kind, self.batch)
            if _rows_samples(t, self.axis) != want:
                raise ValueError(f"rank {r}'s {kind} warm start of batch {self.key} has shape "
                                 f"{tuple(t.shape)}, its layout {want} (rows, samples at "
                                 f"axis {self.axis})")
            if self.blocks[kind] is None:
                shape = list(t.shape)
                shape[0], shape[self.axis] = self.shape[kind]
                self.blocks[kind] = t.new_empty(shape)
            block, t = self.blocks[kind].movedim(self.axis, 1), t.movedim(self.axis, 1)
            scale = want[1] / self.shape[kind][1] if kind in MEAN_SCALED else 1.0
            for p in mine:            # views with the samples at axis 1
                piece = t[p.old_rows][:, p.old_samples]
                block[p.rows][:, p.samples] = piece if scale == 1.0 else piece * scale
            self.missing[kind].discard(r)

    def done(self) -> list:
        """[forward, adjoint] blocks; None where a piece is missing or no sample is ours."""
        return [None if self.missing[k] or self.shape[k][1] == 0 else self.blocks[k]
                for k in KINDS]


def fits(lay: Layout, rank: int, samples: Callable[[int], torch.Tensor], state: dict,
         oracle, axis: int = 1) -> bool:
    """Whether every warm start of `state` has the block shape `lay` gives world rank
    `rank` (a checkpoint that does not record its grid may come from another)."""
    lay = _in_rows(lay, oracle.warm_rows(state))
    try:
        for key, *tensors in oracle.warm_entries(state):
            batch = samples(key)
            for kind, t in zip(KINDS, tensors):
                if t is not None and _rows_samples(t, axis) != block_shape(lay, rank, kind,
                                                                           batch):
                    return False
    except ValueError:          # a batch key this run does not have
        return False
    return True


def _in_rows(lay: Layout, form: str) -> Layout:
    """The layout whose rows are those a block of `form` holds."""
    return lay.c_points() if form == C_POINTS else lay


def _rows_samples(t: torch.Tensor, axis: int) -> tuple[int, int]:
    return (t.shape[0], t.shape[axis]) if t.dim() > axis else (t.shape[0], -1)
