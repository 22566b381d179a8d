"""An earlier run's metrics.h5 made fit to continue (resume=): opened only where it is
whole, lptrain's and no other process's to write; rows after the iteration the run
resumes after cut, columns an older version of lptrain did not write added; the refusal
where the file is gone.  `MetricsWriter.reopen` (writer.py) applies them."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from lptrain.metrics import schema as s
from lptrain.metrics.columns import CHUNK_ROWS, create_scalar


def gone(path: Path) -> s.MetricsInputError:
    """The refusal of a resume whose metrics file was removed: its rows are lost."""
    return s.MetricsInputError(f"{path}: gone (removed after the run began?), so the run's "
                               f"record is lost and it cannot be resumed; move the "
                               f"directory away to run it again")


def truncate(g: h5py.Group, iteration: int) -> None:
    """Keep the rows of group g up to `iteration` (rows are in iteration order)."""
    if s.ITERATION not in g:
        return
    # `iteration` is written last in a row: a killed writer leaves it short or at -1
    ok = (lambda its: (its >= 0) & (its <= iteration))(g[s.ITERATION][:])
    keep = len(ok) if ok.all() else int(np.argmin(ok))
    for name, ds in g.items():
        if ds is None:        # h5py's answer for a link whose object is damaged
            raise KeyError(f"{g.name}/{name}: unreadable")
        if ds.shape[0] > keep:
            ds.resize((keep, *ds.shape[1:]))


def add_missing_columns(g: h5py.Group, group: str) -> None:
    """Scalar columns a file written by an earlier version lacks (mgrit/unconverged, say),
    as long as its rows and holding the fill value there (unknown): appended alone, a
    new column would pair the earlier rows with this start's values, and the reader,
    which cuts every column to the shortest, would drop this start's rows."""
    if s.ITERATION not in g:
        return
    rows = g[s.ITERATION].shape[0]
    for name, field in s.FIELDS[group].items():
        if name not in g and name not in s.HISTORIES and name not in s.PER_RANK \
                and group != s.TIMING:
            create_scalar(g, name, field.dtype, s.FILL[field.dtype]).resize((rows,))


def add_grid_columns(timing: h5py.Group, root) -> None:
    """Grid columns for a timing group written before it had them, filled with the
    root attributes its rows ran on (-1 where the file does not say)."""
    rows = timing[s.COMPUTE].shape[0]
    for name in s.GRID_COLUMNS:
        if name not in timing:
            value = int(root.get(name, s.FILL[s.INT]))
            timing.create_dataset(name, data=np.full(rows, value, dtype=np.int64),
                                  maxshape=(None,), chunks=(CHUNK_ROWS,),
                                  fillvalue=s.FILL[s.INT])


def open_to_continue(path: Path) -> h5py.File:
    """`path` opened to append to, without HDF5's file lock (as the writer opens a new
    file); refused where it is gone, not HDF5, or written by another process."""
    # HDF5 would take an empty file for a new one and the resumed run would lose the
    # earlier rows silently
    if not path.exists():
        raise gone(path)
    if path.is_file() and not h5py.is_hdf5(path):
        raise s.MetricsInputError(f"{path}: cannot reopen metrics file (not an HDF5 file, "
                                  f"{path.stat().st_size} bytes)")
    _refuse_another_writer(path)
    try:
        return h5py.File(path, "r+", locking=False)
    except OSError as exc:
        raise s.MetricsInputError(f"{path}: cannot reopen metrics file ({exc})") from None


def check_rows_reach(f: h5py.File, path: Path, iteration: int) -> None:
    """MetricsInputError where `f` is not an lptrain file or its rows end before
    `iteration`, the checkpoint's (each row is flushed before its iteration's
    checkpoint, so a shorter file is another start's)."""
    if s.STATUS not in f.attrs:
        raise s.MetricsInputError(f"{path}: not an lptrain metrics file (no "
                                  f"{s.STATUS!r} attribute)")
    last = max((int(g[s.ITERATION][-1]) for g in map(f.get, s.GROUPS)
                if g is not None and s.ITERATION in g and len(g[s.ITERATION])),
               default=0)
    if last < iteration:
        raise s.MetricsInputError(
            f"{path}: its rows end at iteration {last}, the checkpoint is of "
            f"iteration {iteration}: not this file's checkpoint (copied in from "
            f"another start?); resume would leave iterations {last + 1}-{iteration} "
            f"out of it")


def _refuse_another_writer(path: Path) -> None:
    """MetricsInputError where another process holds `path` open for writing. lptrain
    opens its files without HDF5's file lock (a reader must not stop the run, nor the
    run a reader), so a writer elsewhere (h5py's "a", which locks) would go unseen and
    its flushes would overwrite the resumed run's; a locked read is what its lock
    refuses. A file system without locks says nothing either way."""
    try:
        h5py.File(path, "r", locking=True).close()
    except BlockingIOError:
        raise s.MetricsInputError(f"{path}: open for writing in another process; close "
                                  f"it there, then resume again") from None
    except OSError:
        pass          # no locks here, or a damaged file: the open that follows says so


def read_whole(f: h5py.File) -> None:
    """Read every root attribute and column of `f` once: HDF5 finds a damaged heap or
    chunk only where it reads, and a run resumed on one left a file no reader opens."""
    dict(f.attrs.items())
    for group in s.GROUPS:
        if group in f:
            for column in f[group].values():
                if isinstance(column, h5py.Dataset):
                    column[...]
