"""The datasets of metrics.h5, appended to one row at a time at the cost of the write.

Every optimizer iteration appends one row to each of 7–20 datasets (train/, mgrit/,
timing/). h5py's high-level path per value (find the dataset by name, read its shape,
resize it, build a selection, write) made this logging a large part of a short step's
iteration (BENCHMARKS.md "The loop's own time per iteration"). A `Column` (scalars) or `RowColumn` (histories and per-rank rows) keeps its
dataset's handle and shape and appends through the low-level calls (extend, select one
row, write). `append_plain`, `append_history` and `append_per_rank` are the high-level
references; the tests compare the files the two ways write.
"""
from __future__ import annotations

import h5py
import numpy as np

CHUNK_ROWS = 256
CHUNK_HISTORY = (64, 16)


def create_scalar(g: h5py.Group, name: str, dtype: str, fill) -> h5py.Dataset:
    """An empty scalar column, chunked and resizable along its rows."""
    return g.create_dataset(name, shape=(0,), maxshape=(None,), chunks=(CHUNK_ROWS,),
                            dtype=dtype, fillvalue=fill)


def append_plain(g: h5py.Group, name: str, dtype: str, fill, value) -> None:
    """The reference: `value` appended to g[name] (made on first use) by h5py indexing."""
    if name not in g:
        create_scalar(g, name, dtype, fill)
    ds = g[name]
    n = ds.shape[0]
    ds.resize((n + 1,))
    ds[n] = value


def append_history(g: h5py.Group, name: str, values) -> None:
    """The reference for histories: one NaN-padded row; the columns grow to the longest."""
    row = np.asarray([] if values is None else values, dtype=np.float64).ravel()
    if name not in g:
        g.create_dataset(name, shape=(0, 0), maxshape=(None, None), chunks=CHUNK_HISTORY,
                         dtype=np.float64, fillvalue=np.nan)
    ds = g[name]
    n, width = ds.shape
    new_width = max(width, row.size)
    ds.resize((n + 1, new_width))
    if new_width > width and n > 0:
        ds[:n, width:] = np.nan  # earlier rows are shorter: pad them explicitly
    if new_width > 0:
        padded = np.full(new_width, np.nan)
        padded[:row.size] = row
        ds[n, :] = padded


def append_per_rank(g: h5py.Group, name: str, values) -> None:
    """One row of per-rank values; the columns grow to the most ranks so far (earlier
    rows read NaN there), a row of fewer ranks is NaN-padded."""
    row = np.asarray(values, dtype=np.float64).ravel()
    if name not in g:
        g.create_dataset(name, shape=(0, row.size), maxshape=(None, None),
                         chunks=(max(1, 8192 // row.size), row.size),
                         dtype=np.float64, fillvalue=np.nan)
    ds = g[name]
    n, width = ds.shape
    if row.size > width and ds.maxshape[1] is not None and row.size > ds.maxshape[1]:
        raise ValueError(f"{g.name}/{name}: got {row.size} ranks, "
                         f"the file has room for {ds.maxshape[1]}")
    ds.resize((n + 1, max(width, row.size)))
    if row.size > width and n > 0:
        ds[:n, width:] = np.nan     # earlier rows had fewer ranks
    width = ds.shape[1]
    padded = np.full(width, np.nan)
    padded[:row.size] = row
    ds[n, :] = padded


class Column:
    """One scalar dataset appended to through its handle. It keeps the dataset's length,
    so nothing else may resize the dataset while the Column is in use."""

    def __init__(self, ds: h5py.Dataset):
        self._id, self._n = ds.id, ds.shape[0]
        self._one = h5py.h5s.create_simple((1,))
        self._value = np.empty(1, dtype=ds.dtype)

    def append(self, value) -> None:
        n = self._n
        self._id.set_extent((n + 1,))
        space = self._id.get_space()
        space.select_hyperslab((n,), (1,))
        self._value[0] = value
        self._id.write(self._one, space, self._value)
        self._n = n + 1


class Columns:
    """The Columns of one open file by group and name, each made at its first row (and
    its dataset with it, where the file has none yet)."""

    def __init__(self):
        self._by_name: dict[tuple[str, str], "Column | RowColumn"] = {}

    def get(self, g: h5py.Group, name: str, dtype: str, fill) -> Column:
        key = (g.name, name)
        column = self._by_name.get(key)
        if column is None:
            ds = g[name] if name in g else create_scalar(g, name, dtype, fill)
            column = self._by_name[key] = Column(ds)
        return column

    def append_row(self, g: h5py.Group, name: str, values, plain) -> None:
        """One row of a 2-D dataset: through its RowColumn while the row fits the
        dataset's width, else by `plain(g, name, values)` (append_history or
        append_per_rank, which make or widen the dataset), the column made anew after."""
        key = (g.name, name)
        column = self._by_name.get(key)
        if column is None and name in g:
            column = self._by_name[key] = RowColumn(g[name])
        row = np.asarray([] if values is None else values, dtype=np.float64).ravel()
        if column is None or not column.append(row):
            plain(g, name, values)
            self._by_name.pop(key, None)


class RowColumn:
    """A 2-D dataset of NaN-padded rows appended to through its handle, while a row fits
    its width; a wider row is the caller's (append_history / append_per_rank widen the
    dataset and pad the earlier rows), after which the column is made anew."""

    def __init__(self, ds: h5py.Dataset):
        self._id = ds.id
        self._n, self._width = ds.shape
        self._one = h5py.h5s.create_simple((1, max(self._width, 1)))
        self._row = np.empty((1, self._width))

    def append(self, values: np.ndarray) -> bool:
        """Append `values` NaN-padded to the width; False (nothing done) if it is wider or
        the dataset has no columns yet."""
        if values.size > self._width or self._width == 0:
            return False
        n = self._n
        self._id.set_extent((n + 1, self._width))
        space = self._id.get_space()
        space.select_hyperslab((n, 0), (1, self._width))
        self._row.fill(np.nan)
        self._row[0, :values.size] = values
        self._id.write(self._one, space, self._row)
        self._n = n + 1
        return True
