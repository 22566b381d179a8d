"""Several rank counts in one mpiexec launch: a case runs on communicators of the first 2,
3, ... ranks of the launch in turn, instead of one launch (and torch import) per count.

    mpiexec -n 4 python case.py OUT 2 3 4      (case.py's main calls `main(run)`)
    on_sizes(case_file, [2, 3, 4], OUT)         (the pytest side: {size: rank 0's results})

tests/mpi/four_ranks.py runs several such cases in one launch (`on_each_size`).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch

MPIEXEC = Path(sys.executable).parent / "mpiexec"


def idle_barrier(comm, poll: float = 0.002) -> None:
    """comm.Barrier() that sleeps while it waits. MPICH's Barrier polls: a rank that waits
    in it for the ranks still computing takes a core from them when the launch has more
    ranks than the machine has cores."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(poll)


def on_each_size(run, comm, sizes) -> dict:
    """`run(sub)` on the communicator `sub` of the first `size` ranks of `comm`, for each
    of `sizes` (the other ranks wait); {size: rank 0's results} on rank 0, {} elsewhere."""
    from mpi4py import MPI
    results = {}
    for size in sizes:
        sub = comm.Split(0 if comm.Get_rank() < size else MPI.UNDEFINED, comm.Get_rank())
        failed = None
        if sub != MPI.COMM_NULL:
            try:
                got = run(sub)
            except Exception as exc:     # noqa: BLE001 - the waiting ranks must hear of it
                failed = exc
            else:
                if sub.Get_rank() == 0:
                    results[size] = got
            sub.Free()
        idle_barrier(comm)
        # an error raised alike on the ranks of `sub` (a failing case) ends every rank
        # now, instead of leaving the others waiting for them until the launch's timeout
        if comm.allreduce(failed is not None, op=MPI.LOR):
            raise failed or RuntimeError(f"on {size} ranks: a rank failed (see above)")
    return results


def main(run) -> None:
    """Under mpiexec: `run(comm)` on the first `size` ranks for each size in argv[2:]
    (the others wait); rank 0 saves {size: its results} to argv[1]."""
    from lptrain.parallel.context import world
    comm = world()
    results = on_each_size(run, comm, [int(s) for s in sys.argv[2:]])
    if comm.Get_rank() == 0:
        torch.save(results, sys.argv[1])


def launch(script, ranks: int, args, timeout: float = 400) -> None:
    """`python script args...` under `mpiexec -n ranks` (one thread per rank); a failure,
    a hang or a warning on stderr fails the test."""
    env = dict(os.environ, MPIR_CVAR_ENABLE_HEAVY_YIELD="1", OMP_NUM_THREADS="1")
    cmd = ["timeout", str(int(timeout)), str(MPIEXEC), "-n", str(ranks), sys.executable,
           str(script), *map(str, args)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout + 40)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]   # e.g. torch resizing an out=


def on_sizes(script, sizes, out: Path, timeout: float = 400) -> dict:
    """`script out sizes...` under mpiexec -n max(sizes); {size: rank 0's results}."""
    launch(script, max(sizes), [out, *sizes], timeout)
    return torch.load(out)
