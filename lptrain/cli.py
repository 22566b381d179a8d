"""The `lptrain` command: MPI-safe Hydra entry point that calls app.run.

Only rank 0 runs Hydra: it checks the command, chooses and locks the run (or sweep)
directory, writes every file and runs the sweeper; the other ranks run each job it hands
them (lptrain/jobs.py). Every error ends the whole job with one line printed once.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
from pathlib import Path

from lptrain.errors import FAILED, REFUSED, LptrainError, RunFileError, resume_command
from lptrain.command_args import (check_dir_values, check_flags, check_hydra_keys,
                                  check_launcher, check_writable, checked_args, config_source,
                                  configured_args, directory_args, hydra_failure,
                                  hydra_raising, informational, launched_rank, multirun,
                                  overrides_first, value)
from lptrain.help_format import version_line
from lptrain.job_run import quiet_teardown as _quiet_teardown
from lptrain.job_run import run_job
from lptrain.jobs import END, Job, JobChannel
from lptrain.resume_args import resume_args, sweep_switch
from lptrain.rundir import (RunLock, SavedFiles, dir_value, is_sweep, refuse_earlier_run,
                            refuse_inside_live_run, remove_refused)
from lptrain.startup import abort_before_mpi, printed, started
from lptrain.stops import PROG, stop_before_job, stop_if_signalled
from lptrain.stops import say_error as _say

from lptrain.config import CONF_MODULE, check_command, override_key
log = logging.getLogger("lptrain")
_failures: list[int] = []   # exit status of each failed job
_jobs: list[int] = [0]      # jobs Hydra handed to the task
_stop: list = []          # the StopSignals main() installed (empty when called otherwise)
_resuming: list = []      # the run directory given with resume=
_sweep: list = []         # the SweepJobs of a sweep directory given with resume=
_fresh: list = []         # a new sweep's FreshSweep (rank 0)
_channel: list = []       # the JobChannel main() opened (empty when called otherwise)
_typed: list[str] = []    # the command's own arguments (rank 0)
_results: list = []       # a sweep's JobResult of each job the task ended (rank 0)
_source: list = []        # the command's config.source.ConfigSource (rank 0)


def _claim(directory: str, args: list[str], ranks: int) -> None:
    """Rank 0: lock the run (or sweep) directory for this process, refuse an earlier
    run's files unless resuming it (RunDirectoryBusy, RunFileError)."""
    key = "resume" if _resuming else "hydra.sweep.dir" if multirun(args) else "hydra.run.dir"
    lock = RunLock(directory, key).acquire()
    atexit.register(lock.release)
    if not _resuming:
        refuse_earlier_run(directory, key, ranks)


def _resume_args(args: list[str]) -> list[str]:
    """The command's arguments for Hydra (resume_args: those of `resume=DIR` in its
    place); the run (or sweep) it resumes kept for the rest of the command."""
    resumed = resume_args(args)
    if resumed.sweep is not None:
        _sweep.append(resumed.sweep)
    if resumed.run_dir is not None:
        _resuming.append(resumed.run_dir)
    return resumed.args


def quiet_logging_errors() -> None:
    """A log record that cannot be written (lptrain.log on a full disk) is dropped: the
    error is said in one line on the console, not after logging's 65-line report."""
    logging.raiseExceptions = False


