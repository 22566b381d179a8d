"""`lptrain resume=DIR [key=value ...]`: the command a resume runs, read on rank 0 before
Hydra. A run's directory gives its saved overrides, the new values a resume may give
(app.RESUME_KEYS) and DIR as the run directory; a stopped sweep's directory gives the
sweep's own command again (sweeps.py). Anything else given with resume= is refused.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from lptrain.command_args import multirun, one_value_each, value
from lptrain.rundir import (SWEEP_FILE, carried_hydra, dir_override, dir_value, is_sweep,
                            not_resumable, saved_hydra, saved_overrides)
from lptrain.sweeps import SweepJobs, install_job_dirs, job_number, sweep_command


class Resumed(NamedTuple):
    """A command as `resume_args` read it: its arguments for Hydra, the run (or sweep)
    directory it resumes (None: no resume=), and a resumed sweep's jobs as they were."""

    args: list[str]
    run_dir: Path | None = None
    sweep: SweepJobs | None = None


def resume_args(args: list[str]) -> Resumed:
    """`resume=DIR [key=value ...]`: the run's saved overrides, the allowed new ones
    (app.RESUME_KEYS), and DIR as the run directory; a sweep's DIR: the sweep's own
    command (sweeps.sweep_command) and its jobs."""
    given = value(args, "resume")
    if given is None:
        return Resumed(args)
    given = dir_value(given)
    from lptrain.app import RESUME_KEYS
    from lptrain.errors import ConfigError, InputFileError
    from lptrain.train.checkpoint import CHECKPOINT_FILE
    twice = [a for a in args if a.startswith("resume=")]
    if len(twice) > 1:       # the second was dropped without a word
        raise ConfigError(f"{' '.join(twice)}: resume= takes one run or sweep directory")
    rest = [a for a in args if not a.startswith("resume=")]
    if multirun(rest):
        word = sweep_switch(rest)
        raise ConfigError(f"{word}: resume= carries on a sweep by itself when given the "
                          f"sweep's directory; drop {word}")
    bad = [a for a in rest if a.split("=", 1)[0] not in RESUME_KEYS]
    if bad:
        raise ConfigError(f"{bad[0]}: with resume= only {', '.join(RESUME_KEYS)} can be "
                          f"given (the run keeps its configuration)")
    one_value_each(rest)
    run_dir = Path(given)
    if is_sweep(run_dir):         # a multirun's directory: carry on the whole sweep
        command, swept = sweep_command(run_dir, rest)
        jobs = SweepJobs(run_dir, [k for k in RESUME_KEYS if k not in swept])
        install_job_dirs(run_dir)
        return Resumed(command, run_dir, jobs)
    saved = run_dir / ".hydra" / "overrides.yaml"
    held = sorted(p.parent.parent for p in run_dir.glob("*/.hydra/overrides.yaml"))
    if not saved.is_file() and held:
        raise InputFileError(f"resume={given}: {_holds_runs(held)}")
    if not (run_dir / CHECKPOINT_FILE).is_file() or not saved.is_file():
        raise InputFileError(f"resume={given}: {not_resumable(run_dir)}")
    given_keys = {a.split("=", 1)[0] for a in rest}
    kept = [a for a in saved_overrides(saved) if a.split("=", 1)[0] not in given_keys]
    num = job_number(run_dir)      # a sweep's job resumed alone stays that job
    job = [] if num is None else [f"hydra.job.num={num}"]
    # its own config directory and primary config, hydra.job.chdir ... as it ran
    carried = carried_hydra(saved_hydra(run_dir))
    return Resumed([*carried, *kept, *rest, *job, dir_override("hydra.run.dir", run_dir)],
                   run_dir)


def sweep_switch(args: list[str]) -> str:
    """The argument, as typed, that asks for a sweep (-m, --multirun, hydra.mode=...)."""
    return next(a for a in args if multirun([a]))


def _holds_runs(held: list[Path]) -> str:
    """What a directory holding runs (not one itself) is, for a refused resume: a
    sampler's sweep (its jobs have numbers) or a folder of runs (outputs/DATE)."""
    jobs = sorted((num, d) for d in held if (num := job_number(d)) is not None)
    if jobs:
        return (f"a sweep whose sweeper saved no {SWEEP_FILE} (only the basic sweeper's "
                f"can be resumed as a whole); resume its jobs one by one "
                f"(resume={jobs[0][1]} ...)")
    more = f" and {len(held) - 1} more" if len(held) > 1 else ""
    return f"not a run's directory; it holds runs: resume one of them (resume={held[0]}{more})"
