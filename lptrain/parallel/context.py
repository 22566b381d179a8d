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


def keep_freed_memory() -> bool:
    """Let glibc serve large tensors from its heap and keep what is freed.

    By default every tensor above 32 MB is a fresh mmap, so the solver's
    large temporaries cost page faults each time (measured: an 82 MB tanh took
    70 ms instead of 25 ms).  The process then keeps its peak memory until it
    exits, which a training run does anyway.  Returns False off glibc.
    """
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_max = -1, -4
        return bool(libc.mallopt(m_mmap_max, 0)) and \
            bool(libc.mallopt(m_trim_threshold, 2 ** 31 - 1))
    except (OSError, AttributeError):
        return False