def main(stop=None) -> None:
    """The command; `stop`: the StopSignals lptrain/entry.py installed before the imports."""
    if "--version" in sys.argv[1:]:      # before MPI and Hydra: Hydra's flag prints its own
        if launched_rank() == 0:         # under mpiexec: once
            printed(version_line() + "\n")
        return
    if any(a in ("-h", "--help") for a in sys.argv[1:]):    # instead of Hydra's stock page
        if launched_rank() == 0:
            from lptrain.config.reference import text
            printed(text())
        return
    from lptrain.train.stop import StopSignals      # torch-free: before the heavy imports
    _stop.append((stop or StopSignals()).install())   # a signal from here on stops cleanly
    quiet_logging_errors()
    try:
        comm = started()
    except Exception as exc:     # one rank alone (torch's import under a memory limit)
        if launched_rank(os.environ, None) is None:
            raise
        abort_before_mpi(exc)
    _stop[0].install()       # again: MPI's libraries (UCX) take SIGHUP for their debugging
    from lptrain.parallel.context import limit_threads, node_of
    limit_threads(node_of(comm))
    channel = JobChannel(comm)
    _channel.append(channel)
    stop_if_signalled(comm, _stop[0])
    if comm.Get_rank() != 0:
        status = _follow(channel)
        _quiet_teardown()
        sys.exit(status)
    status = FAILED
    try:
        status = _lead(sys.argv[1:], comm.Get_size())
    except SystemExit as exc:      # Hydra's own error report, or a job that ended the command
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        raise
    finally:
        if not channel.busy:        # else every rank left that job together
            channel.finish(status)
    _quiet_teardown()
    sys.exit(status)


def _split_hint(message: str, ranks: int) -> str:
    """Where a resumed run's own configuration is refused: a split these ranks cannot
    take, how to give another (the user never typed the key); a sweep's job that needs
    its job number, its sweep to resume instead."""
    key = message.split("=", 1)[0]
    if not _resuming or _sweep:       # a sweep's keys are its own values to keep
        return ""
    if "has no job number" in message and is_sweep(_resuming[0].parent):
        return f"; resume its sweep: {resume_command(_resuming[0].parent, ranks)}"
    if key not in ("parallel.layer_ranks", "parallel.data_ranks") or \
            any(a.startswith(key + "=") for a in _typed):
        return ""
    return f" (the run's own split: give {key}=... with resume= for these ranks)"


def _lead(args: list[str], ranks: int) -> int:
    """Rank 0: check the command, claim its directory, run Hydra; the exit status."""
    _typed[:] = args
    try:
        check_flags(args)
        check_launcher(args, ranks)
        check_dir_values(args)
        args = _resume_args(args)
        if informational(args):      # --help, --cfg job, --info ...: nothing to write
            if multirun(args):       # Hydra's answer is a 20-line traceback
                from lptrain.errors import ConfigError
                word = sweep_switch(args)
                raise ConfigError(f"{word}: --cfg, --info and --hydra-help show one "
                                  f"configuration, not a sweep's; drop {word} (and give "
                                  f"one value per key)")
            # its overrides are checked first: Hydra reports a bad one in five lines
            # with a pointer to HYDRA_FULL_ERROR
            checked = checked_args(args)
            if checked is not None:
                check_command(checked, source=config_source(args))
            return _informed(args)
        check_hydra_keys([a for a in args if a.lstrip("+").startswith("hydra.")])
        checked, source = checked_args(args), config_source(args)
        _source[:] = [source]
        if checked is not None:
            # the split on these ranks, job by job; a resumed sweep's finished jobs had
            # theirs, and its preflight checks the jobs it runs
            check_command(checked, None if _sweep else ranks, source)
        args = configured_args(args, checked, source)
        key = "hydra.sweep.dir" if multirun(args) else "hydra.run.dir"
        given = value(args, key)
        fresh = not _resuming and (given is None or not Path(dir_value(given)).exists())
        # the folders above it this command makes (a default one's date and outputs/)
        made = 2 if given is None else sum(not p.exists()
                                           for p in Path(dir_value(given)).parents)
        args, directory = directory_args(args)
        try:
            refuse_inside_live_run(directory, "resume" if _resuming else key)
        except LptrainError:
            if fresh:        # a default folder directory_args made: not left behind
                remove_refused(directory, empty_parents=made)
            raise
        problem = check_writable(directory, key)
        if problem:
            raise RunFileError(problem, exit_code=REFUSED)
        _claim(directory, args, ranks)
    except LptrainError as exc:   # nothing ran: refused, or a fault such as a full disk
        _say(str(exc) + _split_hint(str(exc), ranks))
        return exc.exit_code
    saved = SavedFiles(_resuming[0] / ".hydra") if _resuming and not _sweep else None
    if multirun(args) and not _sweep:
        from lptrain.sweeps import FreshSweep
        _fresh[:] = [FreshSweep()]
    try:
        status = _hydra(args, directory, multirun(args))
        if status is not None:
            _failures.append(status)
        elif multirun(args) and _results:
            _closing(directory)
    finally:
        if saved and REFUSED in _failures:    # the run stays as it was
            _put_back(saved.restore)
    if fresh and _failures == [REFUSED]:   # nothing ran (a sweep: no job started)
        remove_refused(directory, empty_parents=made)
    return max(_failures, default=0)


