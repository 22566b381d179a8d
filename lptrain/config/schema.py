"""Typed configuration schema: the dataclasses Hydra validates every run against."""
from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from lptrain.errors import ConfigError, one_of, require
from lptrain.metrics.tensorboard import LOGGERS
from lptrain.mgrit.options import MGRITOptions
from lptrain.model.dtypes import DTYPES as _TORCH_DTYPES
from lptrain.model.network import NetworkOptions
from lptrain.modes import MODES, SERIAL
from lptrain.train.schedules import SCHEDULES

DTYPES = tuple(_TORCH_DTYPES)
DEVICES = ("cpu", "cuda")


@dataclass
class LBFGSOptions:
    name: str = "lbfgs"
    memory: int = 10         # stored (s, y) pairs
    c1: float = 1e-4         # Armijo constant
    step0: float = 1.0       # first trial step
    backtrack: float = 0.5   # step factor per failed trial
    max_ls: int = 20         # line-search trials
    gtol: float = 1e-6       # stop when the gradient norm falls below

    def __post_init__(self):
        require(self.memory >= 1, "optimizer.memory", self.memory, "must be >= 1")
        require(0 < self.c1 < 1, "optimizer.c1", self.c1, "must be in (0, 1)")
        require(self.step0 > 0, "optimizer.step0", self.step0, "must be > 0")
        require(0 < self.backtrack < 1, "optimizer.backtrack", self.backtrack,
                "must be in (0, 1)")
        require(self.max_ls >= 1, "optimizer.max_ls", self.max_ls, "must be >= 1")
        require(self.gtol >= 0, "optimizer.gtol", self.gtol, "must be >= 0")


@dataclass
class RateOptions:
    """A first-order optimizer's learning rate and its schedule over train.iterations."""
    name: str = ""
    lr: float = 0.01
    schedule: str = "constant"   # constant | cosine | linear (lptrain/train/schedules.py)
    lr_min: float = 0.0          # the rate a schedule falls to, after the last iteration

    def __post_init__(self):
        require(self.lr > 0, "optimizer.lr", self.lr, "must be > 0")
        require(self.schedule in SCHEDULES, "optimizer.schedule", self.schedule,
                one_of(SCHEDULES))
        require(0 <= self.lr_min <= self.lr, "optimizer.lr_min", self.lr_min,
                f"must be in [0, optimizer.lr = {self.lr}]")


@dataclass
class SGDOptions(RateOptions):
    name: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    nesterov: bool = False

    def __post_init__(self):
        super().__post_init__()
        require(0 <= self.momentum < 1, "optimizer.momentum", self.momentum,
                "must be in [0, 1)")
        if self.nesterov and self.momentum == 0:       # as typed: true, not True
            raise ConfigError("optimizer.nesterov=true: needs optimizer.momentum > 0 "
                              "(without momentum it is plain SGD)")


@dataclass
class AdamOptions(RateOptions):
    name: str = "adam"
    lr: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self):
        super().__post_init__()
        require(0 <= self.beta1 < 1, "optimizer.beta1", self.beta1, "must be in [0, 1)")
        require(0 <= self.beta2 < 1, "optimizer.beta2", self.beta2, "must be in [0, 1)")
        require(self.eps > 0, "optimizer.eps", self.eps, "must be > 0")


OPTIMIZER_OPTIONS = {"lbfgs": LBFGSOptions, "sgd": SGDOptions, "adam": AdamOptions}


@dataclass
class ModeOptions:
    name: str = SERIAL           # one of lptrain/modes.py MODES
    warm_batches: int = 64       # simultaneous + mini-batches: batches whose states are kept

    def __post_init__(self):
        require(self.name in MODES, "mode", self.name, one_of(MODES))
        require(self.warm_batches >= 1, "mode.warm_batches", self.warm_batches,
                "must be >= 1 (the batch being trained keeps its states between its "
                "solves)")


