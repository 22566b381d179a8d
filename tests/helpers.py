"""Small float64 problems shared by the numerical tests."""
from __future__ import annotations

import copy
import functools
import gzip
import io
import signal
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch import nn

from lptrain.metrics import schema as s
from lptrain.metrics.writer import MetricsWriter, NullWriter
from lptrain.model.network import NetworkOptions, ResNet
from lptrain.model.serial import adjoint, propagate
from lptrain.train.guard import StopSignals


# the environment variables by which rich takes a stream for a terminal (or not), and a
# run's title as the console shows it (tests/unit/test_metrics_console_*.py)
TTY_VARS = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "NO_COLOR")
CONSOLE_TITLE = "simultaneous peaks N=32 P=4 (2 layer x 2 data)"


class MemoryWriter(NullWriter):
    """Keeps the train, validation and mgrit rows in lists of an in-process run
    (tests and bench/common.py)."""

    def __init__(self):
        self.train, self.val, self.mgrit = [], [], []

    def log_train(self, **fields) -> None:
        self.train.append(fields)

    def log_validation(self, **fields) -> None:
        self.val.append(fields)

    def log_mgrit(self, **fields) -> None:
        self.mgrit.append(fields)


def dense_net(layers=8, width=4, features=2, classes=3, T=2.0, activation="tanh",
              bias="vector", scale=0.5, seed=1, **kw):
    o = NetworkOptions(name="dense", width=width, layers=layers, T=T, activation=activation,
                       bias=bias, init="normal", init_opening=scale, init_hidden=scale,
                       init_classifier=scale, **kw)
    net = ResNet(o, (features,), classes)
    return net, net.init_params(seed)


def conv_net(layers=4, channels=2, classes=3, T=1.0, activation="tanh", opening="conv",
             bias="vector", scale=0.3, seed=1, **kw):
    o = NetworkOptions(name="conv", channels=channels, layers=layers, T=T,
                       activation=activation, bias=bias, opening=opening, init="normal",
                       init_opening=scale, init_hidden=scale, init_classifier=scale, **kw)
    net = ResNet(o, (1, 6, 6), classes)
    return net, net.init_params(seed)


def batch(net, n=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *net.in_shape, generator=gen, dtype=torch.float64)
    y = torch.randint(net.n_classes, (n,), generator=gen)
    return x, y


def copies_of(model, x):
    """What users make of a loaded model: a deep copy, a torch.save/torch.load round trip
    and a torch.export program, each as a module to call on x."""
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return {"deepcopy": copy.deepcopy(model), "pickle": torch.load(buf, weights_only=False),
            "export": torch.export.export(model, (x,)).module()}


def title_inside(fig) -> bool:
    """Whether the figure's title, drawn, lies within the figure's width."""
    fig.canvas.draw()
    box = fig._suptitle.get_window_extent(fig.canvas.get_renderer())
    return box.x0 >= 0 and box.x1 <= fig.bbox.width


FAKE_RUN_CONFIG = ("mode:\n  name: {mode}\noptimizer:\n  maxiter: 4\n  lr: {lr}\n"
                   "run_dir: /tmp/{mode}\n")


