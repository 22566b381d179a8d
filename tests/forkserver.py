"""An interpreter with lptrain's modules imported that runs the `lptrain` command in forked
children, so that one-rank CLI tests pay torch's import (seconds) once per session.

Started by tests/launch.py with the environment of the runs it will serve (imports may
read it). It reads one JSON request per line on stdin ({"args", "cwd", "env", "stdout",
"stderr"}, and "script" for `python SCRIPT args` instead of `lptrain args`), forks,
answers the child's pid, and when the child has ended its wait status.
The child is the command from `main()` on: its own argv, directory, environment and
output files, and it ends as the interpreter would (exit handlers, a traceback and 1
for an uncaught exception) but through os._exit (`run_job`). MPI is never initialised
here: each child does that itself.
Start-up itself (entry points, signals while importing, launchers) is tested by real
launches elsewhere.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import traceback


def preload() -> None:
    """What a training run imports, short of MPI (importing mpi4py.MPI initialises it)."""
    import h5py  # noqa: F401
    import hydra  # noqa: F401
    import torch  # noqa: F401

    import lptrain.app  # noqa: F401
    import lptrain.cli  # noqa: F401
    import lptrain.jobs  # noqa: F401


def serve() -> dict | None:
    """Fork a child per run request; the child returns its request, the server None at
    EOF. A run request with "wait" false is answered with the pid only; {"poll": pid,
    "block": bool} then answers that child's wait status (None while it runs)."""
    for line in sys.stdin:
        request = json.loads(line)
        if "poll" in request:
            pid, status = os.waitpid(request["poll"], 0 if request["block"] else os.WNOHANG)
            print(json.dumps({"status": status if pid else None}), flush=True)
            continue
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            return request
        print(json.dumps({"pid": pid}), flush=True)
        if request.get("wait", True):
            _, status = os.waitpid(pid, 0)
            print(json.dumps({"status": status}), flush=True)
    return None


def become(request: dict) -> None:
    """Turn this child into `lptrain args` started in request['cwd']."""
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
        os.close(out)
    os.close(null)
    sys.stdin = open(os.devnull)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [request["argv0"], *request["args"]]


def run_job(job: dict) -> int:
    """The command (or `python SCRIPT`) to its end as the interpreter ends it: exit
    handlers run, a traceback and 1 for an uncaught exception, output flushed. Returns
    the exit status (negative: the signal an uncaught KeyboardInterrupt ends it with).

    The child then leaves with os._exit: an interpreter's own exit would tear down the
    server's whole heap, copying every page it touches from the parent."""
    try:
        if job.get("script"):       # `python SCRIPT args`: its directory first on the path
            import runpy
            sys.path[0] = os.path.dirname(os.path.abspath(job["script"]))
            runpy.run_path(job["script"], run_name="__main__")
        else:
            from lptrain.cli import main
            main()
        status = 0
    except SystemExit as exc:
        status = exit_status(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        status = -signal.SIGINT
    except BaseException:          # noqa: BLE001 - as the interpreter: a traceback, 1
        traceback.print_exc()
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return status


def exit_status(code) -> int:
    """The status `sys.exit(code)` ends an interpreter with (a message: printed, 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def leave(status: int) -> None:
    """End this child with `status` (negative: killed by that signal), skipping the
    interpreter's teardown (`run_job`)."""
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    os._exit(status)


if __name__ == "__main__":
    preload()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    job = serve()
    if job is not None:
        become(job)
        leave(run_job(job))
    # EOF: the server ends as its children do, without tearing down its heap (what
    # the interpreter's exit would spend on it delays the end of every test session)
    sys.stdout.flush()
    sys.stderr.flush()
    leave(0)
