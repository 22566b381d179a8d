"""An earlier run's metrics.h5 made fit to continue (resume=): rows after the iteration
the run resumes after cut, columns an older version of lptrain did not write added; the
refusal where the file is gone.  `MetricsWriter.reopen` (writer.py) applies them."""
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
