"""Append per-iteration metrics to metrics.h5 on rank 0, flushing after every call.

Every dataset is chunked and resizable along its first axis; each log call appends one row
to every dataset of its group (left-out fields get the fill value of schema.FILL) and then
flushes the file, so a run stopped at any point leaves a readable file holding every
finished iteration. Ranks other than 0 use `NullWriter`, which accepts the same calls.
"""
from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Sequence

import h5py

from lptrain import __version__
from lptrain.errors import DivergedError, Interrupted, one_line, one_of
from lptrain.metrics import schema as s
from lptrain.metrics.columns import Columns, append_history, append_per_rank
from lptrain.metrics.h5_faults import descriptor, discard, write_failure
from lptrain.metrics.reopen import (add_grid_columns, add_missing_columns, check_rows_reach,
                                    open_to_continue, read_whole, truncate)
from lptrain.train.control import convergence_factor

RESERVE_BYTES = 4 * 2 ** 20   # free space kept on the file's file system (see MetricsWriter)


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer may still use on the file system of `directory`."""
    fs = os.statvfs(directory)
    return fs.f_bavail * fs.f_frsize


class MetricsWriter:
    """Owner of one open metrics.h5; also a context manager that records how the run ended.

    Faults: HDF5 cannot survive a full disk (h5py crashes once a write fails with
    ENOSPC), so before every row the writer checks that at least RESERVE_BYTES are free
    on the file's file system. When they are not, it keeps the error in `failure` and
    still writes the rows of that iteration from the reserve (a few KB), so that the
    file and the checkpoint the loop then writes end at the same iteration; a row of a
    later iteration, or close(), stores status `failed` with the reason and closes the
    file. A write that fails does so at once. The training loop turns `failure` into an
    error on every rank at the end of the iteration.

    `with MetricsWriter(path, attrs) as w:` closes with status `completed` on a normal exit,
    `diverged` on DivergedError, `interrupted` on Interrupted (a signal the ranks agreed
    to stop for) and `failed` on any other exception, a KeyboardInterrupt that a user's
    code raised included (the message goes to the `error` attribute); the exception
    propagates.
    """

    _reserve_for: int | None = None    # the iteration written from the reserve
    rows_lost = False    # a write failed: the failing iteration's rows are not in the file

    def __init__(self, path: str | Path, attrs: dict):
        """Create `path`, store the root attributes `attrs`, set status `running`.

        Attributes given as None are left out; schema.REQUIRED_ATTRS must be present.
        """
        self.path = Path(path)
        self._earlier_rows: dict = {}   # group -> rows before this start: none here
        attrs = {s.VERSION: __version__,
                 s.STARTED_AT: datetime.now().isoformat(timespec="seconds"),
                 **{name: value for name, value in attrs.items() if value is not None}}
        missing = [name for name in s.REQUIRED_ATTRS if name not in attrs]
        if missing:
            raise KeyError(f"metrics attributes missing: {', '.join(missing)}")
        for name in attrs:
            _check_name(s.ROOT, name)
        values = {name: _attr_value(name, value) for name, value in attrs.items()}
        self._file = _create(self.path)
        self._closed, self._columns, self._groups = False, Columns(), {}
        self._labelled: set[str] = set()     # groups whose datasets carry their units
        self.failure: s.MetricsFileError | None = None
        self._grid, self._skip_timing = _grid_of(attrs), False
        for name, value in values.items():
            self._file.attrs[name] = value
        self._file.attrs[s.STATUS] = s.RUNNING
        self._file.flush()

    def earlier(self, group: str, name: str) -> list:
        """Column `name` of `group` as the earlier starts of a resumed run left it (up to
        the iteration it resumes after); [] for a new run or a column it has not."""
        rows = self._earlier_rows.get(group)
        column = self._file[group].get(name) if rows else None
        return column[:rows].tolist() if column is not None and column.ndim == 1 else []

    @classmethod
    def reopen(cls, path: str | Path, iteration: int, attrs: dict) -> MetricsWriter:
        """Continue an earlier run's file (resume): rows after `iteration` are dropped (they
        will be computed again), status goes back to `running`, the grid's root attributes
        become this start's (`attrs`); each timing/ row keeps the grid that computed it.
        Older files get timing/'s grid columns from their root attributes (all their rows
        ran on them); their per-rank columns cannot widen: rows on more ranks are left out."""
        self = cls.__new__(cls)
        self.path, self._closed, self.failure = Path(path), False, None
        self._columns, self._groups, self._labelled = Columns(), {}, set()
        self._file = open_to_continue(self.path)
        try:
            read_whole(self._file)
            self._continue(iteration, attrs)
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            # HDF5's own checks of a file damaged inside (a heap, a dataspace message)
            try:
                self._file.close()
            except (OSError, RuntimeError):
                pass
            if isinstance(exc, s.MetricsInputError):
                raise
            raise s.MetricsInputError(f"{path}: cannot reopen metrics file (damaged: "
                                      f"{one_line(exc)})") from None
        return self

    def _continue(self, iteration: int, attrs: dict) -> None:
        """reopen's work on the open file (its rows, columns, attributes)."""
        check_rows_reach(self._file, self.path, iteration)
        for group in s.GROUPS:
            if group in self._file:
                truncate(self._file[group], iteration)
                add_missing_columns(self._file[group], group)
        # the rows before this start (`earlier`): the console's and TensorBoard's final
        # numbers are the whole run's
        self._earlier_rows = {group: self._file[group][s.ITERATION].shape[0]
                              for group in s.GROUPS if group in self._file
                              and s.ITERATION in self._file[group]}
        self._grid = _grid_of(attrs)
        timing = self._file.get(s.TIMING)
        self._skip_timing = False
        if timing is not None and s.COMPUTE in timing:
            add_grid_columns(timing, self._file.attrs)
            width = timing[s.COMPUTE].maxshape[1]
            self._skip_timing = width is not None and width < self._grid[s.WORLD_SIZE]
        for name, value in attrs.items():
            if name in s.START_ATTRS and value is not None:
                self._file.attrs[name] = _attr_value(name, value)
        for ended in (s.ERROR, s.EPOCH_OBJECTIVE):     # how the last start ended
            if ended in self._file.attrs:
                del self._file.attrs[ended]
        self._file.attrs[s.STATUS] = s.RUNNING
        self._file.flush()

    # -- logging ---------------------------------------------------------------------------
    def log_train(self, **fields) -> None:
        """Append one optimizer iteration to train/ (`iteration` is required)."""
        self._append_row(s.TRAIN, fields)

    def log_validation(self, iteration: int, loss: float, accuracy: float) -> None:
        """Append one evaluation on the validation set."""
        self._append_row(s.VALIDATION, {s.ITERATION: iteration, s.LOSS: loss,
                                        s.ACCURACY: accuracy})

    def log_mgrit(self, **fields) -> None:
        """Append the MGRIT solves of one optimizer iteration to mgrit/.

        Histories are lists of residuals, one per MGRIT iteration. When a history is given,
        the iterations, final residual and convergence factor of that solve default to
        its length, last entry and `convergence_factor`.
        """
        fields = dict(fields)
        for history, its, res, factor in (
                (s.FWD_HISTORY, s.FWD_ITERATIONS, s.FWD_RESIDUAL, s.FWD_FACTOR),
                (s.ADJ_HISTORY, s.ADJ_ITERATIONS, s.ADJ_RESIDUAL, s.ADJ_FACTOR)):
            r = fields.get(history)
            if r is not None:
                fields.setdefault(its, len(r))
                fields.setdefault(res, r[-1] if len(r) else None)
                fields.setdefault(factor, convergence_factor(r))
        self._append_row(s.MGRIT, fields)

    def log_timing(self, iteration: int, compute: Sequence[float],
                   communication: Sequence[float], waiting: Sequence[float]) -> None:
        """Append the seconds each rank spent computing, communicating and waiting."""
        sizes = {len(compute), len(communication), len(waiting)}
        if len(sizes) != 1 or 0 in sizes:
            raise ValueError("timing lists must be non-empty and of equal length: "
                             f"compute {len(compute)}, communication {len(communication)}, "
                             f"waiting {len(waiting)}")
        ranks = self._grid[s.WORLD_SIZE]
        if ranks is not None and len(compute) != ranks:
            raise ValueError(f"timing: got {len(compute)} ranks, the run has {ranks}")
        if self._skip_timing:
            return
        self._append_row(s.TIMING, {s.ITERATION: iteration, **self._grid, s.COMPUTE: compute,
                                    s.COMMUNICATION: communication, s.WAITING: waiting})

    def set_attr(self, name: str, value) -> None:
        """Set one root attribute (a name of schema.ROOT_ATTRS) and flush."""
        _check_name(s.ROOT, name)
        value = _attr_value(name, value)
        if self.failure is None:
            self._require_open()
            self._guarded(lambda: self._file.attrs.__setitem__(name, value))

    def close(self, status: str = s.COMPLETED, error: str | None = None) -> None:
        """Record the final `status` (and `error`), then close; later calls do nothing.
        Raises `failure` where the file cannot take them (it is ended all the same)."""
        if self._closed:
            return
        if status not in s.FINAL_STATUSES:
            raise ValueError(f"status={status!r}: {one_of(s.FINAL_STATUSES)}")
        if self.failure is not None:         # rows of the last iteration came from the reserve
            self._fail_safely()
            return
        if not self._end({**({} if error is None else {s.ERROR: str(error)}),
                          s.STATUS: status}):
            raise self.failure

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            self.close(*_ending(exc))
        except s.MetricsFileError:
            if exc is None:        # else the run's own error is the one to report
                raise
        return False

    # -- internals -------------------------------------------------------------------------
    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.path}: metrics file already closed")

    def _guarded(self, write, iteration: int | None = None) -> None:
        """Run `write` and flush; when the disk is (nearly) full, record the failure first
        (a row of `iteration` is still written: see the class docstring); when the write
        fails, record that and close the file with status `failed`."""
        try:
            free = free_bytes(self.path.parent)
            if free < RESERVE_BYTES and self.failure is None:
                self.failure = s.MetricsFileError(
                    f"{self.path}: cannot write (only {free} bytes left free on its file "
                    f"system; lptrain stops writing below {RESERVE_BYTES})")
                self._reserve_for = iteration
            write()
            self._file.flush()
        except (OSError, RuntimeError) as exc:
            self.failure = self._cannot_write(exc)
            self.rows_lost = True
            self._fail_safely()

    def _fail_safely(self) -> None:
        """Store status `failed` and close (see `_end`)."""
        self._end({s.ERROR: str(self.failure), s.STATUS: s.FAILED})

    def _end(self, attrs: dict) -> bool:
        """Store the root attributes `attrs` and close: True; where the file cannot be
        written, False, with `failure` saying why (kept if set), the file ended without
        writing (`h5_faults.discard`: a close now would fail and leave HDF5 to crash)."""
        self._closed = True
        fd = descriptor(self._file)
        try:
            for name, value in attrs.items():
                self._file.attrs[name] = value
            self._file.flush()
        except (OSError, RuntimeError) as exc:
            self.failure = self.failure or self._cannot_write(exc)
            discard(self._file, fd)
            return False
        self._file.close()
        return True

    def _cannot_write(self, exc: BaseException) -> s.MetricsFileError:
        """The writer's failure for a write of the file that raised `exc`."""
        return s.MetricsFileError(f"{self.path}: cannot write ({write_failure(exc)})")

    def _append_row(self, group: str, fields: dict) -> None:
        for name in fields:
            _check_name(group, name)
        if fields.get(s.ITERATION) is None:
            raise KeyError(f"{group}/{s.ITERATION} is required")
        if self._closed and self.failure is not None:
            return
        self._require_open()
        if self.failure is not None and fields[s.ITERATION] != self._reserve_for:
            self._fail_safely()          # the iteration written from the reserve is over
            return
        self._guarded(lambda: self._write_row(group, fields), fields[s.ITERATION])

    def _write_row(self, group: str, fields: dict) -> None:
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = self._file.require_group(group)
        # one dataset at a time (resize, then write), `iteration` last: a kill in between
        # leaves datasets of unequal length or an iteration still at its fill value, and
        # the reader drops such a row
        names = [n for n in s.FIELDS[group] if n != s.ITERATION] + [s.ITERATION]
        for name in names:
            field = s.FIELDS[group][name]
            value = fields.get(name)
            if name in s.HISTORIES:
                self._columns.append_row(g, name, value, append_history)
            elif name in s.PER_RANK:
                self._columns.append_row(g, name, value, append_per_rank)
            else:
                _append_scalar(self._columns.get(g, name, field.dtype, s.FILL[field.dtype]),
                               field.dtype, value)
        if group not in self._labelled:
            label_units(g, s.FIELDS[group])
            self._labelled.add(group)


