"""Checks of a run that need no data: grid, device, threads and memory, before loading.

Every rank computes the same plan (the memory limit is the smallest over
all ranks), so an impossible run stops on every rank with the same one-line
ConfigError before any data is read or any large tensor allocated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from lptrain.data.base import Sizes, dataset_sizes
from lptrain.errors import ConfigError
from lptrain.model.dtypes import DTYPES
from lptrain.model.network import ResNet
from lptrain.modes import LAYERED, SIMULTANEOUS
from lptrain.parallel import memory
from lptrain.parallel.auto import Recorded, agreed_grid, timer_for
from lptrain.parallel.context import Node, make_exchange, node_of
from lptrain.parallel.grid import Grid, c_intervals, candidates, coarse_steps, run_grids
from lptrain.train import shards
from lptrain.train.batching import check_batch
from lptrain.train.collective import collectively



@dataclass(frozen=True)
class Plan:
    grid: Grid
    sizes: Sizes
    node: Node
    device: str            # cpu or cuda:<local rank>
    need: memory.Need      # this rank's estimate on the grid
    limit: float           # bytes a rank may use (smallest over the ranks)
    auto: bool = False     # the grid was chosen among several (parallel.layer_ranks=auto)
    notes: list = field(default_factory=list)    # rank 0: how it was chosen


def device_for(kind: str, node: Node) -> str:
    """`cpu`, or `cuda:<local rank>`; ConfigError where CUDA or the device is missing."""
    if kind != "cuda":
        return kind
    import torch
    if not torch.cuda.is_available():
        raise ConfigError("device='cuda': no CUDA device is available here (torch "
                          f"{torch.__version__} sees none); use device=cpu")
    count = torch.cuda.device_count()
    if node.local_rank >= count:
        raise ConfigError(f"device='cuda': {node.local_size} ranks on a node with {count} "
                          f"CUDA device(s); start at most {count} ranks per node")
    return f"cuda:{node.local_rank}"


def need(opts, sizes: Sizes, net: ResNet, grid: Grid,
         per_eval: int | None = None) -> memory.Need:
    """This rank's memory estimate on `grid` (its data group's shard of every batch of
    `per_eval` samples; None: the configured batch)."""
    item = DTYPES[opts.dtype].itemsize
    per_eval = per_eval or opts.train.batch_size or sizes.n_train
    batch = math.ceil(per_eval / grid.data)     # validation goes in chunks of this size
    feats = math.prod(sizes.feature_shape)
    shard = (math.ceil(sizes.n_train / grid.data) + math.ceil(sizes.n_val / grid.data))
    data_bytes = shard * feats * item + source_bytes(sizes)
    # L-BFGS's pairs: each rank's part where θ splits over the ranks (train/shards.py); a
    # checkpoint passes them through rank 0 one whole vector at a time, and a resume
    # reads each rank's part only (train/stored_pairs.py): one vector more
    ranks = grid.size if shards.splits(net.layout.size) else 1
    vectors = math.ceil(2 * getattr(opts.optimizer, "memory", 0) / ranks) + 9
    warm = _kept_warm_starts(opts, sizes)
    val_chunk = min(batch, math.ceil(sizes.n_val / grid.data))
    mo = opts.mgrit
    return memory.estimate(opts.mode.name, opts.network.layers, grid.layer, batch,
                           math.prod(net.state_shape), net.layout.size, item, data_bytes,
                           vectors, warm, val_chunk, grid.size,
                           opts.mode.name == SIMULTANEOUS and mo.calibrate_every > 0,
                           c_intervals(opts.network.layers, mo.cfactor0, mo.levels,
                                       mo.min_coarse),
                           coarse_steps(opts.network.layers, mo.cfactor0, mo.cfactor,
                                        mo.levels, mo.min_coarse))


def source_bytes(sizes: Sizes) -> float:
    """What every rank's loader holds of the whole source before it cuts its shard
    (float64, twice)."""
    return sizes.read * math.prod(sizes.feature_shape) * 8 * 2


def smaller_source(dataset: str, sizes: Sizes) -> str:
    """The advice where a dataset's source is too large to hold: the keys that make it so
    (Peaks: its grid, or the drawn sets where they outnumber the grid's points)."""
    drawn = sizes.n_train + sizes.n_val
    if drawn >= sizes.n_source:
        return "use fewer samples (dataset.n_train, dataset.n_val)"
    return "use a smaller dataset" + (" (dataset.grid)" if dataset == "peaks" else "")


def data_need(sizes: Sizes, item_bytes: int = 8) -> float:
    """Bytes a process holds to load the dataset of `sizes` whole (lptrain-eval): its
    source while the loader picks the sets, and the sets."""
    return source_bytes(sizes) + sizes.read * math.prod(sizes.feature_shape) * item_bytes


def _kept_warm_starts(opts, sizes: Sizes) -> int:
    """Mini-batches whose warm starts the simultaneous mode keeps (0: none kept)."""
    if opts.mode.name != SIMULTANEOUS or opts.train.batch_size is None:
        return 0
    return min(opts.mode.warm_batches, math.ceil(sizes.n_train / opts.train.batch_size))


# kept warm starts that make checkpoints this large get a line under the run's title
LARGE_CHECKPOINT = 1e9     # bytes


def checkpoint_notes(opts, plan: Plan) -> list[str]:
    """A line under the title where the kept warm starts make every checkpoint large
    (`dataset=mnist mode=simultaneous`: all 48 batches of an epoch): rank 0 writes every
    rank's, and the new file is written beside the old one."""
    kept = _kept_warm_starts(opts, plan.sizes)
    total = plan.need.warm * plan.grid.size
    if kept == 0 or total < LARGE_CHECKPOINT:
        return []
    return [f"checkpoints: up to about {memory.gb(total)} each, the warm starts of {kept} kept "
            f"batches (mode.warm_batches); the disk needs room for two while one is "
            f"written"]


def _network(opts, sizes: Sizes, device) -> ResNet:
    """The run's network, a user's step tried in the run's dtype on `device`."""
    net = ResNet(opts.network, sizes.feature_shape, sizes.n_classes)
    if net.custom is not None:
        net.custom.steps(DTYPES[opts.dtype], device)
    return net


def plan(opts, comm) -> Plan:
    """Grid, device and memory of this run on `comm`'s ranks (ConfigError if impossible)."""
    node = node_of(comm)
    device = device_for(opts.device, node)
    sizes = dataset_sizes(opts.dataset)
    # before the split is timed (a minute on 2 ranks)
    check_batch(opts.train.batch_size, opts.optimizer.name, sizes.n_train)
    # the user's step (network=custom) is built, then tried where it will compute, on
    # each rank's device: either may fail on some ranks only, and the others must not go
    # on to wait in the next collective
    net = collectively(make_exchange(comm), lambda: _network(opts, sizes, device))
    size = 1 if comm is None else comm.Get_size()
    grids = run_grids(opts, size, opts.mode.name in LAYERED)
    limit = memory.available(node.local_size)
    if comm is not None and comm.Get_size() > 1:
        from mpi4py import MPI
        limit = comm.allreduce(limit, op=MPI.MIN)
    needs = {g: need(opts, sizes, net, g) for g in grids}
    fits = [g for g in grids if needs[g].total <= limit]
    if not fits:
        g = min(grids, key=lambda g: needs[g].total)
        raise ConfigError(f"memory: {size} rank(s) as {g.layer} layer x {g.data} data ranks "
                          f"need about {needs[g]} per rank, more than the "
                          f"{memory.gb(limit)} available to each; "
                          f"{_memory_advice(opts, sizes, net, g, needs[g], limit)}")
    made = []               # rank 0's timer, where there was a choice

    def timer() -> Recorded:
        made.append(Recorded(timer_for(opts, net, opts.mode.name)))
        return made[-1]
    grid = agreed_grid(fits, timer, comm)
    return Plan(grid, sizes, node, device, needs[grid], limit, len(fits) > 1,
                made[0].notes(grid) if made else [])


def auto_grid(opts, sizes: Sizes, net: ResNet, size: int, mode: str | None = None) -> Grid:
    """The split `parallel.layer_ranks=auto` takes on `size` ranks when every candidate
    fits in memory (`plan` drops those that do not first); `lptrain-model` prints it."""
    mode = mode or opts.mode.name
    mo = opts.mgrit
    most = c_intervals(opts.network.layers, mo.cfactor0, mo.levels, mo.min_coarse)
    grids = candidates(size, "auto", None, most, mode in LAYERED)
    return agreed_grid(grids, lambda: timer_for(opts, net, mode), None)


def _memory_advice(opts, sizes: Sizes, net: ResNet, grid: Grid, need_g: memory.Need,
                   limit: float) -> str:
    """What would make the run fit: more ranks share the states and the data, but every
    rank holds all parameters and the optimizer's vectors of their size."""
    held = need_g.base + need_g.params
    source = source_bytes(sizes)
    if held + source > limit and source > held:     # more ranks help neither: the larger
        return (f"every rank reads all {sizes.read} samples of the source "
                f"({memory.gb(source)}) before it takes its shard, so more ranks do not "
                f"help: {smaller_source(opts.dataset.name, sizes)}")
    if held + source > limit:
        return (f"every rank holds all {net.layout.size} parameters and the optimizer's "
                f"vectors ({memory.gb(held)} with the runtime), so more ranks do not help: "
                f"use a smaller network (network.width, network.channels or network.layers)"
                + (", or optimizer.memory" if hasattr(opts.optimizer, "memory") else ""))
    return (f"use more ranks (or nodes), fewer layers{_warm_hint(opts, sizes, need_g, limit)}"
            f"{_batch_hint(opts, sizes, net, grid, limit)}")


def _warm_hint(opts, sizes: Sizes, need_g: memory.Need, limit: float) -> str:
    """', fewer kept warm starts (mode.warm_batches=K)' where K of them would fit."""
    if need_g.warm <= 0:
        return ""
    kept = _kept_warm_starts(opts, sizes)
    per_batch = (need_g.warm + need_g.checkpoint) / kept     # both grow with kept batches
    k = math.floor((limit - (need_g.total - need_g.warm - need_g.checkpoint)) / per_batch)
    return f", fewer kept warm starts (mode.warm_batches={k})" if k >= 1 else ""


def _batch_hint(opts, sizes: Sizes, net: ResNet, grid: Grid, limit: float) -> str:
    """', or at most B samples per batch (...)': the largest batch that fits on `grid`."""
    lo, hi = 0, opts.train.batch_size or sizes.n_train    # need(lo) fits, need(hi) not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if need(opts, sizes, net, grid, mid).total <= limit else (lo, mid)
    if lo == 0:
        return ""
    return (f", or batches of at most {lo} samples (train.batch_size={lo} with "
            f"optimizer=sgd or adam, or dataset.n_train={lo})")
