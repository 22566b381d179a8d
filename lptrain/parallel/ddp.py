"""torch.distributed beside MPI: a process group per data group of a layer × data grid,
for `torch.nn.parallel.DistributedDataParallel` around a network with `LayerParallel`.

A layer group's ranks hold different layers, so DDP must average gradients only over
the ranks holding the same layers: the data group (parallel/grid.py).  torch.distributed
is initialised over the ranks of an MPI communicator (same rank numbers; a TCP store on
rank 0 whose port the others receive through MPI), and every data group becomes one
process group.  `check_ddp_group` refuses a DDP whose group spans different layers.
"""
from __future__ import annotations

import os
import socket

from lptrain.errors import ConfigError
from lptrain.parallel.grid import Grid


def data_group_ranks(grid: Grid) -> list[list[int]]:
    """World ranks of every data group, by layer rank (pure: grid.coords' layout)."""
    return [[layer + grid.layer * d for d in range(grid.data)] for layer in range(grid.layer)]


def init_torch_distributed(comm, backend: str = "gloo", timeout_s: float = 300.0) -> None:
    """torch.distributed over `comm`'s ranks (rank r of comm is rank r there), unless it
    is initialised already (then it must have comm's ranks).  The store listens on rank
    0's MASTER_ADDR if set, else its host name."""
    import datetime

    import torch.distributed as dist
    size, rank = comm.Get_size(), comm.Get_rank()
    if dist.is_initialized():
        if dist.get_world_size() != size or dist.get_rank() != rank:
            raise ConfigError(f"torch.distributed is initialised with rank "
                              f"{dist.get_rank()} of {dist.get_world_size()}, this MPI "
                              f"communicator has rank {rank} of {size}: they must agree")
        return
    timeout = datetime.timedelta(seconds=timeout_s)
    host = comm.bcast(os.environ.get("MASTER_ADDR") or socket.gethostname()
                      if rank == 0 else None, root=0)
    store = dist.TCPStore(host, 0, size, is_master=True, timeout=timeout,
                          wait_for_workers=False) if rank == 0 else None
    port = comm.bcast(store.port if rank == 0 else None, root=0)
    if rank != 0:
        store = dist.TCPStore(host, port, size, is_master=False, timeout=timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                            timeout=timeout)


def data_process_group(comm, grid: Grid, backend: str = "gloo"):
    """This rank's data group as a torch.distributed process group, for
    `DistributedDataParallel(net, process_group=...)` (collective over `comm`, which
    must have grid.size ranks; initialises torch.distributed over it if needed)."""
    import torch.distributed as dist
    if comm.Get_size() != grid.size:
        raise ConfigError(f"grid {grid} needs {grid.size} ranks, the communicator has "
                          f"{comm.Get_size()}")
    init_torch_distributed(comm, backend)
    layer_rank = grid.coords(comm.Get_rank())[0]
    mine = None
    for layer, ranks in enumerate(data_group_ranks(grid)):    # every rank, same order
        group = dist.new_group(ranks, backend=backend)
        if layer == layer_rank:
            mine = group
    return mine


def check_ddp_group(module, layers: range, checked: set) -> None:
    """ConfigError if a DistributedDataParallel whose forward is running around `module`
    averages over ranks that hold other layers than `layers` (once per group: `checked`
    holds the ids of the groups found sound)."""
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP
    except ImportError:
        return
    active = getattr(DDP, "_get_active_ddp_module", lambda: None)()
    if active is None or not any(m is module for m in active.module.modules()):
        return
    group = active.process_group
    if id(group) in checked:
        return
    import torch.distributed as dist
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, (layers.start, layers.stop), group=group)
    others = sorted({r for r in everyone if r != (layers.start, layers.stop)})
    if others:
        spans = ", ".join(f"{a}..{b - 1}" for a, b in others)
        raise ConfigError(
            f"DistributedDataParallel averages over ranks holding layers {spans} as well "
            f"as this rank's {layers.start}..{layers.stop - 1}: give it the data group, "
            f"DistributedDataParallel(net, process_group=lptrain.parallel.ddp."
            f"data_process_group(comm, Grid(layer, data))), or use lptrain's own data "
            f"groups (lptrain.parallel.lp_module.average_gradients)")
    checked.add(id(group))