def label_units(g, fields: dict) -> None:
    """Each dataset of `g` whose field has a unit gets it as its `units` attribute (what
    h5dump, HDFView and xarray show), once per group and start of the writer."""
    for name, field in fields.items():
        if field.unit and name in g and g[name].attrs.get(s.UNITS) != field.unit:
            g[name].attrs[s.UNITS] = field.unit


class NullWriter:
    """Stand-in for MetricsWriter on ranks other than 0: every call does nothing."""

    path = None
    failure = None

    def earlier(self, group: str, name: str) -> list:
        return []

    def log_train(self, **fields) -> None:
        pass

    def log_validation(self, iteration: int, loss: float, accuracy: float) -> None:
        pass

    def log_mgrit(self, **fields) -> None:
        pass

    def log_timing(self, iteration, compute, communication, waiting) -> None:
        pass

    def set_attr(self, name: str, value) -> None:
        pass

    def close(self, status: str = s.COMPLETED, error: str | None = None) -> None:
        pass

    def __enter__(self) -> NullWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        return False


def _ending(exc) -> tuple[str, str | None]:
    """(status, error) a run that ends with exception `exc` (None: none) records."""
    if exc is None:
        return s.COMPLETED, None
    if isinstance(exc, Interrupted):     # lptrain's signals never raise KeyboardInterrupt:
        return s.INTERRUPTED, str(exc)   # one comes from a user's code, a failure
    if isinstance(exc, DivergedError):
        return s.DIVERGED, str(exc)
    text = str(exc)
    return s.FAILED, f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def open_writer(path: str | Path, attrs: dict, enabled: bool,
                resume_after: int | None = None) -> MetricsWriter | NullWriter:
    """A MetricsWriter where `enabled` (rank 0), a NullWriter elsewhere; with
    `resume_after` the existing file is continued after that iteration."""
    if not enabled:
        return NullWriter()
    if resume_after is None:
        return MetricsWriter(path, attrs)
    return MetricsWriter.reopen(path, resume_after, attrs)


