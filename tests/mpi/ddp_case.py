"""LayerParallel inside torch's DistributedDataParallel on a layer × data grid.

Run under mpiexec -n 4 (in tests/mpi/four_ranks.py's launch, or alone with argv[1] the
output file): rank 0 keeps {grid: results} for a 1 × 2 grid (ranks 0 and 1), a 2 × 2
grid (all four), and the error a DDP over all four ranks of a 2 × 2 grid raises (its
group spans both layer ranks).  The pytest side compares the gradients with `reference()`: the whole batch in one process.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from lptrain.errors import ConfigError  # noqa: E402
from lptrain.mgrit.options import MGRITOptions  # noqa: E402
from lptrain.parallel.grid import Grid  # noqa: E402
from lptrain.parallel.lp_module import LayerParallel  # noqa: E402
from sizes import idle_barrier  # noqa: E402

N, BATCH, WIDTH = 16, 12, 5
OPTIONS = dict(levels=3, cfactor0=2, cfactor=2, tol=1e-13, max_iter=80, adj_tol=1e-13)


def layer(n):
    gen = torch.Generator().manual_seed(10 + n)
    m = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()).double()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return m


def network(comm) -> nn.Sequential:
    """An opening (held by every rank) and the layer-parallel body."""
    torch.manual_seed(0)
    opening = nn.Linear(WIDTH, WIDTH).double()
    return nn.Sequential(opening, LayerParallel(layer, T=1.0, n_layers=N, comm=comm,
                                                mgrit=MGRITOptions(**OPTIONS)))


def batch():
    return torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(3),
                       dtype=torch.float64)


def loss_of(out, data: int):
    """Σ out² / BATCH of the whole batch, as a mean over `data` shards."""
    return (out ** 2).sum() * (data / BATCH)


def gradients(net) -> dict:
    """{name: gradient} of the opening and of this rank's layers (by layer index)."""
    body = net[1]
    out = {f"opening.{k}": p.grad.clone() for k, p in net[0].named_parameters()}
    out.update({f"layer.{n}.{k}": p.grad.clone() for n in body.owned
                for k, p in body.steps.module(n).named_parameters()})
    return out


def reference() -> dict:
    net = network(None)
    loss_of(net(batch()), 1).backward()
    return gradients(net)


def on_grid(comm, grid: Grid, ddp_group: str = "data") -> dict:
    """Gradients of every layer (gathered) after one DDP backward; or the ConfigError."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from lptrain.parallel.ddp import data_process_group
    layer_rank, data = grid.coords(comm.Get_rank())
    group = data_process_group(comm, grid)
    net = network(comm.Split(color=data, key=layer_rank))
    ddp = DDP(net, process_group=group if ddp_group == "data" else None)
    shard = batch().view(grid.data, BATCH // grid.data, WIDTH)[data]
    try:
        loss_of(ddp(shard), grid.data).backward()
    except ConfigError as exc:
        return {"error": str(exc)}
    out = {}
    for part in comm.allgather(gradients(net)):
        out.update(part)
    return out


def on_grids(comm) -> dict:
    """{grid-group: rank 0's results} of the three grids on the first ranks of `comm`
    (four of them)."""
    import torch.distributed as dist
    from mpi4py import MPI

    results = {}
    for grid, ddp_group in [(Grid(1, 2), "data"), (Grid(2, 2), "data"), (Grid(2, 2), "world")]:
        sub = comm.Split(0 if comm.Get_rank() < grid.size else MPI.UNDEFINED, comm.Get_rank())
        if sub != MPI.COMM_NULL:
            got = on_grid(sub, grid, ddp_group)
            if sub.Get_rank() == 0:
                results[f"{grid}-{ddp_group}"] = got
            dist.destroy_process_group()
            sub.Free()
        idle_barrier(comm)
    return results


def main() -> None:
    from lptrain.parallel.context import world
    comm = world()
    results = on_grids(comm)
    if comm.Get_rank() == 0:
        torch.save(results, sys.argv[1])


if __name__ == "__main__":
    main()