@dataclass
class TrainOptions:
    iterations: int = 100
    batch_size: Optional[int] = None  # None: full batch
    patience: int = 20           # stalled after this many iterations without a better
                                 # objective (epochs with mini-batches); 0 = never
    fail_on_stall: bool = False  # a stalled run exits non-zero (else 0, status `stalled`)

    def __post_init__(self):
        require(self.iterations > 0, "train.iterations", self.iterations, "must be positive")
        require(self.patience >= 0, "train.patience", self.patience, "must be >= 0")
        require(self.batch_size is None or self.batch_size > 0, "train.batch_size",
                self.batch_size, "must be positive or null (full batch)")


@dataclass
class ParallelOptions:
    layer_ranks: str = "auto"        # auto | ranks per layer group (MGRIT over the layers)
    data_ranks: Optional[int] = None  # layer groups, each on a batch shard (None: P / layer)

    def __post_init__(self):
        from lptrain.parallel.grid import parse_layer_ranks
        parse_layer_ranks(self.layer_ranks)
        require(self.data_ranks is None or self.data_ranks >= 1, "parallel.data_ranks",
                self.data_ranks, "must be a positive integer or null")


@dataclass
class Config:
    dataset: Any = MISSING
    network: NetworkOptions = MISSING
    optimizer: Any = MISSING
    mode: ModeOptions = MISSING
    mgrit: MGRITOptions = MISSING
    train: TrainOptions = field(default_factory=TrainOptions)
    parallel: ParallelOptions = field(default_factory=ParallelOptions)
    eval_every: int = 10
    checkpoint_every: Optional[int] = None   # iterations; null: automatic (< 2 % of the time)
    seed: int = 0
    dtype: str = "float64"
    device: str = "cpu"
    logger: str = "none"        # none | tensorboard: scalars beside metrics.h5

    def __post_init__(self):
        require(self.eval_every > 0, "eval_every", self.eval_every, "must be positive")
        require(self.checkpoint_every is None or self.checkpoint_every >= 0,
                "checkpoint_every", self.checkpoint_every,
                "must be >= 0 (0: only when stopped and at the end) or null (automatic)")
        require(self.dtype in DTYPES, "dtype", self.dtype, one_of(DTYPES))
        require(self.device in DEVICES, "device", self.device, one_of(DEVICES))
        require(0 <= self.seed < 2 ** 32, "seed", self.seed, "must be in [0, 2**32 - 1]")
        require(self.logger in LOGGERS, "logger", self.logger, one_of(LOGGERS))


def dataset_options() -> dict[str, type]:
    """Options dataclass of every registered dataset, from its loader's signature."""
    from lptrain.data import LOADERS
    return {name: typing.get_type_hints(fn)["options"] for name, fn in LOADERS.items()}


def check_chosen(group: str, chosen, kinds: dict[str, type]) -> None:
    """`chosen.name` must name the kind whose options `chosen` holds: `dataset.name=mnist`
    alone renames Peaks' options instead of choosing MNIST (ConfigError)."""
    if kinds.get(chosen.name) is not type(chosen):
        own = next((name for name, cls in kinds.items() if cls is type(chosen)), "?")
        other = chosen.name if chosen.name in kinds else "NAME"
        raise ConfigError(f"{group}.name={chosen.name!r}: the {group} chosen is {own}; "
                          f"choose another with {group}={other} (`lptrain --help` lists "
                          f"them)")


def schema_nodes() -> dict[str, dict[str, type]]:
    """group -> {node name: options dataclass} of the schema nodes the YAML configs of
    that group extend; they are not choices (`mode=mode_schema` is refused)."""
    return {"dataset": {f"{name}_schema": cls for name, cls in dataset_options().items()},
            "optimizer": {f"{name}_schema": cls for name, cls in OPTIMIZER_OPTIONS.items()},
            "network": {"network_schema": NetworkOptions},
            "mode": {"mode_schema": ModeOptions},
            "mgrit": {"mgrit_schema": MGRITOptions}}


def register_configs() -> None:
    """Put the schema into Hydra's ConfigStore (YAML files extend these nodes)."""
    from hydra.core.config_store import ConfigStore
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    for group, nodes in schema_nodes().items():
        for name, cls in nodes.items():
            cs.store(group=group, name=name, node=cls)