def _grid_of(attrs: dict) -> dict:
    """The timing/ grid columns of a run started with root attributes `attrs`."""
    return {name: attrs.get(name) for name in s.GRID_COLUMNS}


# -- dataset helpers ----------------------------------------------------------------------
def _check_name(group: str, name: str) -> None:
    if name not in s.FIELDS[group]:
        where = "root attribute" if group == s.ROOT else f"field of {group}/"
        raise KeyError(f"{name!r} is not a {where}; known: {', '.join(s.FIELDS[group])}")


def _attr_value(name: str, value):
    if value is None:
        raise TypeError(f"attribute {name!r}: None cannot be stored")
    if s.FIELDS[s.ROOT][name].dtype == s.INT:
        return int(value)
    if s.FIELDS[s.ROOT][name].dtype == s.FLOAT:
        return float(value)
    return str(value)


def _create(path: Path) -> h5py.File:
    if not path.parent.is_dir():
        raise s.MetricsFileError(f"{path}: cannot create metrics file, "
                                 f"directory {path.parent} does not exist")
    free = free_bytes(path.parent)
    if free < RESERVE_BYTES:
        raise s.MetricsFileError(f"{path}: cannot create metrics file, only {free} bytes "
                                 f"free on its file system (lptrain needs {RESERVE_BYTES})")
    if path.is_file():     # never truncate an earlier run's file
        raise s.MetricsFileError(f"{path}: exists (an earlier run's metrics); lptrain "
                                 f"only appends to it through resume=")
    try:
        # no HDF5 file lock: read_metrics opens the live file unlocked, and HDF5 refuses
        # a second open in this process whose locking flag differs; "w-" never truncates
        return h5py.File(path, "w-", locking=False)
    except OSError as exc:
        raise s.MetricsFileError(f"{path}: cannot create metrics file ({exc})") from None


def _append_scalar(column, dtype: str, value) -> None:
    """One value (None: the fill value) appended to a scalar column (columns.py)."""
    if value is None:
        value = s.FILL[dtype]
    column.append(int(value) if dtype == s.INT else float(value))
