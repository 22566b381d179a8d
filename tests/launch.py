"""The installed commands in subprocesses, for the CLI tests."""
from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LPTRAIN = str(BIN / "lptrain")
MPIEXEC = str(BIN / "mpiexec")
# MPICH ranks yield while they wait (the tests oversubscribe small machines); errors stay
# one line (no HYDRA_FULL_ERROR from the caller's shell)
ENV = {**os.environ, "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
ENV.pop("HYDRA_FULL_ERROR", None)


def lptrain(args, cwd=None, ranks: int = 1, timeout: float = 120,
            env: dict | None = None, fresh: bool = False) -> subprocess.CompletedProcess:
    """Run `lptrain args` (under `mpiexec -n ranks` when ranks > 1); a hang fails the test.

    One rank runs in a child forked from a server that has imported lptrain already
    (tests/forkserver.py), unless `fresh`: then, as with mpiexec, a new interpreter starts.
    """
    env = env or ENV
    if ranks == 1 and not fresh:
        return _server(env).run([str(a) for a in args], cwd, env, timeout)
    cmd = [LPTRAIN, *args]
    if ranks > 1:
        cmd = [MPIEXEC, "-n", str(ranks), *cmd]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


class ForkServer:
    """The client of one tests/forkserver.py process (started with the runs' environment)."""

    def __init__(self, env: dict):
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name(
            "forkserver.py"))], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
            text=True)
        self.pending = b""
        self.files = Path(tempfile.mkdtemp(prefix="lptrain-forks-"))
        self._reply(STARTUP_TIMEOUT, "ready")

    def _reply(self, timeout: float, key: str):
        """The next reply line's `key`, or None if none came within `timeout` seconds."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            if not select.select([fd], [], [], timeout)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the fork server ended (exit {self.proc.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)[key]

    def run(self, args, cwd, env, timeout) -> subprocess.CompletedProcess:
        out, err = self.files / "stdout", self.files / "stderr"
        request = {"args": args, "cwd": str(cwd or os.getcwd()), "env": env,
                   "argv0": LPTRAIN, "stdout": str(out), "stderr": str(err)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        pid = self._reply(STARTUP_TIMEOUT, "pid")
        status = self._reply(timeout, "status")
        if status is None:          # as subprocess.run: kill the child, then raise
            os.kill(pid, signal.SIGKILL)
            self._reply(STARTUP_TIMEOUT, "status")
            raise subprocess.TimeoutExpired([LPTRAIN, *args], timeout,
                                            out.read_text(), err.read_text())
        return subprocess.CompletedProcess([LPTRAIN, *args], os.waitstatus_to_exitcode(status),
                                           out.read_text(), err.read_text())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=STARTUP_TIMEOUT)
        shutil.rmtree(self.files, ignore_errors=True)


STARTUP_TIMEOUT = 120
_servers: dict[tuple, ForkServer] = {}


def _server(env: dict) -> ForkServer:
    """The fork server for this environment (imports may read it), started on first use."""
    key = tuple(sorted(env.items()))
    if key not in _servers:
        if not _servers:
            atexit.register(lambda: [s.close() for s in _servers.values()])
        _servers[key] = ForkServer(env)
    return _servers[key]


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return kids


def rank_pids(pid: int) -> dict[int, int]:
    """rank -> pid of the processes below mpiexec `pid` (PMI_RANK in their environment)."""
    found, todo = {}, _children(pid)
    while todo:
        p = todo.pop()
        todo += _children(p)
        try:
            env = Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"PMI_RANK="):
                found[int(item.split(b"=")[1])] = p
    return found
