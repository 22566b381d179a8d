"""The installed commands in subprocesses, for the CLI tests."""
from __future__ import annotations

import os
import subprocess
import sys
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
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `lptrain args` (under `mpiexec -n ranks` when ranks > 1); a hang fails the test."""
    cmd = [LPTRAIN, *args]
    if ranks > 1:
        cmd = [MPIEXEC, "-n", str(ranks), *cmd]
    return subprocess.run(cmd, cwd=cwd, env=env or ENV, capture_output=True, text=True,
                          timeout=timeout)


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