def fake_run(run_dir: Path, mode: str, step_time: float, n: int = 4, lr: float = 1.0,
             ranks: int = 1, close: bool = True, timing: bool = False) -> Path:
    """A run directory whose metrics.h5 holds n iterations of known numbers (with
    `timing`, iteration i's timing/ row gives rank r i·(r+1) s computing, 0.1·i s
    communicating, 0.2·r s waiting; MGRIT levels 16/4 outside serial mode; the ranks
    one layer group outside serial mode, data groups in it)."""
    run_dir.mkdir(parents=True)
    path = run_dir / s.FILE_NAME
    layer = 1 if mode == s.MODE_SERIAL else ranks
    w = MetricsWriter(path, {s.MODE: mode, s.WORLD_SIZE: ranks, s.SEED: 0,
                             s.CONFIG: FAKE_RUN_CONFIG.format(mode=mode, lr=lr),
                             s.MGRIT_LEVELS: None if mode == s.MODE_SERIAL else "16/4",
                             s.LAYER_RANKS: layer, s.DATA_RANKS: ranks // layer})
    for i in range(1, n + 1):
        w.log_train(iteration=i, objective=1.0 / i, loss=0.5 / i, accuracy=0.2 * i,
                    step_time=step_time, wall_time=step_time * i + 0.5)
        if i % 2 == 0:
            w.log_validation(i, 0.6 / i, 0.9 if i == 2 else 0.8)
        if mode != s.MODE_SERIAL:
            w.log_mgrit(iteration=i, fwd_history=[1.0, 0.1][: 1 + i % 2],
                        adj_history=[1.0, 0.1, 0.01])
        if timing:
            w.log_timing(i, [i * (r + 1.0) for r in range(ranks)], [0.1 * i] * ranks,
                         [0.2 * r for r in range(ranks)])
    if close:
        w.close()
    return path


# small LayerParallel problems of tests/unit/test_lp_module_*.py: converged MGRIT options,
# seeded dense layers and inputs, gradients and a relative comparison
CONVERGED = dict(levels=3, cfactor0=2, cfactor=2, tol=1e-13, max_iter=60)


def drawn(m, n, scale=0.6):
    """m with its parameters drawn from a generator seeded with n."""
    gen = torch.Generator().manual_seed(n)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return m


def dense(n, width=3, scale=0.6, dtype=torch.float64):
    """Layer n of a LayerParallel: Linear(width, width) and tanh, drawn with seed n."""
    return drawn(nn.Sequential(nn.Linear(width, width), nn.Tanh()).to(dtype), n, scale)


def inputs(*shape, seed=0, dtype=torch.float64):
    """A seeded normal tensor of this shape."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def grads(loss, mod, u0):
    """The gradient of loss with respect to u0 and then the module's parameters."""
    return torch.autograd.grad(loss, [u0, *mod.parameters()])


def close(a, b, rel=1e-10):
    """Whether a equals b to rel times b's largest magnitude."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max()) <= rel * max(float(b.abs().max()), 1e-30)


# MGRIT hierarchies, cycles and relaxations of tests/unit/test_mgrit_*.py: two to five
# levels, V and F cycles, with and without C-relaxation, injected and averaged weights
MGRIT_CONFIGS = [dict(levels=2, cfactor0=4, nrelax0=0),
                 dict(levels=3, cfactor0=4, cfactor=2, nrelax0=1, nrelax=1),
                 dict(levels=4, cfactor0=2, cfactor=2, cycle="F"),
                 dict(levels=3, cfactor0=3, cfactor=3, coarse_weights="average"),
                 dict(levels=5, cfactor0=2, cfactor=2, skip_first_down=False, min_coarse=1)]


def fake_costs(batch: int):
    """The speedup model's KernelCosts, made up and distinct for every kernel of
    `kernel_names`: 1 sample t/10, `batch` samples t."""
    from lptrain.model_perf.costs import KernelCosts
    costs = KernelCosts(batch)
    for i, name in enumerate(sorted(kernel_names())):
        for m in range(1, 17):
            costs.full[(name, m)] = 1e-3 * (i + 1) * m ** 0.9
            costs.one[(name, m)] = costs.full[(name, m)] / 10
    return costs


def kernel_names():
    """The kernels the speedup model records and measures (model_perf/measure.py)."""
    return ("apply", "apply_save", "apply_plus", "apply_save_plus", "linearize", "vjp_saved",
            "vjp_and_g", "vjp_from_g", "act_vjp", "vjp_weights", "opening", "opening_vjp",
            "classify", "classify_grad", "regulariser", "regulariser_grad", "serial_forward",
            "serial_forward_nosave", "serial_adjoint")


def serial_objective_and_grad(net, theta, x, y):
    """J and ∇J by the hand-written serial adjoint."""
    st = net.stepper(theta)
    states, saved = propagate(st, net.opening(theta, x), net.h)
    loss, _, lamN, gW, gmu = net.classify(theta, states[-1], y, x.shape[0], True)
    lam0, gK, gb = adjoint(st, states, saved, lamN, net.h)
    grad = net.assemble(torch.zeros_like(theta), (gK, gb), (gW, gmu))
    net.opening_vjp(theta, x, lam0, grad)
    value = float(loss) + net.regulariser(theta, grad)
    return value, grad, states


def autograd_objective(net, theta, x, y):
    """The same J built from differentiable torch operations (the test oracle)."""
    o, v = net.opts, net.layout.views(theta)
    st = net.stepper(theta)
    u = net.opening(theta, x)
    for n in range(o.layers):
        u = st.step(u, n, net.h)
    loss = net.classify(theta, u, y, x.shape[0], False)[0]
    reg = 0.0
    for blk in net.layout.blocks.values():
        gamma = o.gamma_class if blk.group == "classifier" else o.gamma_tik
        reg = reg + 0.5 * gamma * v[blk.name].pow(2).sum()
    for name in ("K", "b"):
        d = (v[name][1:] - v[name][:-1]) / net.h
        reg = reg + 0.5 * o.gamma_ddt * d.pow(2).sum()
    return loss + reg


class StopAt(StopSignals):
    """A SIGINT that arrives during iteration `at`."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def check(self, exchange, iteration, writer=None, signals=True):
        if iteration == self.at:
            self.received = signal.SIGINT
        super().check(exchange, iteration, writer, signals)


class Counting:
    """A propagator wrapper that counts the steps a solver asks for, by their length in
    fine steps (1 = the finest level); also used by bench/ (through bench/common.py)."""

    def __init__(self, prop):
        self.prop, self.steps = prop, Counter()

    def step(self, u, start, stop, **kw):
        self.steps[abs(stop - start)] += 1
        return self.prop.step(u, start, stop, **kw)

    def step_many(self, U, starts, stops, **kw):
        for a, b in zip(starts, stops):
            self.steps[abs(b - a)] += 1
        return self.prop.step_many(U, starts, stops, **kw)

    def total(self) -> int:
        return sum(self.steps.values())


def count_solves(solver, counts: dict, key: str) -> None:
    """Wrap `solver.solve` so that each solve's propagator is a Counting: counts[key]
    is the latest solve's."""
    solve = solver.solve

    def counted(prop, *args, **kw):
        counts[key] = c = Counting(prop)
        return solve(c, *args, **kw)
    solver.solve = counted


def composed(*overrides: str, hydra_node: bool = False):
    """Hydra's composition of lptrain's config with these overrides, as `hydra.compose`
    gives it (with its `hydra` node if asked): a copy of this process's first
    composition of the same overrides (a deep copy is far cheaper than a composition,
    and the tests ask for many alike); a bad override raises each time (failures are
    not kept)."""
    from omegaconf import open_dict
    cfg = copy.deepcopy(_composition(tuple(overrides)))
    if not hydra_node:              # as hydra.compose drops it
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


@functools.cache
def _composition(overrides: tuple[str, ...]):
    from hydra import compose, initialize_config_dir

    from lptrain.config import CONF_DIR
    from lptrain.config.schema import register_configs
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides),
                       return_hydra_config=True)


