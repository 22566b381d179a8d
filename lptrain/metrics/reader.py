"""Load a metrics.h5 file, complete or not, into plain numpy arrays."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import h5py
import numpy as np

from lptrain.errors import counted
from lptrain.metrics import schema as s


@dataclass
class RunMetrics:
    """Everything one metrics.h5 holds: root attributes and one dict of arrays per group.

    A group the run never wrote is an empty dict. Within a group all arrays have the same
    number of rows (see `read_metrics`).
    """

    path: Path
    attrs: dict
    train: dict[str, np.ndarray] = field(default_factory=dict)
    validation: dict[str, np.ndarray] = field(default_factory=dict)
    mgrit: dict[str, np.ndarray] = field(default_factory=dict)
    timing: dict[str, np.ndarray] = field(default_factory=dict)

    def group(self, name: str) -> dict[str, np.ndarray]:
        """The arrays of group `name` (one of schema.GROUPS)."""
        if name not in s.GROUPS:
            raise KeyError(f"{name!r} is not a metrics group; known: {', '.join(s.GROUPS)}")
        return getattr(self, name)

    @property
    def status(self) -> str:
        return self.attrs.get(s.STATUS, "unknown")

    @property
    def mode(self) -> str:
        return self.attrs.get(s.MODE, "unknown")

    @property
    def n_iterations(self) -> int:
        """Rows of train/, i.e. optimizer iterations logged."""
        return len(self.train.get(s.ITERATION, ()))

    def __repr__(self) -> str:
        """One line: the file, how the run stands and the rows of each group (the arrays
        themselves filled screens)."""
        rows = ", ".join(f"{g} {counted(len(next(iter(getattr(self, g).values()), ())), 'row')}"
                         for g in s.GROUPS if getattr(self, g))
        return (f"RunMetrics({str(self.path)!r}, {self.mode}, {self.status}, "
                f"{rows or 'no rows'})")


_TRUNCATED = re.compile(r"truncated file: eof = (\d+).*stored_eof = (\d+)")


def _hdf5_reason(exc: Exception) -> str:
    """HDF5's reason in words: a file cut short says how much of it is there (HDF5's own
    text named its superblock's fields)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    cut = _TRUNCATED.search(text)
    if cut:
        return (f"not whole: {cut.group(1)} of its {cut.group(2)} bytes; a copy cut short, "
                f"or a disk that filled")
    return text


def read_metrics(path: str | Path) -> RunMetrics:
    """Read `path` (a metrics.h5 or a run's directory), also while a run is still writing
    it or after the run was killed.

    The file is opened read-only without HDF5 file locking, so a live writer does not
    block the reader. A row that a writer did not finish (it reached only some datasets,
    or its `iteration` is still the fill value -1) is dropped, so every group's arrays
    have the same length. Raises
    MetricsInputError when the file is missing, not HDF5, or not written by lptrain.
    """
    path = Path(path)
    if path.is_dir():                 # a run's directory: its file
        path = path / s.FILE_NAME
    if not path.is_file():
        raise s.MetricsInputError(f"{path}: no such metrics file")
    if not h5py.is_hdf5(path):       # a model.pt or checkpoint.pt given in its place, say
        raise s.MetricsInputError(f"{path}: not a metrics file (not HDF5); give a run's "
                                  f"directory or its {s.FILE_NAME}")
    try:
        with _opened(path) as f:
            attrs = {name: _plain(value) for name, value in f.attrs.items()}
            groups = {name: _read_group(f, name) for name in s.GROUPS}
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        raise s.MetricsInputError(f"{path}: unreadable metrics file "
                                  f"({_hdf5_reason(exc)})") from None
    if s.STATUS not in attrs:
        raise s.MetricsInputError(f"{path}: not an lptrain metrics file "
                                  f"(no {s.STATUS!r} attribute)")
    return RunMetrics(path=path, attrs=attrs, **groups)


def _opened(path: Path) -> h5py.File:
    """`path` open to read, without HDF5's file lock (a live writer must not block the
    reader); where this process has it open already with a lock (h5py's default, a
    notebook's `h5py.File(path)`, or `locking=True`), HDF5 refuses other locking flags:
    then with the flags it holds."""
    for locking in (False, None, True):      # ours, then the kinds a caller may hold
        try:
            return h5py.File(path, "r", locking=locking)
        except OSError as exc:
            if "flag values don't match" not in str(exc) or locking is True:
                raise
    raise AssertionError("unreachable")


def run_status(path: str | Path) -> tuple[str, str]:
    """(status, error) of the metrics file `path`, without reading its rows ('' for
    what is absent or unreadable)."""
    return tuple(str(v or "") for v in root_attrs(path, s.STATUS, s.ERROR))


def root_attr(path: str | Path, name: str):
    """The root attribute `name` of the metrics file `path` as a plain value (None where
    absent or unreadable), without reading its rows."""
    return root_attrs(path, name)[0]


