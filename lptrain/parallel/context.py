"""The one place that touches MPI.COMM_WORLD, and the exchange built on a communicator."""
from __future__ import annotations

import os

from lptrain.mgrit.exchange import MPIExchange, SerialExchange


def world():
    """MPI.COMM_WORLD (imports mpi4py only here)."""
    from mpi4py import MPI
    return MPI.COMM_WORLD


def make_exchange(comm):
    """SerialExchange for one rank (or no communicator), else MPIExchange."""
    if comm is None or comm.Get_size() == 1:
        return SerialExchange()
    return MPIExchange(comm)


def limit_threads(size: int) -> None:
    """Share the cores between the ranks of one machine instead of oversubscribing."""
    import torch
    if size > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
