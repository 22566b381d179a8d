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
from lptrain.parallel.context import make_exchange
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


def _check(opts: Config, data) -> None:
    n = data.x_train.shape[0]
    bs = opts.train.batch_size
    require(bs is None or bs <= n, "train.batch_size", bs,
            f"larger than the {n} training samples")
    require(bs is None or opts.optimizer.name != "lbfgs", "train.batch_size", bs,
            "optimizer=lbfgs is full batch: set train.batch_size=null or use sgd/adam")
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda': no CUDA device is available here")


def build(opts: Config, comm):
    """Data, network, θ₀, oracle and optimizer for these options."""
    ex = make_exchange(comm)
    data = _cast(load_dataset(opts.dataset, opts.seed), DTYPES[opts.dtype], opts.device)
    _check(opts, data)
    net = ResNet(opts.network, data.feature_shape, data.n_classes)
    theta = net.init_params(opts.seed, DTYPES[opts.dtype], opts.device)
    oracle = make_oracle(opts.mode, net, ex, opts.mgrit, opts.train.batch_size is not None)
    return ex, data, net, theta, oracle, OPTIMIZERS[opts.optimizer.name](opts.optimizer)


def run(cfg, comm, run_dir: Path):
    """Train one configuration; rank 0 writes run_dir/metrics.h5. Returns the Outcome."""
    opts = options(cfg)
    ex, data, net, theta, oracle, optimizer = build(opts, comm)
    rank0 = ex.rank == 0 if comm is None else comm.Get_rank() == 0
    attrs = {ms.MODE: opts.mode.name, ms.WORLD_SIZE: ex.size, ms.SEED: opts.seed,
             ms.CONFIG: OmegaConf.to_yaml(cfg), ms.DATASET_SOURCE: data.source,
             ms.STEP_KERNEL: net.stepper(theta).implementation()}
    path = Path(run_dir) / ms.FILE_NAME
    title = f"{opts.mode.name} {data.name} N={opts.network.layers}"
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
