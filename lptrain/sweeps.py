"""`lptrain resume=SWEEP_DIR`: carry on a multirun that was stopped.

A sweep stopped by a signal (or a failure) has run some of its jobs to the end, stopped
one, and not started the rest. Resuming it runs the sweep's own command again (the task
and Hydra overrides Hydra saved in SWEEP_DIR/multirun.yaml, with the new values of the
keys a resume may change) into the same directory, and each job does what its directory
calls for (`JobPlan`): a job whose run ended is kept and reports its recorded objective,
a stopped one is resumed from its checkpoint, one never started runs. A new value of a
key the sweep swept is refused (it would stand for every job). A job whose directory
holds a run of other overrides (a sweeper that samples differently this time, a run
copied there) is refused, and its files are put back.

Rank 0 alone uses this module (cli.py); the other ranks run the jobs it hands them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from lptrain.config import override_key
from lptrain.errors import ConfigError, InputFileError
from lptrain.metrics.reader import job_number
from lptrain.rundir import (SWEEP_FILE, WRITES_AT_THE_END, SavedFiles, check_overrides,
                            checkpoint_gone, dir_override, remove_new_files,
                            saved_overrides, source_flags, stopped_how)

_SET_BY_RESUME = ("hydra.sweep.dir", "hydra.mode")   # given anew by the resumed command
_SUBDIR = "hydra.sweep.subdir"
RESOLVER = "lptrain_resumed_subdir"    # job number -> its directory (`install_job_dirs`)


def sweep_command(directory: Path, given: list[str]) -> tuple[list[str], dict[str, str]]:
    """The command line that resumes the sweep in `directory`: multirun, its saved Hydra
    and task overrides, `given` (already checked against app.RESUME_KEYS) in place of
    the saved values of their keys, and the directory itself; with the keys the sweep
    swept (`swept_keys` of its task overrides, which the command keeps). ConfigError
    where `given` sets a key the sweep swept: its one value would replace the sweep's
    values and make another sweep of fewer jobs, each kept job standing for another's."""
    import yaml
    path = Path(directory) / SWEEP_FILE
    try:
        saved = yaml.safe_load(path.read_text())
        task, hydra = saved["hydra"]["overrides"]["task"], saved["hydra"]["overrides"]["hydra"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise InputFileError(f"{path}: unreadable ({type(exc).__name__}: {exc}); only "
                             f"sweeps of this lptrain version can be resumed") from None
    for overrides in (task, hydra):
        if not isinstance(overrides, list) or not all(isinstance(a, str) for a in overrides):
            raise InputFileError(f"{path}: its overrides are not lists of strings; only "
                                 f"sweeps of this lptrain version can be resumed")
        check_overrides(path, overrides)
    swept = swept_keys(task)
    for arg in given:
        key = override_key(arg)
        if key in swept:
            raise ConfigError(f"{arg}: the sweep in {directory} sweeps {swept[key]} (each "
                              f"job keeps its value); resume it without {key}=")
    keys = {override_key(a) for a in given}
    kept_hydra = [_pinned(a) if a.startswith(_SUBDIR + "=") else a for a in hydra
                  if a.split("=", 1)[0] not in _SET_BY_RESUME]
    kept_task = [a for a in task if override_key(a) not in keys]
    flags = source_flags(saved["hydra"])      # its own config directory, primary config
    command = ["-m", *flags, *kept_hydra, *kept_task, *given,
               dir_override("hydra.sweep.dir", directory)]
    return command, swept


def swept_keys(overrides: Iterable[str]) -> dict[str, str]:
    """Key -> override, for each of `overrides` (parsed by Hydra) that sweeps values:
    `train.iterations=20,400`, `range(...)`, `choice(...)`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    parser = OverridesParser.create()
    return {override_key(a): a for a in overrides
            if parser.parse_override(a).is_sweep_override()}


def _pinned(override: str) -> str:
    """`hydra.sweep.subdir=PATTERN` for the resumed sweep: a pattern that names job
    directories by their overrides (`${hydra.job.override_dirname}`) would name them
    anew once a resume changes train.iterations, and the jobs would start over beside
    their earlier runs. Each job that started keeps its directory (by job number,
    through the resolver `install_job_dirs` registers); one never started is named by
    PATTERN. A pattern with quotes or backslashes is left as it is."""
    pattern = override.split("=", 1)[1]
    ours = re.fullmatch(r"\"?\$\{" + RESOLVER + r":\$\{hydra\.job\.num\},'(.*)'\}\"?", pattern)
    if ours:                        # a sweep resumed before
        pattern = ours[1]
    if any(c in pattern for c in "'\"\\"):
        return override
    return f"{_SUBDIR}=\"${{{RESOLVER}:${{hydra.job.num}},'{pattern}'}}\""


def job_dirs(directory: Path) -> dict[int, str]:
    """Job number -> its directory, relative to the sweep's, for every job that started
    (Hydra's record `.hydra/hydra.yaml`); where two claim a number, the later one."""
    found = {}
    records = sorted(Path(directory).rglob(".hydra/hydra.yaml"), key=lambda p: p.stat().st_mtime)
    for record in records:
        num = job_number(record.parent.parent)
        if num is not None:
            found[num] = str(record.parent.parent.relative_to(directory))
    return found


def install_job_dirs(directory: Path) -> None:
    """Register the resolver `_pinned` names, with the sweep's job directories."""
    from omegaconf import OmegaConf
    dirs = job_dirs(directory)
    OmegaConf.register_new_resolver(RESOLVER, lambda num, pattern: dirs.get(int(num), pattern),
                                    replace=True)


@dataclass(frozen=True)
class JobPlan:
    """What a job of a resumed sweep does: run ("fresh"), continue its checkpoint
    ("resume"), or nothing ("kept": its run ended earlier; `objective` is its last)."""

    action: str
    iterations: int = 0              # done before
    status: str = ""                 # the recorded run's status
    objective: float | None = None   # a kept run's last objective (None: diverged)

    @property
    def failed(self) -> bool:
        """A kept job whose run failed for good (diverged): the resumed sweep exits as
        the sweep did, with the failure's status."""
        from lptrain.metrics import schema as ms
        return self.action == "kept" and self.status == ms.DIVERGED

    def describe(self, hydra_cfg) -> str:
        """What a kept job says (rank 0, once): which job, how its run ended."""
        return (f"job {hydra_cfg.job.num} ({hydra_cfg.runtime.output_dir}) kept: "
                f"{self.status} earlier after {self.iterations} iterations"
                + (f", objective {self.objective:.6g}" if self.objective is not None else ""))


class SweepJobs:
    """The job directories of a sweep as they were before Hydra rewrites each job's
    `.hydra/` (its saved configuration), to plan each job and to put those files back
    where a job is refused. `may_change`: the keys this resume gives anew that the sweep
    did not sweep (app.RESUME_KEYS less swept_keys), whose values a job's run may have
    had otherwise."""

    def __init__(self, directory: Path, may_change: Iterable[str] = ()):
        # absolute, as Hydra names a job's directory (the command may give it relative)
        self.directory = Path(directory).resolve()
        self.may_change = frozenset(may_change)
        self.saved = {p.parent: SavedFiles(p) for p in self.directory.rglob(".hydra")
                      if p.is_dir()}

    def plan(self, run_dir: Path, iterations: int, overrides: list[str]) -> JobPlan:
        """The job in `run_dir` with its task `overrides`, asked for `iterations`;
        InputFileError (a refusal, as for a single run) where its files hold another
        job's run or allow neither a resume nor a fresh start."""
        from lptrain.metrics import schema as ms
        from lptrain.metrics.reader import read_metrics
        from lptrain.train.checkpoint import CHECKPOINT_FILE
        run_dir = Path(run_dir)
        metrics, checkpoint = run_dir / ms.FILE_NAME, run_dir / CHECKPOINT_FILE
        if not metrics.is_file():
            return JobPlan("fresh")
        self._check_overrides(run_dir, overrides)
        m = read_metrics(metrics)
        done = m.n_iterations
        ended = m.status in (ms.DIVERGED, ms.STALLED) or \
            (m.status == ms.COMPLETED and done >= iterations)
        if not ended and not checkpoint.is_file() and m.status in WRITES_AT_THE_END:
            raise InputFileError(f"{run_dir}: {checkpoint_gone(m.status, done)}, so this "
                                 f"job of the sweep cannot be resumed; move its "
                                 f"{ms.FILE_NAME} away to run it again")
        if not ended and not checkpoint.is_file():
            raise InputFileError(f"{run_dir}: this job of the sweep {stopped_how(m.status)} "
                                 f"after {done} iterations, before its first checkpoint, so "
                                 f"it cannot be resumed; move its {ms.FILE_NAME} away to run "
                                 f"it again")
        if not ended:
            return JobPlan("resume", done, m.status)
        objective = None
        if m.status != ms.DIVERGED and done:
            objective = float(m.attrs.get(ms.EPOCH_OBJECTIVE, m.train[ms.OBJECTIVE][-1]))
        return JobPlan("kept", done, m.status, objective)

    def _check_overrides(self, run_dir: Path, overrides: list[str]) -> None:
        """InputFileError unless the run in `run_dir` is this job's: the overrides its
        directory saved (before Hydra rewrote them for this job) are the job's, up to
        `may_change`."""
        path = run_dir.resolve() / ".hydra" / "overrides.yaml"
        saved = self.saved.get(run_dir.resolve())
        data = None if saved is None else saved.files.get(path)
        if data is None:
            raise InputFileError(f"{run_dir}: holds a run but no .hydra/overrides.yaml to "
                                 f"tell whose; move it away to run this job of the sweep")
        theirs = self._by_key(saved_overrides(path, data.decode(errors="replace")))
        ours = self._by_key(overrides)
        differ = [k for k in dict.fromkeys([*theirs, *ours]) if theirs.get(k) != ours.get(k)]
        if differ:
            raise InputFileError(f"{run_dir}: its run was {_shown(theirs, differ)} but this "
                                 f"job of the sweep is {_shown(ours, differ)} (a run of other "
                                 f"overrides); move the directory away to run the job there")

    def _by_key(self, overrides: list[str]) -> dict[str, str]:
        """Key -> override, less the keys that may change."""
        return {key: a for a in overrides
                if (key := override_key(a)) not in self.may_change}

    def ran(self, run_dir: Path) -> None:
        """A job ran in `run_dir`: its `.hydra/` as it left it is what a later job's
        refusal there puts back (the saved one was of before this resume)."""
        if (Path(run_dir) / ".hydra").is_dir():
            self.saved[Path(run_dir).resolve()] = SavedFiles(Path(run_dir) / ".hydra")

    def put_back(self, run_dir: Path) -> None:
        """The job's `.hydra/` files as they were, none where it had none (a refused job's
        next resume would read the ones Hydra wrote for it as its own); RunFileError if
        they cannot be."""
        saved = self.saved.get(Path(run_dir).resolve())
        if saved is not None:
            saved.restore()
        else:
            remove_new_files(Path(run_dir) / ".hydra")


class FreshSweep:
    """The folders a new sweep's jobs ran in, each `.hydra/` as its job left it. Hydra
    rewrites a job folder's `.hydra/` before the job starts, so a later job sent into a
    folder an earlier one ran in (a `hydra.sweep.subdir` that names no swept key) is
    refused there and the earlier job's files are put back: its run stays labelled as
    itself, for lptrain-report and a resume."""

    def __init__(self):
        self.ran: dict[Path, tuple[int, SavedFiles]] = {}

    def refusal(self, run_dir: Path, number: int) -> str | None:
        """Why job `number` cannot run in `run_dir` (None: it can); the earlier job's
        files put back (RunFileError if they cannot be)."""
        earlier = self.ran.get(Path(run_dir).resolve())
        if earlier is None:
            return None
        job, saved = earlier
        saved.restore()
        return (f"job {number}: {run_dir} holds the run of job {job} of this sweep "
                f"({_SUBDIR} gives both one folder); give each job its own, e.g. "
                f"{_SUBDIR}='${{hydra.job.num}}' (the default)")

    def record(self, run_dir: Path, number: int) -> None:
        """Job `number` ran in `run_dir`: where it left a run, its files are kept."""
        from lptrain.metrics.schema import FILE_NAME
        if (Path(run_dir) / FILE_NAME).is_file():
            self.ran[Path(run_dir).resolve()] = (number, SavedFiles(Path(run_dir) / ".hydra"))


def _shown(overrides: dict[str, str], keys: list[str]) -> str:
    """The overrides of `keys`, comma-separated, `no KEY` for one not given."""
    return ", ".join(overrides.get(k, f"no {k}") for k in keys)


@dataclass(frozen=True)
class JobResult:
    """A sweep job as the task ended it: Hydra's job number, its task overrides, its
    final objective (None: the job failed or was refused), and those of its overrides
    it did not read (config/inert.py: a serial job's mgrit.* settings)."""

    number: int
    overrides: tuple[str, ...]
    objective: float | None
    unread: tuple[str, ...] = ()


# group switches whose jobs train other problems: their objectives are not compared
PROBLEM_GROUPS = ("dataset", "experiment")


def unread(cfg, overrides: tuple[str, ...]) -> tuple[str, ...]:
    """The overrides a job of `cfg` does not read (config/inert.py's rules that need no
    built network); none where cfg is None or too foreign to judge."""
    from omegaconf.errors import OmegaConfBaseException

    from lptrain.config.inert import Built, reads
    if cfg is None:
        return ()
    try:
        return tuple(o for o in overrides if not reads(cfg, Built(None, None), override_key(o)))
    except (OmegaConfBaseException, AttributeError, TypeError, ValueError):
        return ()


def sweep_summary(directory, results: list[JobResult], report: str) -> str:
    """The line that closes a sweep: its jobs, how many finished, the lowest final
    objective with the job that reached it (by the overrides that tell the jobs apart),
    and the command that shows them all (`report`, as errors.report_command gives it)."""
    finished = [r for r in results if r.objective is not None]
    ranked = [r for r in finished if math.isfinite(r.objective)]
    text = (f"sweep of {len(results)} job{'s' * (len(results) != 1)} in {directory}: "
            f"{len(finished)} finished, {len(results) - len(finished)} failed")
    common = set.intersection(*(set(r.overrides) for r in results)) if results else set()
    problems = {o.split("=", 1)[0] for r in results for o in r.overrides
                if o not in common and o.split("=", 1)[0] in PROBLEM_GROUPS}
    if ranked and problems:     # a dataset's objective is no measure of another's
        text += f"; no lowest named: the jobs train other {' and '.join(sorted(problems))}s"
    elif ranked:
        best = min(ranked, key=lambda r: r.objective)
        apart = " ".join(o for o in best.overrides if o not in common and
                         o not in best.unread)
        text += f"; lowest final objective {best.objective:.6g} (#{best.number}" \
                f"{' ' + apart if apart else ''})"
    return text + f"; plots and a table of all: `{report}`"
