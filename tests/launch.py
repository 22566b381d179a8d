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
import time
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
    (tests/forkserver.py); several ranks run in the ranks of one `mpiexec -n ranks` launch
    that have imported it already (tests/rankserver.py). With `fresh`, the command itself
    starts (under a new mpiexec for several ranks), as a user starts it.
    """
    env = env or ENV
    if not fresh:
        return _server(env, ranks).run([str(a) for a in args], cwd, env, timeout)
    cmd = [LPTRAIN, *args]
    if ranks > 1:     # `timeout` ends the ranks too
        cmd = ["timeout", str(int(timeout)), MPIEXEC, "-n", str(ranks), *cmd]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout + 30)


def start(args, cwd=None, env: dict | None = None, stderr=None) -> Forked:
    """`lptrain args` on one rank, left running (as subprocess.Popen): a child forked from
    the fork server (above); its error output goes to the file `stderr` if given."""
    return _server(env or ENV).start([str(a) for a in args], cwd, env or ENV, stderr)


def python(script, args, cwd=None, ranks: int = 1, timeout: float = 400,
           env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python script args` (under `mpiexec -n ranks` when ranks > 1) in the server of
    `lptrain` (above) for this environment and rank count: the script runs as
    `__main__` with lptrain imported already; a hang fails the test."""
    script = str(script)
    return _server(env or ENV, ranks).run([str(a) for a in args], cwd, env or ENV, timeout,
                                          script)