def _informed(args: list[str]) -> int:
    """Hydra's answer to --cfg, --info ...: its exit status (its own error, a comma value,
    in one line), 1 where stdout could not take it (--info logs it, which drops errors)."""
    from lptrain.metrics.streams import WatchedStream, output_lost
    watched = sys.stdout = WatchedStream(sys.stdout)
    status = 0
    try:
        status = _hydra(args) or 0      # an error Hydra raised: said in its one line
        sys.stdout.flush()
    except OSError:
        pass                            # noted
    finally:
        sys.stdout = watched.stream
    if watched.error is not None and not status:
        output_lost(PROG, watched.error)
        return 1
    return status


def _hydra(args: list[str], directory: str | None = None, sweep: bool = False) -> int | None:
    """Hydra's run of the command `args`, its overrides ahead of its flags (its parser
    takes none after a flag; the run directory went last, directory_args); the exit
    status of an error Hydra or a sweeper plugin ended it with, said in one line (its
    traceback in `directory`, if any), else None."""
    sys.argv = [sys.argv[0], *overrides_first(args)]
    try:
        with hydra_raising() as ours:
            _hydra_entry()
    except Exception as exc:
        if not ours:
            raise
        line, status = hydra_failure(exc, directory, _failures, _jobs[0], sweep)
        _say(line)
        return status
    return None


def _closing(directory: str) -> None:
    """The line after a sweep's last job, on stdout with the jobs' summaries (each job's
    log has its own run; the sweep has none)."""
    from lptrain.errors import report_command
    from lptrain.metrics.streams import say as said
    from lptrain.sweeps import sweep_summary
    where = dir_value(directory)
    said(f"{PROG}: {sweep_summary(where, _results, report_command(where))}", sys.stdout)


def _put_back(restore) -> None:
    try:
        restore()
    except LptrainError as exc:
        _say(str(exc))
        _failures.append(exc.exit_code)


def _follow(channel) -> int:
    """Ranks other than 0: run the jobs rank 0 hands out; rank 0's exit status."""
    logging.disable(logging.CRITICAL)    # rank 0 keeps the log
    while True:
        kind, payload = channel.receive()
        if kind == END:
            return payload
        with payload.entered():
            _run_job(payload)


def _task(cfg) -> float | None:
    """Rank 0's Hydra job: hand it to the other ranks, run it; returns the final objective
    (what a sweeper plugin minimises), None when the run failed."""
    from hydra.core.hydra_config import HydraConfig

    from lptrain.config import refuse_schema_nodes
    from lptrain.errors import ConfigError
    _jobs[0] += 1
    _stop_before_job(HydraConfig.get())
    try:     # a job a sweeper made up, or a command check_command could not check
        refuse_schema_nodes(HydraConfig.get().runtime.choices)
        _refuse_mixed_job(HydraConfig.get())
    except ConfigError as exc:      # no rank runs it; the sweep's closing line counts it
        _failures.append(exc.exit_code)
        _say(str(exc))
        return _ended(None)
    resume = bool(_resuming)
    if _sweep:         # a resumed sweep: each job as its directory calls for
        plan = _planned(cfg, HydraConfig.get())
        if plan is None or plan.action == "kept":     # the job's files stay as they were
            _put_back(lambda: _sweep[0].put_back(Path(HydraConfig.get().runtime.output_dir)))
            return _ended(None if plan is None else plan.objective, cfg)
        resume = plan.action == "resume"
    job = Job.of_hydra(cfg, HydraConfig.get(), resume=resume)
    if _fresh and _refused_in_folder(job, HydraConfig.get().job.num):
        return _ended(None)
    channel = _channel[0] if _channel else None
    if channel:
        channel.announce(job)
        channel.busy = True
    failed = len(_failures)
    objective = _run_job(job)
    if channel:
        channel.busy = False
    if _sweep and REFUSED in _failures[failed:]:     # the job stays as it was
        _put_back(lambda: _sweep[0].put_back(Path(job.run_dir)))
    if _fresh:
        _fresh[0].record(Path(job.run_dir), HydraConfig.get().job.num)
    elif _sweep and REFUSED not in _failures[failed:]:   # what a later refusal puts back
        _sweep[0].ran(Path(job.run_dir))
    return _ended(objective, cfg)


