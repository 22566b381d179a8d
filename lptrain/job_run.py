"""One job of the `lptrain` command on one rank: its training, and how its end is said.

Every rank runs the job together (rank 0 from Hydra's task, the others from the job
channel, lptrain/cli.py). Whatever fails after the world is up ends here, so that no rank
is left waiting for one that stopped.
"""
from __future__ import annotations

import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from lptrain.errors import Interrupted, LptrainError, resume_command
from lptrain.jobs import Job
from lptrain.stops import (AgreedExit, again, resume_hint, say, say_error, signal_at_the_end,
                           unexpected)

log = logging.getLogger("lptrain")

RANK0_FIRST = 2.0   # seconds ranks > 0 leave rank 0 to report an error they all hit


def quiet_teardown() -> None:
    """Ignore SIGINT, SIGHUP and SIGTERM once the command's work is done: the
    interpreter's teardown puts back the default handlers, and a signal then ended a
    completed run with 130 or 143 and no word."""
    from lptrain.train.stop import StopSignals
    StopSignals.ignore()


def run_job(job: Job, stop, failures: list[int],
            hint: Callable[[str, int], str]) -> float | None:
    """`job` on this rank: its ranked result, or None where it failed. `stop`: the
    command's StopSignals (None when called otherwise); an lptrain error's exit status is
    appended to `failures`, its message completed by `hint(message, ranks)`."""
    from lptrain.parallel.context import world
    comm = world()
    run_dir = Path(job.run_dir)
    try:
        return _train(job, comm, run_dir, stop)
    except Interrupted as exc:       # every rank agreed on it after the same iteration
        if comm.Get_rank() == 0:
            say(f"{exc} (status interrupted); {_resume_line(job, run_dir, comm.Get_size())}")
        quiet_teardown()             # a second signal while exiting: 2 or 15, MPICH's banner
        sys.exit(exc.exit_code)
    except LptrainError as exc:      # raised identically on every rank
        failures.append(exc.exit_code)
        if comm.Get_rank() == 0:
            ranks = comm.Get_size()
            message = str(exc) + hint(str(exc), ranks) + resume_hint(exc, job, ranks)
            log.error(message)
            # a sweep's error line names its job (stderr apart from stdout did not)
            say_error(f"job {os.path.relpath(run_dir, job.sweep_dir)}: {message}"
                      if job.sweep_dir else message)
    except AgreedExit:               # every rank leaves together
        raise
    except (Exception, SystemExit, KeyboardInterrupt) as exc:   # unexpected, a user's
        _unexpected(exc, job, comm, run_dir)                     # step's sys.exit too
    return None


def _unexpected(exc: BaseException, job: Job, comm, run_dir: Path) -> None:
    """An error lptrain did not foresee: its traceback in the run's directory, one line
    said once, and every rank ended."""
    trace = run_dir / f"error-rank{comm.Get_rank()}.log"
    try:
        trace.write_text(traceback.format_exc())
    except OSError:
        trace = None
    message = unexpected(exc, comm.Get_rank(), trace, job, comm.Get_size())
    if comm.Get_rank() > 0:      # where every rank failed alike, rank 0's abort ends
        time.sleep(RANK0_FIRST)  # the job first: one line, not one per rank
    say_error(message)
    log.error(message)
    if comm.Get_size() > 1:
        from lptrain.mgrit.exchange import abort
        abort(comm, 1)
    sys.exit(1)


def _resume_line(job: Job, run_dir: Path, ranks: int) -> str:
    """How a stopped run carries on: its resume command, or why it cannot (its
    metrics.h5 removed while it ran: the resume would be refused)."""
    from lptrain.metrics.schema import FILE_NAME
    if not (run_dir / FILE_NAME).exists():
        return (f"its {FILE_NAME} was removed during the run, so it cannot be resumed "
                f"(the models are kept)")
    return f"resume with: {resume_command(again(job), ranks)}"


def _train(job: Job, comm, run_dir: Path, stop) -> float:
    """The job's training on this rank; what a sweep ranks it by (Outcome.ranked: the
    final objective, with mini-batches the last whole epoch's mean)."""
    from lptrain import app
    from lptrain.parallel import auto
    auto.install(model_timer)
    outcome = app.run(job.cfg, comm, run_dir, stop, resume=job.resume, typed=job.typed)
    if stop is not None:
        signal_at_the_end(job, comm, stop)
    return float(outcome.ranked)


def model_timer(opts, net, mode: str):
    """parallel.layer_ranks=auto's timer: the speedup model, imported only when a run
    has a choice of grids."""
    from lptrain.model_perf.grid import model_timer as timer
    return timer(opts, net, mode, lambda text: say(text, logging.INFO))