class ForkServer:
    """The client of one tests/forkserver.py process (started with the runs' environment)."""

    def __init__(self, env: dict):
        self.files = Path(tempfile.mkdtemp(prefix="lptrain-forks-"))
        self._start([sys.executable, str(Path(__file__).with_name("forkserver.py"))], env)

    def _start(self, cmd: list[str], env: dict, **kw) -> None:
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, text=True, **kw)
        self.pending = b""
        if self._reply(STARTUP_TIMEOUT, "ready") is None:
            self.kill()
            raise RuntimeError(f"{cmd[-1]} did not start within {STARTUP_TIMEOUT} s")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

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

    def run(self, args, cwd, env, timeout, script=None) -> subprocess.CompletedProcess:
        out, err = self.files / "stdout", self.files / "stderr"
        request = {"args": args, "cwd": str(cwd or os.getcwd()), "env": env,
                   "argv0": script or LPTRAIN, "script": script, "stdout": str(out),
                   "stderr": str(err)}
        cmd = [sys.executable, script, *args] if script else [LPTRAIN, *args]
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        pid = self._reply(STARTUP_TIMEOUT, "pid")
        status = self._reply(timeout, "status")
        if status is None:          # as subprocess.run: kill the child, then raise
            os.kill(pid, signal.SIGKILL)
            self._reply(STARTUP_TIMEOUT, "status")
            raise subprocess.TimeoutExpired(cmd, timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess(cmd, os.waitstatus_to_exitcode(status),
                                           out.read_text(), err.read_text())

    def start(self, args, cwd, env, stderr=None) -> Forked:
        """A run left running: its Forked handle."""
        self.started = getattr(self, "started", 0) + 1
        out = self.files / f"{self.started}.out"
        err = Path(stderr) if stderr else self.files / f"{self.started}.err"
        request = {"args": args, "cwd": str(cwd or os.getcwd()), "env": env,
                   "argv0": LPTRAIN, "stdout": str(out), "stderr": str(err), "wait": False}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return Forked(self, self._reply(STARTUP_TIMEOUT, "pid"), out, err, [LPTRAIN, *args])

    def status(self, pid: int, block: bool):
        """A started child's wait status, None while it runs (block: wait for it)."""
        self.proc.stdin.write(json.dumps({"poll": pid, "block": block}) + "\n")
        self.proc.stdin.flush()
        return self._reply(None if block else STARTUP_TIMEOUT, "status")

    def end_input(self) -> None:
        """The server's end of input: it ends its interpreter(s), in the background."""
        self.proc.stdin.close()

    def finish(self) -> None:
        """Wait for the server to end (after `end_input`); its files removed."""
        self.proc.wait(timeout=STARTUP_TIMEOUT)
        shutil.rmtree(self.files, ignore_errors=True)


class Forked:
    """A run forked by a ForkServer and left running, used as subprocess.Popen is: pid,
    returncode, poll(), wait(timeout), send_signal(), kill(); output() its (stdout,
    stderr) text. Its pid is the run's own process (the signals and locks of a test
    reach the run itself)."""

    def __init__(self, server: ForkServer, pid: int, out: Path, err: Path, args):
        self.server, self.pid, self.out, self.err, self.args = server, pid, out, err, args
        self.returncode = None

    def poll(self) -> int | None:
        if self.returncode is None:
            status = self.server.status(self.pid, block=False)
            if status is not None:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def output(self) -> tuple[str, str]:
        return tuple(p.read_text() if p.exists() else "" for p in (self.out, self.err))


class RankServer(ForkServer):
    """The client of one `mpiexec -n ranks` launch of tests/rankserver.py (started with the
    runs' environment, under `timeout`). Each run's exit status is that of mpiexec: its
    ranks' statuses or-ed (as MPICH's mpiexec reports them); its output rank 0's, then
    rank 1's ... A run that hangs or ends the launch ends this server: the next run
    starts another."""

    LIFETIME = 3600      # seconds: `timeout` ends a launch that outlives the session

    def __init__(self, env: dict, ranks: int):
        self.files, self.ranks = Path(tempfile.mkdtemp(prefix="lptrain-ranks-")), ranks
        self.log = open(self.files / "server.log", "w")
        self._start(["timeout", str(self.LIFETIME), MPIEXEC, "-n", str(ranks),
                     sys.executable, str(Path(__file__).with_name("rankserver.py"))], env,
                    stderr=self.log, start_new_session=True)

    def kill(self) -> None:
        """The whole launch: timeout, mpiexec, its proxy and the ranks."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def run(self, args, cwd, env, timeout, script=None) -> subprocess.CompletedProcess:
        out, err = self.files / "stdout", self.files / "stderr"
        request = {"args": args, "cwd": str(cwd or os.getcwd()), "argv0": script or LPTRAIN,
                   "script": script, "stdout": str(out), "stderr": str(err)}
        cmd = [MPIEXEC, "-n", str(self.ranks), *([sys.executable, script] if script else
                                                 [LPTRAIN]), *args]
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            statuses = self._reply(timeout, "status")
        except (OSError, RuntimeError) as exc:         # the launch ended: Abort, a crash
            log = (self.files / "server.log").read_text()[-3000:]
            self._end()
            raise RuntimeError(f"the rank server ended: {exc}; its log: {log}") from None
        outputs = [self._read(name) for name in (out, err)]
        if statuses is None:        # as subprocess.run: end the ranks, then raise
            self._end()
            raise subprocess.TimeoutExpired(cmd, timeout, *outputs)
        status = 0
        for s in statuses:
            status |= s
        return subprocess.CompletedProcess(cmd, status, *outputs)

    def _read(self, path: Path) -> str:
        return "".join(Path(f"{path}.{r}").read_text() if Path(f"{path}.{r}").exists() else ""
                       for r in range(self.ranks))

    def _end(self) -> None:
        self.kill()
        for key, server in list(_servers.items()):
            if server is self:
                del _servers[key]
        self.log.close()
        shutil.rmtree(self.files, ignore_errors=True)

    def finish(self) -> None:
        super().finish()
        self.log.close()


STARTUP_TIMEOUT = 120
_servers: dict[tuple, ForkServer] = {}


def _server(env: dict, ranks: int = 1) -> ForkServer:
    """The fork server (one rank) or rank server (several) for this environment (imports
    may read it) and rank count, started on first use."""
    key = (ranks, *sorted(env.items()))
    if key not in _servers:
        if not _servers:
            atexit.register(_close_all)
        _servers[key] = ForkServer(env) if ranks == 1 else RankServer(env, ranks)
    return _servers[key]


def _close_all() -> None:
    """Every server ended at once, not one waited for before the next is told."""
    servers = list(_servers.values())
    for server in servers:
        server.end_input()
    for server in servers:
        server.finish()


def _children(pid: int) -> list[int]:
    """pids of `pid`'s children; none once it has exited (a rank may end while we look)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    kids = []
    for task in tasks:
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
