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
    """Let glibc serve tensors up to 256 MB from its heap and keep what is freed.

    By default glibc maps every block above a threshold that adapts up to
    32 MB afresh and trims its heap's free top, so the solver's temporaries
    would cost page faults each time.  Blocks above 256 MB are still mapped
    and returned on free: kept in the heap they fragment it, and full-batch
    convolutional training then grows by gigabytes per iteration.  The few
    dense tensors that large (a serial sweep's states) are kept between
    sweeps by their owners instead (model.serial.Buffers).  Numbers in
    BENCHMARKS.md.
    Returns False off glibc.
    """
    import ctypes
    import ctypes.util
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, MMAP_ABOVE)) and \
            bool(libc.mallopt(m_trim_threshold, 2 ** 31 - 1))
    except (OSError, AttributeError):
        return False


MMAP_ABOVE = 256 * 2 ** 20     # bytes: larger blocks are mapped (and unmapped on free)
