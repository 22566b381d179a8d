"""Optional TensorBoard events beside metrics.h5 (`logger=tensorboard`, rank 0).

`Scalars` wraps the run's metrics writer: every call goes on to it unchanged, and the
scalar fields of train/, validation/ and mgrit/ are also written as TensorBoard scalars
`<group>/<field>` at step `iteration`. When the run ends (also when it fails) the run's
configuration goes to TensorBoard's HParams dashboard with its final numbers (`final/*`,
`FINAL`). metrics.h5 stays the complete record; histories and per-rank timings are not
repeated here.

Where: `<run dir>/tensorboard/` for a single run. A job of a Hydra multirun (its sweep
directory holds multirun.yaml) writes to `<sweep dir>/tensorboard/<name>/` instead, the
name being the overrides that job varied (`optimizer.lr=0.5,seed=1`), so that
`tensorboard --logdir <sweep dir>/tensorboard` shows each job by what it varied.
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
import os
from numbers import Real
from pathlib import Path

import numpy as np
import yaml

from lptrain.errors import DivergedError, MissingPackageError, install_hint
from lptrain.metrics import schema as s
from lptrain.metrics.quantities import iteration_time
from lptrain.metrics.reader import interpolated

LOGGERS = ("none", "tensorboard")
DIR_NAME = "tensorboard"
OWNER_FILE = "lptrain-run"     # in a run's event directory: the run directory writing there
HPARAMS_FILE = "lptrain-hparams"   # there: the event files of the HParams written last
MAX_NAME = 200                 # characters of a run name taken from overrides
_HISTORIES = {s.FWD_ITERATIONS: s.FWD_HISTORY, s.ADJ_ITERATIONS: s.ADJ_HISTORY}
# the HParams dashboard's metrics: tag -> what it is
FINAL = {
    "final/objective": "objective J at the last iteration",
    "final/loss": "training loss at the last iteration",
    "final/accuracy": "training accuracy at the last iteration",
    "final/val_loss": "validation loss at the last validation",
    "final/val_accuracy": "validation accuracy at the last validation",
    "final/best_val_accuracy": "best validation accuracy",
    "final/iterations": "optimizer iterations done",
    "final/wall_time": "seconds from the start of training to the last iteration",
    "final/iteration_time": "iteration time [s] (metrics/quantities.py)",
    "final/fwd_iterations": "mean forward MGRIT iterations per solve",
    "final/adj_iterations": "mean adjoint MGRIT iterations per solve",
}


def check_available(logger: str) -> None:
    """MissingPackageError unless the packages `logger` needs are installed (call on every
    rank)."""
    if logger == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
        raise MissingPackageError(f"logger=tensorboard: the tensorboard package is not "
                                  f"installed; {install_hint('tensorboard')}")


def hparams(attrs: dict) -> dict:
    """The HParams of a run with metrics.h5 root attributes `attrs`: every key of its
    configuration ('optimizer.lr'), its grid and MGRIT levels, as numbers, booleans or
    strings."""
    config = yaml.safe_load(attrs.get(s.CONFIG) or "") or {}
    flat = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            elif isinstance(value, (bool, int, float, str)):
                flat[f"{prefix}{key}"] = value
            else:    # None as YAML spells it, lists as text
                flat[f"{prefix}{key}"] = "null" if value is None else str(value)
    walk(config, "")
    for name in (s.WORLD_SIZE, s.LAYER_RANKS, s.DATA_RANKS):
        if attrs.get(name) is not None:
            flat[name] = int(attrs[name])
    if attrs.get(s.MGRIT_LEVELS) is not None:      # the hierarchy the options gave
        flat[s.MGRIT_LEVELS] = str(attrs[s.MGRIT_LEVELS])
    return flat


def run_name(job_overrides: list[str], sweep_overrides: list[str]) -> str:
    """The overrides a job varied (its own, less those every job of the sweep was given
    and interpolations such as `seed=${hydra:job.num}`), sorted and comma-joined, '/'
    replaced by '_' ('' when it varied none)."""
    given = set(sweep_overrides)
    name = ",".join(sorted(o for o in job_overrides
                           if o not in given and not interpolated(o.partition("=")[2])))
    return name.replace(os.sep, "_")[:MAX_NAME]


def log_dir(run_dir: Path) -> Path:
    """Where the events of the run in `run_dir` go (see the module docstring); a
    directory another job's events already claim gets the job directory's name added."""
    run_dir = Path(run_dir)
    sweep = run_dir.parent
    overrides = _read_list(run_dir / ".hydra" / "overrides.yaml")
    multirun = _read_yaml(sweep / "multirun.yaml")
    if overrides is None or multirun is None:
        return run_dir / DIR_NAME
    task = (((multirun.get("hydra") or {}).get("overrides") or {}).get("task")) or []
    directory = sweep / DIR_NAME / (run_name(overrides, task) or run_dir.name)
    owner = directory / OWNER_FILE
    mine = str(run_dir.resolve())
    if owner.is_file() and owner.read_text().strip() != mine:
        directory = directory.with_name(f"{directory.name} ({run_dir.name})")
    return directory


class Scalars:
    """The metrics writer `inner`, with TensorBoard events added (see the module doc).

    `attrs` are the run's metrics.h5 root attributes (its HParams); `resume_after`, the
    iteration a resumed run continues after: events past it from the earlier start are
    dropped, as metrics.h5 drops its rows."""

    def __init__(self, inner, directory: Path, attrs: dict | None = None,
                 resume_after: int | None = None, run_dir: Path | None = None):
        from torch.utils.tensorboard import SummaryWriter
        self.inner, self.directory = inner, Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        if run_dir is not None:
            (self.directory / OWNER_FILE).write_text(f"{Path(run_dir).resolve()}\n")
        purge = None if resume_after is None else resume_after + 1
        if resume_after is not None:       # an ended run carried on: its HParams end anew
            _drop_hparams(self.directory)
        self.tb = SummaryWriter(log_dir=str(self.directory), flush_secs=10, purge_step=purge)
        self.attrs = attrs or {}
        # the final numbers are the whole run's: a resumed one's begin with its rows
        # before the stop (metrics.h5's, up to resume_after)
        earlier = inner.earlier          # MetricsWriter's, or NullWriter's: nothing
        self._step_times: list[float] = earlier(s.TRAIN, s.STEP_TIME)
        self._solves: dict[str, list[int]] = {
            name: [int(c) for c in earlier(s.MGRIT, name) if c >= 0]
            for name in (s.FWD_ITERATIONS, s.ADJ_ITERATIONS)}
        best = [a for a in earlier(s.VALIDATION, s.ACCURACY) if math.isfinite(a)]
        self._last: dict = {"final/best_val_accuracy": max(best)} if best else {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _scalars(self, group: str, fields: dict) -> None:
        step = int(fields[s.ITERATION])
        schema = s.FIELDS.get(group, {})
        for name, value in fields.items():
            if name != s.ITERATION and isinstance(value, Real) and math.isfinite(value) \
                    and not _left_out(schema.get(name), value):
                self.tb.add_scalar(f"{group}/{name}", float(value), step)

    def log_train(self, **fields) -> None:
        self.inner.log_train(**fields)
        self._scalars(s.TRAIN, fields)
        for name in (s.OBJECTIVE, s.LOSS, s.ACCURACY, s.WALL_TIME):
            if fields.get(name) is not None:
                self._last[f"final/{name}"] = float(fields[name])
        self._last["final/iterations"] = int(fields[s.ITERATION])
        if fields.get(s.STEP_TIME) is not None:
            self._step_times.append(float(fields[s.STEP_TIME]))

    def log_validation(self, iteration: int, loss: float, accuracy: float) -> None:
        self.inner.log_validation(iteration, loss, accuracy)
        self._scalars(s.VALIDATION, {s.ITERATION: iteration, s.LOSS: loss,
                                     s.ACCURACY: accuracy})
        best = self._last.get("final/best_val_accuracy", -math.inf)
        self._last.update({"final/val_loss": float(loss), "final/val_accuracy": float(accuracy),
                           "final/best_val_accuracy": max(best, float(accuracy))})

    def log_mgrit(self, **fields) -> None:
        self.inner.log_mgrit(**fields)
        self._scalars(s.MGRIT, fields)
        for name, history in _HISTORIES.items():
            count = fields.get(name)
            if count is None and fields.get(history) is not None:
                count = len(fields[history])        # as the writer counts them
            if count is not None and count >= 0:
                self._solves[name].append(int(count))

    def final(self) -> dict:
        """The run's final numbers so far: tag of FINAL -> value (those it has)."""
        out = dict(self._last)
        time = iteration_time(self._step_times)
        if time is not None:
            out["final/iteration_time"] = time
        for name, counts in self._solves.items():
            if counts:
                out[f"final/{name}"] = float(np.mean(counts))
        return out

    def close_scalars(self, ended: bool = True) -> None:
        """Write the HParams with the final numbers where the run `ended` (not stopped to
        be carried on: TensorBoard keeps a run's first HParams record, so a resumed run's
        would never show), then close the event file."""
        try:
            metrics = self.final()
            if ended and (self.attrs or metrics):
                before = set(_event_files(self.directory))
                # run_name '.': the run's own directory, not a timestamped one below it;
                # torch writes the record (and the final numbers) to event files of its own
                self.tb.add_hparams(hparams(self.attrs), metrics, run_name=".",
                                    global_step=metrics.get("final/iterations"))
                made = sorted(set(_event_files(self.directory)) - before)
                (self.directory / HPARAMS_FILE).write_text("".join(f"{n}\n" for n in made))
        finally:
            self.tb.close()


