"""run(cfg, comm, run_dir): wire data, network, mode, optimizer and metrics; no Hydra here."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from omegaconf import OmegaConf

from lptrain.config.schema import Config
from lptrain.data import load_dataset
from lptrain.errors import ConfigError, RunFileError, require
from lptrain.metrics import schema as ms
from lptrain.metrics.console import Console
from lptrain.metrics.writer import open_writer
from lptrain.model.network import ResNet
from lptrain.model.saved import MODEL_FILE, model_record, save_torch
from lptrain.parallel.context import make_exchange
from lptrain.train.guard import Progress
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


def run(cfg, comm, run_dir: Path, stop=None):
    """Train one configuration; rank 0 writes run_dir/metrics.h5 and run_dir/model.pt.

    `stop` (a train.guard.StopSignals) ends the run after the iteration at which any
    rank received SIGINT/SIGTERM (Interrupted). Returns the Outcome.
    """
    opts = options(cfg)
    ex, data, net, theta, oracle, optimizer = build(opts, comm)
    rank0 = ex.rank == 0 if comm is None else comm.Get_rank() == 0
    attrs = {ms.MODE: opts.mode.name, ms.WORLD_SIZE: ex.size, ms.SEED: opts.seed,
             ms.CONFIG: OmegaConf.to_yaml(cfg), ms.DATASET_SOURCE: data.source,
             ms.STEP_KERNEL: net.stepper(theta).implementation()}
    path = Path(run_dir) / ms.FILE_NAME
    title = f"{opts.mode.name} {data.name} N={opts.network.layers}"
    progress = Progress(theta)
    saver = ModelSaver(Path(run_dir) / MODEL_FILE, net, OmegaConf.to_yaml(cfg, resolve=True),
                       opts.dtype, data, rank0)
    with open_writer(path, attrs, enabled=rank0) as writer, \
            Console(rank0, opts.train.iterations, title) as console:
        try:
            _, outcome = train(theta, optimizer, oracle, data, opts, writer, console, ex,
                               progress, stop)
        except BaseException:
            saver.save_quietly(progress)
            raise
        saver.save(progress, ex)
        console.close()
        console.summary({"iterations": outcome.iterations, "objective": outcome.objective,
                         "training loss": outcome.loss,
                         "training accuracy": outcome.accuracy,
                         "validation accuracy": outcome.val_accuracy,
                         "best validation accuracy": outcome.best_val_accuracy,
                         "wall time [s]": outcome.wall_time,
                         "time / iteration [s]": outcome.wall_time / outcome.iterations})
        # lines of their own: a table cell would fold a long path
        console.message(f"metrics: {path}")
        console.message(f"model: {saver.path}")
    return outcome


class ModelSaver:
    """Writes model.pt on rank 0 from a Progress (the last good parameters)."""

    def __init__(self, path: Path, net, config_yaml: str, dtype: str, data, enabled: bool):
        self.path, self.net, self.config_yaml = path, net, config_yaml
        self.dtype, self.data, self.enabled = dtype, data, enabled

    def _write(self, progress) -> None:
        save_torch(model_record(progress.theta, self.net, self.config_yaml, self.dtype,
                                self.data, progress.iteration), self.path)

    def save(self, progress, exchange) -> None:
        """Write, and fail on every rank alike (RunFileError) if rank 0 could not."""
        error = None
        if self.enabled:
            try:
                self._write(progress)
            except RunFileError as exc:
                error = exc
        failed = exchange.allreduce_sum(float(error is not None)) if exchange.size > 1 \
            else float(error is not None)
        if error is not None:
            raise error
        if failed:
            raise RunFileError(f"{self.path}: rank 0 could not write the model")

    def save_quietly(self, progress) -> None:
        """Best effort while another error ends the run: that error is the one reported."""
        if self.enabled:
            try:
                self._write(progress)
            except Exception:  # noqa: BLE001 - the run's own error is already propagating
                pass
