"""run(cfg, comm, run_dir): wire data, network, mode, optimizer and metrics; no Hydra here."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from omegaconf import OmegaConf

from lptrain.config.schema import Config
from lptrain.data import load_dataset
from lptrain.errors import ConfigError, StalledError, require
from lptrain.metrics import schema as ms
from lptrain.metrics.console import Console
from lptrain.metrics.writer import open_writer
from lptrain.model.network import ResNet
from lptrain import preflight
from lptrain.parallel.context import grid_exchanges
from lptrain.parallel.grid import shard
from lptrain.preflight import Plan
from lptrain.train.data_parallel import DataParallelOracle
from lptrain.train.loop import train
from lptrain.train.optimizers import OPTIMIZERS
from lptrain.train.oracles import make_oracle

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def options(cfg) -> Config:
    """The typed, validated options of a composed config (raises ConfigError)."""
    unknown = _unknown_keys(cfg)
    if unknown:
        raise ConfigError(f"{unknown[0]}: not an lptrain option (added with '+'?); "
                          f"`lptrain --cfg job` lists the options")
    opts = OmegaConf.to_object(cfg)
    if not isinstance(opts, Config):
        raise ConfigError(f"config: expected the lptrain schema, got {type(opts).__name__}")
    return opts


def _unknown_keys(cfg, path: str = "") -> list[str]:
    """Keys of cfg that its schema dataclass does not have (Hydra's '+key=value' adds
    them past the schema and to_object would drop them silently)."""
    typ = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(typ):
        return []
    names = {f.name for f in dataclasses.fields(typ)}
    found = []
    for key in cfg.keys():
        if key not in names:
            found.append(f"{path}{key}")
        elif OmegaConf.is_dict(node := cfg._get_node(key)):
            found += _unknown_keys(node, f"{path}{key}.")
    return found


def _cast(data, dtype, device):
    def f(t):
        return t.to(dtype=dtype, device=device)
    return data.__class__(data.name, f(data.x_train), data.y_train.to(device), f(data.x_val),
                          data.y_val.to(device), data.n_classes, data.source, data.meta)


def _check(opts: Config, n_train: int) -> None:
    bs = opts.train.batch_size
    require(bs is None or bs <= n_train, "train.batch_size", bs,
            f"larger than the {n_train} training samples")
    require(bs is None or opts.optimizer.name != "lbfgs", "train.batch_size", bs,
            "optimizer=lbfgs is full batch: set train.batch_size=null or use sgd/adam")


def _shard(data, grid, group: int):
    """The data group's contiguous shard of the training and validation samples."""
    def part(x, y):
        lo, hi = shard(x.shape[0], grid.data, group)
        return x[lo:hi].clone(), y[lo:hi].clone()
    n = data.x_train.shape[0]
    (xt, yt), (xv, yv) = part(data.x_train, data.y_train), part(data.x_val, data.y_val)
    meta = {**data.meta, "shard": (shard(n, grid.data, group)[0], n)}
    return data.__class__(data.name, xt, yt, xv, yv, data.n_classes, data.source, meta)


def build(opts: Config, comm, plan: Plan | None = None):
    """World exchange, data shard, network, θ₀, oracle and optimizer for these options."""
    plan = plan or preflight.plan(opts, comm)
    _check(opts, plan.sizes.n_train)
    ex = grid_exchanges(comm, plan.grid)
    group = plan.grid.coords(ex.world.rank)[1]
    data = _shard(load_dataset(opts.dataset, opts.seed), plan.grid, group)
    data = _cast(data, DTYPES[opts.dtype], plan.device)
    net = ResNet(opts.network, data.feature_shape, data.n_classes)
    theta = net.init_params(opts.seed, DTYPES[opts.dtype], plan.device)
    oracle = make_oracle(opts.mode, net, ex.layer, opts.mgrit, opts.train.batch_size is not None)
    if plan.grid.data > 1:
        oracle = DataParallelOracle(oracle, net, ex.data)
    return ex.world, data, net, theta, oracle, OPTIMIZERS[opts.optimizer.name](opts.optimizer)


def run(cfg, comm, run_dir: Path):
    """Train one configuration; rank 0 writes run_dir/metrics.h5. Returns the Outcome."""
    opts = options(cfg)
    plan = preflight.plan(opts, comm)
    ex, data, net, theta, oracle, optimizer = build(opts, comm, plan)
    rank0 = ex.rank == 0
    grid = plan.grid
    attrs = {ms.MODE: opts.mode.name, ms.WORLD_SIZE: grid.size, ms.LAYER_RANKS: grid.layer,
             ms.DATA_RANKS: grid.data, ms.SEED: opts.seed,
             ms.CONFIG: OmegaConf.to_yaml(cfg), ms.DATASET_SOURCE: data.source,
             ms.STEP_KERNEL: net.stepper(theta).implementation()}
    path = Path(run_dir) / ms.FILE_NAME
    title = (f"{opts.mode.name} {data.name} N={opts.network.layers} "
             f"P={grid.size} ({grid.layer} layer x {grid.data} data)")
    with open_writer(path, attrs, enabled=rank0) as writer, \
            Console(rank0, opts.train.iterations, title) as console:
        _, outcome = train(theta, optimizer, oracle, data, opts, writer, console, ex)
        console.close()
        console.summary({"iterations": outcome.iterations, "objective": outcome.objective,
                         "training loss": outcome.loss,
                         "training accuracy": outcome.accuracy,
                         "validation accuracy": outcome.val_accuracy,
                         "best validation accuracy": outcome.best_val_accuracy,
                         "wall time [s]": outcome.wall_time,
                         "time / iteration [s]": outcome.wall_time / outcome.iterations})
        # a line of its own: a table cell would fold a long path
        console.message(f"metrics: {path}")
        if outcome.stalled:
            writer.close(ms.STALLED, error=outcome.stalled)
            console.message(_stall_message(opts, outcome))
    if outcome.stalled and opts.train.fail_on_stall:
        raise StalledError(_stall_message(opts, outcome))
    return outcome


def _stall_message(opts: Config, outcome) -> str:
    """One line: that the run stalled, why, and what to try."""
    hint = ("try mode=mgrit, more mgrit.fwd_iters/adj_iters or mgrit.adaptive=true"
            if opts.mode.name == "simultaneous" else
            "the optimum may be reached (lower optimizer.gtol), or try another optimizer, "
            "learning rate or network.init")
    return f"stalled after {outcome.iterations} iterations: {outcome.stalled}; {hint} " \
           f"(train.patience={opts.train.patience})"
