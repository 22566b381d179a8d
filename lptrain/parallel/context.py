"""The one place that touches MPI.COMM_WORLD, and the exchange built on a communicator."""
from __future__ import annotations

import os
from dataclasses import dataclass

from lptrain.errors import MissingPackageError, install_hint
from lptrain.mgrit.exchange import Clock, MPIExchange, SerialExchange


def import_mpi():
    """mpi4py's MPI module; MissingPackageError naming the `mpi` extra when mpi4py finds no
    MPI library to load (mpi4py from PyPI brings none of its own)."""
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()
        raise MissingPackageError(
            f"mpi4py cannot load an MPI library ({first[0] if first else type(exc).__name__});"
            f" {install_hint('mpi')} (MPICH), or on a cluster load its MPI module and build "
            f"mpi4py against it") from None
    return MPI


def world():
    """MPI.COMM_WORLD (imports mpi4py only here)."""
    return import_mpi().COMM_WORLD


# environment variables a launcher sets for its ranks -> whose launcher it is
LAUNCHERS = (("OMPI_COMM_WORLD_SIZE", "Open MPI"), ("PMIX_RANK", "Open MPI"),
             ("PMI_RANK", "MPICH"), ("PMI_FD", "MPICH"))


def launcher(env) -> tuple[str, str] | None:
    """(MPI family, the variable that says so) of the launcher that started this process."""
    for key, family in LAUNCHERS:
        if key in env:
            return family, key
    return None


def mpi_library() -> str:
    """First line of the MPI library's version string, read without initialising MPI."""
    import mpi4py
    mpi4py.rc.initialize = False
    first = import_mpi().Get_library_version().strip().splitlines()[0]
    return " ".join(first.replace("Version:", "").split())


def foreign_launch(env, prog: str = "lptrain") -> str | None:
    """A one-line explanation if a different MPI's launcher started `prog`, else None.

    Checked before MPI is initialised: a rank of MPICH-built mpi4py started by
    Open MPI's mpirun would otherwise abort inside MPI_Init or run as P
    independent one-rank jobs.
    """
    found = launcher(env)
    if found is None or found[0] == "MPICH":
        return None
    library = mpi_library()
    if found[0] in library:
        _init_after_check()
        return None
    import sys
    from pathlib import Path
    bin_dir = Path(sys.executable).parent
    return (f"started by {found[0]}'s launcher ({found[1]} is set), but lptrain's mpi4py is "
            f"built for {library}: launch it with {bin_dir / 'mpirun'} -n P "
            f"{bin_dir / prog} ... (or {bin_dir / 'mpiexec'})")


def says_for_launch(env) -> bool:
    """Whether this process is the one of a foreign launch (`foreign_launch`) that says
    the refusal: its rank 0 by the launcher's own variables (MPI never starts there)."""
    return env.get("OMPI_COMM_WORLD_RANK", env.get("PMIX_RANK", "0")) == "0"


def _init_after_check() -> None:
    """Initialise MPI as mpi4py would have on import (mpi_library() deferred it)."""
    import mpi4py
    from mpi4py import MPI
    mpi4py.rc.finalize = True
    if not MPI.Is_initialized():
        MPI.Init_thread()


def make_exchange(comm):
    """SerialExchange for one rank (or no communicator), else MPIExchange."""
    if comm is None or comm.Get_size() == 1:
        return SerialExchange()
    return MPIExchange(comm)


@dataclass(frozen=True)
class Exchanges:
    """The exchanges of one rank of a layer × data grid, sharing one clock.

    layer: the rank's layer group (MGRIT); data: the ranks holding the same
    layers in the other groups (sums over batch shards); world: every rank.
    """

    layer: object
    data: object
    world: object


def grid_exchanges(comm, grid) -> Exchanges:
    """Split `comm` (P = grid.size ranks) into layer groups and data groups."""
    clock = Clock()
    if comm is None or comm.Get_size() == 1:
        one = SerialExchange(clock)
        return Exchanges(one, one, one)
    layer_rank, group = grid.coords(comm.Get_rank())
    layer = comm.Split(color=group, key=layer_rank)
    data = comm.Split(color=layer_rank, key=group)
    return Exchanges(_exchange(layer, clock), _exchange(data, clock), MPIExchange(comm,
                                                                               clock=clock))


def _exchange(comm, clock):
    return SerialExchange(clock) if comm.Get_size() == 1 else MPIExchange(comm, clock=clock)


@dataclass(frozen=True)
class Node:
    """This rank's place among the ranks sharing its node (MPI COMM_TYPE_SHARED)."""

    local_rank: int
    local_size: int
    cores: int


def node_of(comm) -> Node:
    """Ranks on this node, from a shared-memory split of `comm` (one rank: itself)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)
    if comm is None or comm.Get_size() == 1:
        return Node(0, 1, cores)
    from mpi4py import MPI
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    node = Node(shared.Get_rank(), shared.Get_size(), cores)
    shared.Free()
    return node


def threads_per_rank(node: Node, env: dict) -> int:
    """OMP_NUM_THREADS if set, else the node's cores shared by its ranks (at least 1)."""
    given = env.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, node.cores // node.local_size)


def limit_threads(node: Node) -> int:
    """Set torch's intra-op threads for this rank (also on one rank); returns them."""
    import torch
    n = threads_per_rank(node, os.environ)
    torch.set_num_threads(n)
    return n


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
    m_trim_threshold, m_mmap_threshold = -1, -3
    try:        # the process's own symbols, libc's among them (no library search)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(m_mmap_threshold, MMAP_ABOVE)) and \
        bool(mallopt(m_trim_threshold, 2 ** 31 - 1))


MMAP_ABOVE = 256 * 2 ** 20     # bytes: larger blocks are mapped (and unmapped on free)