def config_of(overrides):
    """`lptrain.config.compose(overrides)`, (typed Config, plain dict): a copy of this
    process's first result for the same overrides (see `composed`)."""
    return copy.deepcopy(_config_of(tuple(overrides)))


@functools.cache
def _config_of(overrides: tuple[str, ...]):
    from lptrain.config import compose
    return compose(overrides)


def as_default_path(monkeypatch) -> None:
    """Every dataset.path counts as the default one for this test: the tests of the
    packaged fallbacks (used only for the default path) give their own empty directory."""
    from lptrain.data import base, indian_pines, mnist
    for module in (base, indian_pines, mnist):
        monkeypatch.setattr(module, "chosen", lambda options: False)


class PairLayer(nn.Linear):
    """A residual branch that returns a tuple, not the state's update (refused)."""

    def forward(self, u):
        return super().forward(u), u


class WiderLayer(nn.Linear):
    """A residual branch that returns float64 for any state (refused outside autocast)."""

    def forward(self, u):
        return super().forward(u).double()


def idx_bytes(array, type_code=0x08):
    """IDX encoding written independently of the reader under test."""
    header = struct.pack(">BBBB", 0, 0, type_code, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_idx(path, array, gz=False):
    content = idx_bytes(array)
    path.write_bytes(gzip.compress(content) if gz else content)


def fake_split(n, seed, brightness):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, brightness, size=(n, 28, 28), dtype=np.uint8)
    labels = (np.arange(n) % 10).astype(np.uint8)
    return images, labels


def write_set(directory, gz=False, sep="-", suffix=None, n_train=60, n_val=20):
    """Four IDX files of an MNIST-like set (train-*, t10k-*), 10 classes in turn;
    validation images are brighter, so leaked statistics would show."""
    directory.mkdir(parents=True, exist_ok=True)
    suffix = suffix if suffix is not None else (".gz" if gz else "")
    parts = {}
    for stem, n, bright in (("train", n_train, 128), ("t10k", n_val, 256)):
        images, labels = fake_split(n, len(stem), bright)
        write_idx(directory / f"{stem}-images{sep}idx3-ubyte{suffix}", images, gz)
        write_idx(directory / f"{stem}-labels{sep}idx1-ubyte{suffix}", labels, gz)
        parts[stem] = (images, labels)
    return parts
