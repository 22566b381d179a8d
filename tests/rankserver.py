"""The ranks of one `mpiexec -n P` launch with lptrain's modules imported, which run the
`lptrain` command again and again in process, so that the several-rank CLI tests pay
torch's import and MPI's start (seconds per rank) once per session.

Started by tests/launch.py under `timeout` with the environment of the runs it will serve
(imports may read it; with mpiexec's variables, the environment of each run's ranks).
Rank 0 reads one JSON request per line on stdin ({"args", "cwd", "argv0", "stdout",
"stderr"}, and "script" for `python SCRIPT args` instead of `lptrain args`); every rank
then runs the command from `main()` on (or the script as `__main__`), as a fresh rank of
`mpiexec -n P lptrain args` would: its own argv, directory, environment (what a run
sets is undone), signal handlers and output files (rank r writes FILE.r), and it ends like an
interpreter (a traceback and 1 for an uncaught exception, the exit handlers the command
registered). Rank 0 answers every rank's exit status. The command's collectives use
COMM_WORLD; the server's own messages a duplicate of it, so that a rank left behind by
the command cannot be matched by the server (the request hangs, and the client's
timeout fails it). Between requests the ranks sleep instead of polling. Start-up itself
(entry points, MPI's initialisation, signals, mpiexec's forwarding) is tested by real
launches elsewhere.
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import logging
import os
import runpy
import signal
import sys
import time
import traceback
import warnings

from forkserver import exit_status, preload

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def wait(request, poll: float = 0.001, longest: float = 0.1):
    """A nonblocking MPI request's result, sleeping while it is pending: 1 ms at first,
    twice as long each time up to 0.1 s (an idle server's ranks wake 10 times a second)."""
    while True:
        done, value = request.test()
        if done:
            return value
        time.sleep(poll)
        poll = min(2 * poll, longest)


@contextlib.contextmanager
def as_command(request: dict, rank: int):
    """This process as `lptrain args` started in request['cwd'] for the block: fds 1 and
    2 on the request's files (suffixed by the rank), argv and directory; environment, signal
    handlers, logging, warning filters and torch's global settings put back afterwards."""
    import torch
    sys.stdout.flush()
    sys.stderr.flush()
    logs, filters = _loggers(), warnings.filters[:]
    saved_fds = {fd: os.dup(fd) for fd in (1, 2)}
    saved = (sys.argv, sys.path[:], os.getcwd(), dict(os.environ),
             {s: signal.getsignal(s) for s in SIGNALS},
             torch.get_default_dtype(), torch.get_num_threads())
    for fd, key in ((1, "stdout"), (2, "stderr")):
        out = os.open(f"{request[key]}.{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)
    os.chdir(request["cwd"])
    sys.argv = [request["argv0"], *request["args"]]
    if request.get("script"):        # as `python SCRIPT`: its directory first on the path
        sys.path.insert(0, os.path.dirname(os.path.abspath(request["script"])))
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in saved_fds.items():
            os.dup2(copy, fd)
            os.close(copy)
        argv, path, cwd, env, handlers, dtype, threads = saved
        sys.argv, sys.path[:] = argv, path
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        for s, handler in handlers.items():
            signal.signal(s, handler)
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
        _restore_loggers(logs)
        warnings.filters[:] = filters
        warnings._filters_mutated()     # warnings shown once are shown again, as when fresh


def _loggers() -> dict:
    """name -> (level, handlers, disabled, propagate) of every logger (root: "")."""
    named = {n: lg for n, lg in logging.Logger.manager.loggerDict.items()
             if isinstance(lg, logging.Logger)}
    return {n: (lg.level, lg.handlers[:], lg.disabled, lg.propagate)
            for n, lg in {"": logging.getLogger(), **named}.items()}


def _restore_loggers(saved: dict) -> None:
    """Loggers as `saved` found them; handlers added since are closed (files flushed),
    loggers made since are reset; logging.disable() is undone."""
    logging.disable(logging.NOTSET)
    for name in _loggers():
        level, handlers, disabled, propagate = saved.get(name, (logging.NOTSET, [], False,
                                                                True))
        logger = logging.getLogger(name or None)
        for h in logger.handlers[:]:
            if h not in handlers:
                logger.removeHandler(h)
                h.close()
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.disabled, logger.propagate = disabled, propagate


def run_command(script: str | None = None) -> int:
    """`lptrain.cli.main()` as the command runs it, or the Python `script` as `__main__`:
    its exit status, its exit handlers run.

    lptrain.cli is imported afresh each time (its module state is per process), Hydra's
    global state is cleared after it."""
    from hydra.core.global_hydra import GlobalHydra

    import lptrain.cli
    handlers = []
    register = atexit.register

    def register_lptrains(f, *a, **k):
        """The command's own exit handlers run at its end; a library's at the server's."""
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("lptrain") or caller == "__main__":
            handlers.append((f, a, k))
            return f
        return register(f, *a, **k)
    atexit.register = register_lptrains
    try:
        if script:
            runpy.run_path(script, run_name="__main__")
        else:
            importlib.reload(lptrain.cli).main()
        status = 0
    except SystemExit as exc:
        status = exit_status(exc.code)
    except BaseException:          # noqa: BLE001 - as the interpreter: a traceback, 1
        traceback.print_exc()
        status = 1
    finally:
        atexit.register = register
        GlobalHydra.instance().clear()
    for f, a, k in reversed(handlers):
        try:
            f(*a, **k)
        except Exception:           # noqa: BLE001 - as atexit: report, go on
            traceback.print_exc()
    gc.unfreeze()       # the command's last handler froze the heap for its exit
    return status


def serve(comm) -> None:
    """Run requests until rank 0's stdin ends."""
    rank, size = comm.Get_rank(), comm.Get_size()
    requests = os.fdopen(os.dup(0), "r") if rank == 0 else None
    replies = os.fdopen(os.dup(1), "w") if rank == 0 else None
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)      # stray output between requests goes to the log, not the replies
    while True:
        line = requests.readline() if rank == 0 else None
        request = _from_rank_0(comm, json.loads(line) if line else None)
        if request is None:
            return
        with as_command(request, rank):
            status = run_command(request.get("script"))
        if rank == 0:
            statuses = [status, *(wait(comm.irecv(source=r)) for r in range(1, size))]
            replies.write(json.dumps({"status": statuses}) + "\n")
            replies.flush()
        else:
            wait(comm.isend(status, dest=0))


def _from_rank_0(comm, value):
    """Rank 0's `value` on every rank (point to point: the ranks sleep while waiting)."""
    if comm.Get_rank() == 0:
        for r in range(1, comm.Get_size()):
            wait(comm.isend(value, dest=r))
        return value
    return wait(comm.irecv(source=0))


if __name__ == "__main__":
    preload()
    from lptrain.parallel.context import world
    control = world().Dup()
    if control.Get_rank() == 0:
        print(json.dumps({"ready": control.Get_size()}), flush=True)
    serve(control)
    # EOF: MPI ended, then the process, without tearing down its heap (what the
    # interpreter's exit would spend on it delays the end of every test session)
    from mpi4py import MPI
    control.Free()
    MPI.Finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
