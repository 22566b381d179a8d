"""Several rank counts in one mpiexec launch: a case runs on communicators of the first 2,
3, ... ranks of the launch in turn, instead of one launch (and torch import) per count.

    mpiexec -n 4 python case.py OUT 2 3 4      (case.py's main calls `main(run)`)
    on_sizes(case_file, [2, 3, 4], OUT)         (the pytest side: {size: rank 0's results})
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

MPIEXEC = Path(sys.executable).parent / "mpiexec"


def main(run) -> None:
    """Under mpiexec: `run(comm)` on the first `size` ranks for each size in argv[2:]
    (the others wait); rank 0 saves {size: its results} to argv[1]."""
    from mpi4py import MPI

    from lptrain.parallel.context import world
    comm, results = world(), {}
    for size in map(int, sys.argv[2:]):
        sub = comm.Split(0 if comm.Get_rank() < size else MPI.UNDEFINED, comm.Get_rank())
        if sub != MPI.COMM_NULL:
            got = run(sub)
            if sub.Get_rank() == 0:
                results[size] = got
            sub.Free()
        comm.Barrier()
    if comm.Get_rank() == 0:
        torch.save(results, sys.argv[1])


def on_sizes(script, sizes, out: Path, timeout: float = 400) -> dict:
    """`script out sizes...` under mpiexec -n max(sizes); {size: rank 0's results}."""
    env = dict(os.environ, MPIR_CVAR_ENABLE_HEAVY_YIELD="1", OMP_NUM_THREADS="1")
    cmd = ["timeout", str(int(timeout)), str(MPIEXEC), "-n", str(max(sizes)), sys.executable,
           str(script), str(out), *map(str, sizes)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout + 40)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]   # e.g. torch resizing an out=
    return torch.load(out)