def root_attrs(path: str | Path, *names: str) -> tuple:
    """The root attributes `names` of the metrics file `path` as plain values, read in
    one opening (None for each where absent or unreadable)."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            return tuple(_plain(f.attrs[n]) if n in f.attrs else None for n in names)
    except (OSError, RuntimeError, ValueError):
        return (None,) * len(names)


def last_iteration(path: str | Path) -> int:
    """The iteration of the last training row of the metrics file `path` (0 for none, or
    what is absent or unreadable), without reading the other rows."""
    try:
        with h5py.File(path, "r", locking=False) as f:
            column = f.get(f"{s.TRAIN}/{s.ITERATION}")
            return int(column[-1]) if isinstance(column, h5py.Dataset) and len(column) else 0
    except (OSError, RuntimeError, ValueError):
        return 0


def _read_group(f: h5py.File, name: str) -> dict[str, np.ndarray]:
    g = f.get(name)
    if not isinstance(g, h5py.Group):
        return {}
    arrays = {key: item[()] for key, item in g.items()
              if isinstance(item, h5py.Dataset) and item.ndim >= 1}
    if not arrays:
        return {}
    rows = min(a.shape[0] for a in arrays.values())
    iterations = arrays.get(s.ITERATION)
    while rows and iterations is not None and iterations[rows - 1] == s.FILL[s.INT]:
        rows -= 1  # the writer stores `iteration` last: this row was never finished
    return {key: a[:rows] for key, a in arrays.items()}


def _plain(value):
    """An HDF5 attribute as a Python str/int/float."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        return value.item()
    return value


def find_metrics(paths: Sequence[Path]) -> list[Path]:
    """Every metrics file named by `paths`, in order, without duplicates; those found
    below a directory in the order of their paths with numbers as numbers (a multirun's
    job 2 before job 10)."""
    found: list[Path] = []
    seen: set[Path] = set()
    for path in paths:
        if path.is_file():
            hits = [path]
        elif path.is_dir():
            hits = sorted(_below(path), key=_in_job_order)
            if not hits:
                raise s.MetricsFileError(f"{path}: no {s.FILE_NAME} in this directory "
                                         "or below")
        else:
            raise s.MetricsFileError(f"{path}: no such file or directory")
        for hit in hits:
            if hit.resolve() not in seen:
                seen.add(hit.resolve())
                found.append(hit)
    return found


def runs_without_metrics(paths: Sequence[Path]) -> list[Path]:
    """The run directories among and below the directories `paths` (those holding the
    `.hydra` folder a run of the lptrain command writes first) that hold no metrics
    file: a sweep's job refused or stopped before its first iteration."""
    found = []
    for path in (p for p in paths if p.is_dir()):
        for directory, subdirs, files in os.walk(path, followlinks=True):
            subdirs[:] = sorted(d for d in subdirs if d != ".hydra")
            if os.path.isdir(os.path.join(directory, ".hydra")) and s.FILE_NAME not in files:
                found.append(Path(directory))
    return sorted(dict.fromkeys(found), key=lambda d: _in_job_order(d / s.FILE_NAME))


def _below(root: Path) -> list[Path]:
    """The metrics files in `root` and below, through symbolic links to directories too
    (runs gathered for a comparison as links), each directory once (no link cycles),
    under its real path where the walk meets one (directories before links)."""
    hits, visited = [], set()
    for directory, subdirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(directory)
        if real in visited:
            subdirs[:] = []
            continue
        visited.add(real)
        subdirs.sort(key=lambda d: (os.path.islink(os.path.join(directory, d)), d))
        if s.FILE_NAME in files:
            hits.append(Path(directory) / s.FILE_NAME)
    return hits


_NUMBER = re.compile(r"(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def _natural(path: Path) -> list:
    """A sort key of `path` that orders the numbers in its parts by value (lr=0.05
    before lr=0.1, job 2 before job 10)."""
    return [(0, float(piece), "") if _NUMBER.fullmatch(piece) else (1, 0, piece)
            for part in path.parts for piece in _NUMBER.split(part) if piece]


def job_number(job_dir: Path) -> int | None:
    """A Hydra job's number, from its record `.hydra/hydra.yaml` (None: none there)."""
    import yaml
    try:
        record = yaml.safe_load((Path(job_dir) / ".hydra" / "hydra.yaml").read_text())
        return int(record["hydra"]["job"]["num"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return None


def interpolated(value: str) -> bool:
    """Whether an override's typed value is an interpolation (`seed=${hydra:job.num}`):
    the same text in every job of a sweep, so it sets no job apart (the value each job
    ran with is in its config). A sweep's job stores it escaped (`$\\{hydra\\:job.num\\}`
    in .hydra/overrides.yaml), multirun.yaml as typed."""
    return "${" in value or "$\\{" in value


def _in_job_order(hit: Path) -> list:
    """_natural, but a multirun's job (its directory named by overrides, say) by its
    job number within its sweep's directory."""
    job = hit.parent
    num = job_number(job) if (job / ".hydra").is_dir() else None
    if num is None and job.name.isdigit():    # a job resumed alone: its record has none
        num = int(job.name)
    sweep = next((d for d in job.parents if (d / "multirun.yaml").is_file()), None)
    if num is None or sweep is None:
        return _natural(hit)
    return [*_natural(sweep), (-1, num, "")]