def _refused_in_folder(job: Job, number: int) -> bool:
    """Whether a new sweep's job is sent into a folder an earlier job of it ran in: then
    refused (said, counted) before any rank runs it, that job's files put back."""
    try:
        refusal = _fresh[0].refusal(Path(job.run_dir), number)
    except LptrainError as exc:
        refusal = str(exc)
    if refusal is not None:
        _failures.append(REFUSED)
        _say(refusal)
    return refusal is not None


def _stop_before_job(hydra_cfg) -> None:
    """A sweep's job: stop the sweep before it when rank 0 received a signal since the
    last job (or while Hydra set the sweep up), instead of starting it."""
    from hydra.types import RunMode
    if hydra_cfg.mode != RunMode.MULTIRUN or not _stop:
        return
    sweep_dir = Path(_resuming[0]) if _resuming else Path(hydra_cfg.sweep.dir)
    stop_before_job(_stop[0], sweep_dir, _channel[0].size if _channel else 1,
                    hydra_cfg.job.num)


def _refuse_mixed_job(hydra_cfg) -> None:
    """A sweep's job with an experiment beside a group option its glob() chose (which the
    command's check cannot expand): checked as a command of its own (config.mixed)."""
    from lptrain.config.meanings import GROUPS
    from lptrain.config.source import ConfigSource
    task = [str(o) for o in hydra_cfg.overrides.task]
    keys = {override_key(o) for o in task}
    if "experiment" in keys and keys & (set(GROUPS) - {"experiment"}):
        check_command(task, source=_source[0] if _source else ConfigSource())


def _ended(objective: float | None, cfg=None) -> float | None:
    """`objective`, noted as the result of the sweep's job under way (its closing line),
    with the overrides its configuration `cfg` does not read."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from lptrain.sweeps import JobResult, unread
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:       # a single run has no job number
        task = tuple(hydra_cfg.overrides.task)
        _results.append(JobResult(hydra_cfg.job.num, task, objective, unread(cfg, task)))
    return objective


def _planned(cfg, hydra_cfg):
    """Rank 0, a job of a resumed sweep: its JobPlan, said where the job is kept; None
    where its directory allows neither (said too)."""
    try:
        plan = _sweep[0].plan(Path(hydra_cfg.runtime.output_dir), cfg.train.iterations,
                              list(hydra_cfg.overrides.task))
    except LptrainError as exc:
        _failures.append(exc.exit_code)
        _say(str(exc))
        return None
    if plan.action == "kept":
        line = f"{PROG}: " + plan.describe(hydra_cfg)
        from lptrain.metrics.streams import say as said    # broken between words on a
        said(line, sys.stdout)                              # terminal, as the others
        log.info(line)
    if plan.failed:
        _failures.append(FAILED)
    return plan


def _run_job(job: Job) -> float | None:
    """One job on this rank, with this command's stop handlers and failures."""
    return run_job(job, _stop[0] if _stop else None, _failures, _split_hint)


def _hydra_entry():
    import hydra

    from lptrain.config.schema import register_configs
    register_configs()
    main = hydra.main(config_path=f"pkg://{CONF_MODULE}", config_name="config",
                      version_base="1.3")
    return main(_task)()


if __name__ == "__main__":
    main()