def _event_files(directory: Path) -> list[str]:
    return [p.name for p in directory.glob("events.out.tfevents.*")]


def _drop_hparams(directory: Path) -> None:
    """Remove the event files of the HParams an earlier start wrote when its run ended
    (HPARAMS_FILE names them): TensorBoard shows a run's first record, which would keep
    the earlier start's configuration and final numbers beside the resumed run's."""
    listed = directory / HPARAMS_FILE
    try:
        names = listed.read_text().split()
    except OSError:
        return                            # none written, or written by an older lptrain
    for name in names:
        if "/" not in name and name.startswith("events.out.tfevents."):
            (directory / name).unlink(missing_ok=True)
    listed.unlink(missing_ok=True)


def _left_out(field, value) -> bool:
    """Whether `value` is the fill of an integer column: a field this row has not (mgrit's
    plans, a cold solve's counts), not a number to plot (NaN, the float fill, is not
    finite)."""
    return field is not None and field.dtype == s.INT and value == s.FILL[s.INT]


@contextlib.contextmanager
def with_logger(writer, logger: str, run_dir: Path, enabled: bool, attrs: dict | None = None,
                resume_after: int | None = None):
    """`writer`, or a `Scalars` around it for logger=tensorboard on the writing rank."""
    if logger != "tensorboard" or not enabled:
        yield writer
        return
    scalars = Scalars(writer, log_dir(run_dir), attrs, resume_after, run_dir)
    ended = False
    try:
        yield scalars
        ended = True
    except DivergedError:                # an end; a stop or a failure is carried on
        ended = True
        raise
    finally:
        scalars.close_scalars(ended)


def _read_yaml(path: Path):
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def _read_list(path: Path) -> list[str] | None:
    value = _read_yaml(path)
    return [str(v) for v in value] if isinstance(value, list) else None
