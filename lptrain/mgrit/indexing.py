"""Positions in the solver's state buffers: pure index arithmetic, no MPI, no solver.

A list of positions that is an arithmetic progression becomes a slice, so
reading or writing those states is a view instead of a copy.
"""
from __future__ import annotations

from functools import lru_cache

import torch


def arithmetic_runs(positions: list[int]) -> list[list[int]]:
    """Split sorted positions into maximal arithmetic progressions."""
    runs: list[list[int]] = []
    for p in positions:
        if runs and (len(runs[-1]) == 1 or p - runs[-1][-1] == runs[-1][1] - runs[-1][0]):
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


def index_of(positions: list[int]):
    """A slice when positions are an arithmetic progression, else an index tensor
    (remembered per positions: a solver asks for the same ones every iteration; the
    tensor is only ever used to index)."""
    return _index_of(tuple(positions))


@lru_cache(maxsize=1 << 14)
def _index_of(positions: tuple[int, ...]):
    if len(positions) == 1:
        return slice(positions[0], positions[0] + 1)
    step = positions[1] - positions[0]
    if step > 0 and all(b - a == step for a, b in zip(positions, positions[1:])):
        return slice(positions[0], positions[-1] + 1, step)
    return torch.tensor(positions)


def destination(dest, positions: list[int], clash: bool = False):
    """(out view or None, put) for values meant for dest(positions).

    clash: the values are computed from points among `positions` (write after).
    """
    if dest is None:
        return None, _nothing
    X, where = dest(positions)
    idx = index_of(where)
    if isinstance(idx, slice) and not clash:
        return X[idx], _nothing

    def put(values):
        X[idx] = values
    return None, put


def _nothing(values):
    pass


def gather(X: torch.Tensor, positions: list[int]) -> torch.Tensor:
    return X[index_of(positions)]


def scatter(X: torch.Tensor, positions: list[int], values: torch.Tensor) -> None:
    X[index_of(positions)] = values


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b are the same elements of the same storage (copying is a no-op)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def layout_order(t: torch.Tensor) -> tuple[int, ...]:
    """t's dimensions from the outermost in memory to the innermost (by stride; ties keep
    their order, so a contiguous tensor gives 0, 1, 2, ...)."""
    return tuple(sorted(range(t.dim()), key=lambda d: -t.stride(d)))


def fits_rows(buf: torch.Tensor | None, template: torch.Tensor, rows: int) -> bool:
    """Whether `buf` has the form new_rows(template, rows) gives (shape, dtype, device and
    the dense row layout), so that it can be written instead of a new block; the layout
    is new_rows' own, made on the meta device (no memory)."""
    if buf is None or buf.shape != (rows, *template.shape) or \
            buf.dtype != template.dtype or buf.device != template.device:
        return False
    shape_only = torch.empty_strided(template.shape, template.stride(), dtype=template.dtype,
                                     device="meta")
    return buf.stride() == new_rows(shape_only, rows).stride()


def zeros_rows(template: torch.Tensor, rows: int) -> torch.Tensor:
    """Zeros of shape (rows, *template.shape), each row laid out in memory as template
    is (e.g. channels_last rows for a channels_last template; contiguous for a
    contiguous one)."""
    return new_rows(template, rows).zero_()


def new_rows(template: torch.Tensor, rows: int) -> torch.Tensor:
    """`zeros_rows` uninitialised."""
    order = layout_order(template)
    buf = template.new_empty((rows, *(template.shape[d] for d in order)))
    return buf.permute(0, *(1 + order.index(d) for d in range(template.dim())))


def row_write_order(out: torch.Tensor, before=(), after=()) -> range | None:
    """An order of the rows i (dim 0) in which writing out[i] between reading row i of
    each tensor in `before` and row i of each in `after` changes no row of those
    before it is read: ascending, else descending, else None (compute every row
    first).  out[i] may be exactly row i of a `before` tensor (an in-place step).
    Address arithmetic only: no copy, no kernel."""
    if out.numel() == 0:
        return range(out.shape[0])
    spans, ascending, descending = None, True, True
    for r, own_row in [(r, True) for r in before] + [(r, False) for r in after]:
        if r is None or r.untyped_storage().data_ptr() != out.untyped_storage().data_ptr():
            continue
        spans = spans or _row_spans(out)
        rows = _row_spans(r)
        for i, (lo, hi) in enumerate(spans):
            hit = [j for j, (a, b) in enumerate(rows) if a < hi and lo < b]
            if i in hit and not (own_row and out[i].data_ptr() == r[i].data_ptr()
                                 and out[i].stride() == r[i].stride()):
                return None      # out[i] written over row i before (or as) it is read
            ascending &= all(j <= i for j in hit)
            descending &= all(j >= i for j in hit)
    k = out.shape[0]
    return range(k) if ascending else range(k - 1, -1, -1) if descending else None


def _row_spans(t: torch.Tensor) -> list[tuple[int, int]]:
    """[first byte, last byte + 1) of each row (dim 0) of a non-empty t."""
    size, inner = t.element_size(), list(zip(t.shape[1:], t.stride()[1:]))
    low = sum(min(0, (n - 1) * s) for n, s in inner) * size
    high = sum(max(0, (n - 1) * s) for n, s in inner) * size + size
    step = t.stride(0) * size
    return [(t.data_ptr() + i * step + low, t.data_ptr() + i * step + high)
            for i in range(t.shape[0])]
