"""The `lptrain` process before its first job: streams, allocator and exit handlers
set, MPI up, or the process ended in one line (a foreign MPI's launcher, a rank that
failed before MPI was up, a flag's text that cannot be written)."""
from __future__ import annotations

import atexit
import gc
import os
import sys

from lptrain.command_args import launched_rank
from lptrain.errors import REFUSED, LptrainError, first_line
from lptrain.stops import PROG, say_error as _say


def printed(text: str) -> None:
    """`text` on stdout; one line and exit 1 where it cannot be written (/dev/full), not
    a traceback."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as exc:
        from lptrain.metrics.streams import output_lost
        output_lost(PROG, exc)
        sys.exit(1)


def started():
    """Streams, allocator and exit handlers set, the heavy imports done, MPI up: the
    world communicator."""
    from lptrain.metrics.streams import no_color_in_pipes, survive_hangup
    no_color_in_pipes(sys.stderr, os.environ)       # before Hydra imports a sweeper
    survive_hangup(sys)
    from lptrain.parallel.context import keep_freed_memory
    # runs after every later exit handler: by then each file is closed, so the cyclic
    # garbage collector's passes over the interpreter's teardown (a few hundred thousand
    # objects: seconds on a loaded machine) would only free memory the OS frees anyway
    atexit.register(gc.freeze)
    keep_freed_memory()
    return _world()


def abort_before_mpi(exc: Exception) -> None:
    """A rank of an MPI launch that failed before MPI was up: one line, then MPI started
    only to end the job. The other ranks wait in MPI_Init for it for ever, where their
    stop handlers cannot run (SIGTERM and Ctrl-C do nothing there)."""
    _say(f"rank {launched_rank()}: {type(exc).__name__}: {first_line(exc)} (while "
         f"starting, before MPI)")
    try:
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(1)
    finally:
        os._exit(1)


def _world():
    """MPI.COMM_WORLD; exits REFUSED with one line when MPI cannot start here (another MPI's
    launcher, or no MPI library for mpi4py)."""
    from lptrain.parallel.context import foreign_launch, says_for_launch, world
    try:
        foreign = foreign_launch(os.environ)
        if not foreign:
            return world()
    except LptrainError as exc:      # no rank is known: every process says it
        _say(str(exc))
        sys.exit(exc.exit_code)
    if says_for_launch(os.environ):
        _say(foreign)
    sys.exit(REFUSED)
