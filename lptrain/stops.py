"""The `lptrain` command's stops around its jobs: a signal while it starts, in a run's
last iteration, or between the jobs of a resumed sweep; and the resume a stop or a
machine fault names. Rank 0 says each in one line; the exit status is 128 + the signal.
"""
from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

from lptrain.errors import resume_command
from lptrain.jobs import Job
from lptrain.rundir import is_sweep

PROG = "lptrain"
log = logging.getLogger("lptrain")


class AgreedExit(SystemExit):
    """An exit every rank takes together, after agreeing on it (a signal in a sweep's
    job): not a failure to end the other ranks for (cli._run_job)."""


def say(message: str, level: int | None = logging.WARNING) -> None:
    """One line `lptrain: message` on stderr (rank 0), and in the log at `level` (None:
    not logged)."""
    from lptrain.metrics.streams import say as said
    said(f"{PROG}: {message}")
    if level is not None:
        log.log(level, message)


def say_error(msg: str) -> None:
    """The command's error line, `lptrain: error: ...`, broken between words on a terminal."""
    from lptrain.metrics.streams import say as said
    said(f"{PROG}: error: {msg}")


def stop_if_signalled(comm, stop) -> None:
    """Collective: exit 128 + the signal on every rank when any rank received SIGINT,
    SIGHUP or SIGTERM while lptrain started (imports, MPI), before anything was written;
    rank 0 says so in one line. A later signal stops the run after an iteration."""
    from lptrain.parallel.context import make_exchange
    signum, _ = stop.agreed(make_exchange(comm))
    if signum is None:
        return
    if comm.Get_rank() == 0:
        say(f"interrupted by {signal.Signals(signum).name} while starting; nothing was "
            f"run or written", level=None)
    sys.exit(128 + signum)


def again(job: Job) -> Path:
    """The directory whose resume carries on this job: its sweep's, else its own."""
    return Path(job.sweep_dir) if job.sweep_dir and is_sweep(job.sweep_dir) else \
        Path(job.run_dir)


def _from_checkpoint(job: Job, ranks: int) -> str | None:
    """The command that resumes the job from its checkpoint; None where it has none."""
    from lptrain.train.checkpoint import CHECKPOINT_FILE
    if not (Path(job.run_dir) / CHECKPOINT_FILE).is_file():
        return None
    return resume_command(again(job), ranks)


def resume_hint(exc, job: Job, ranks: int) -> str:
    """For a fault of the machine (a full disk, an unwritable file) that left a
    checkpoint to carry the run on from: how to, once fixed."""
    from lptrain.errors import FAILED, DivergedError, StalledError
    command = _from_checkpoint(job, ranks)
    if exc.exit_code != FAILED or isinstance(exc, (DivergedError, StalledError)) or \
            command is None:
        return ""
    return f"; once fixed, resume with: {command}"


def unexpected(exc: BaseException, rank: int, trace: Path | None, job: Job, ranks: int) -> str:
    """The one line of an error no rank expected. An MPI call that failed on a
    surviving rank means, almost always, that another rank ended (killed, out of
    memory) in a collective or message: say that, and what the run can carry on from."""
    from lptrain.errors import one_line
    where = f" (traceback in {trace})" if trace else ""
    if not type(exc).__module__.startswith("mpi4py"):
        text = one_line(exc)
        return f"rank {rank}: {type(exc).__name__}{': ' + text if text else ''}{where}"
    command = _from_checkpoint(job, ranks)
    kept = "" if command is None else f"; its last checkpoint is whole: resume with: {command}"
    return (f"rank {rank}: an MPI call failed, most likely because another rank ended "
            f"(killed or out of memory; MPI says: {one_line(exc)}){where}{kept}")


def signal_at_the_end(job: Job, comm, stop) -> None:
    """Collective, after a run that ended by itself: a signal received in its last
    iteration or its closing lines stopped nothing; say so.  A single run exits as it
    ended; a sweep (any sweeper) stops before its next job (128 + the signal)."""
    from lptrain.parallel.context import make_exchange
    signum, _ = stop.agreed(make_exchange(comm))
    if signum is None:
        return
    sweep = bool(job.sweep_dir)      # the same on every rank (any sweeper)
    if comm.Get_rank() == 0:
        message = f"{signal.Signals(signum).name} in the run's last iteration: " \
                  f"{job.run_dir} ended as metrics.h5 says"
        if sweep and is_sweep(job.sweep_dir):
            message += (f"; the sweep stops here (`{resume_command(again(job), comm.Get_size())}`"
                        f" carries on the jobs left)")
        elif sweep:           # a sampler's sweep (Optuna): this job's run is done
            message += ("; the sweep stops here (its sweeper saved nothing to carry it "
                        "on: sweep again, an Optuna study from its hydra.sweeper.storage)")
        say(message)
    if sweep:
        raise AgreedExit(128 + signum)


def stop_before_job(stop, sweep_dir: Path, ranks: int, number: int) -> None:
    """Rank 0, before a sweep's job `number` starts: a signal received since the last
    check (while Hydra set the sweep up, or a resumed sweep passed over its kept jobs)
    stops the sweep here (128 + the signal); the job had started, and stopped after its
    first iteration."""
    if stop is None or stop.received is None:
        return
    carry = f"resume with: {resume_command(sweep_dir, ranks)}" if is_sweep(sweep_dir) \
        else "its sweeper saved nothing to carry it on: sweep again"
    say(f"interrupted by {signal.Signals(stop.received).name} before job {number}; {carry}")
    sys.exit(128 + stop.received)
