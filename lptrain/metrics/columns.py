"""The scalar datasets of metrics.h5, appended to one row at a time at the cost of the write.

Every optimizer iteration appends one value to each of 7–20 scalar datasets (train/,
mgrit/, timing/). Through h5py's high-level path — find the dataset by name, read its
shape, resize it, build a selection, write — one value costs about 0.2 ms: 14 ms an
iteration of the default run, a sixth of its wall time (BENCHMARKS.md "Writing
metrics.h5"). A `Column` keeps its dataset's handle and length and appends through the
low-level calls (extend, select one element, write). `append_plain` is the high-level
reference; the tests compare the files the two write.
"""
from __future__ import annotations

import h5py
import numpy as np

CHUNK_ROWS = 256


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
        self._by_name: dict[tuple[str, str], Column] = {}

    def get(self, g: h5py.Group, name: str, dtype: str, fill) -> Column:
        key = (g.name, name)
        column = self._by_name.get(key)
        if column is None:
            ds = g[name] if name in g else create_scalar(g, name, dtype, fill)
            column = self._by_name[key] = Column(ds)
        return column
