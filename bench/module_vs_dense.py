"""lptrain's own steps against LayerParallel of the same layers as torch modules: time of
one forward + backward, converged and fixed (one rank), each after the parameters'
gradients are set to None as optimizer.zero_grad() does in a training step.

    .venv/bin/python bench/module_vs_dense.py [--layers 64] [--width 8] [--batch 256]
    .venv/bin/python bench/module_vs_dense.py --network conv [--layers 16] [--channels 8]
    .venv/bin/python bench/module_vs_dense.py --variants solver BuiltinSteps --solves fixed

The "ResNet solver" rows: the command line's flat-θ solver of the dense or conv network
(parallel/layer_parallel.py).  "LayerParallel BuiltinSteps": the same steps as a step family
of LayerParallel (their own propagators); plain "LayerParallel" rows: the layers as
torch modules on autograd's path, `stack` stepping several layers as one vmap.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from common import save
from lptrain import LayerParallel, MGRITOptions
from lptrain.model.network import NetworkOptions, ResNet
from lptrain.parallel import layer_parallel
from lptrain.parallel.builtin_steps import BuiltinSteps
from lptrain.parallel.context import make_exchange
from lptrain.parallel.layer_parallel import Evaluation


class Dense(nn.Module):
    """u ↦ tanh(K u + b): the dense ResNet's step as a module."""

    def __init__(self, K, b):
        super().__init__()
        self.K, self.b = nn.Parameter(K.clone()), nn.Parameter(b.clone())

    def forward(self, u):
        return torch.tanh(torch.addmm(self.b, u, self.K.t()))


class Conv(nn.Module):
    """u ↦ tanh(conv3×3(u; K) + b): the conv ResNet's step as a module."""

    def __init__(self, K, b):
        super().__init__()
        self.K, self.b = nn.Parameter(K.clone()), nn.Parameter(b.clone())

    def forward(self, u):
        return torch.tanh(nn.functional.conv2d(u, self.K, self.b, padding=1))


class FlatSolve(nn.Module):
    """The command line's flat-θ solver (parallel/layer_parallel.py) of a built-in
    ResNet: MGRIT forward + adjoint of u_0 ↦ u_N (the timed work of a training step's
    body), as a callable with a backward.  Its input u_0 is the opened batch."""

    def __init__(self, opts: NetworkOptions, in_shape, mgrit):
        super().__init__()
        self.net = ResNet(opts, in_shape, 10)
        self.theta = self.net.init_params(0)
        self.lp = layer_parallel.LayerParallel(self.net, mgrit, make_exchange(None))
        self.K, self.b = self.net.hidden_views(self.theta)
        self.layout = self.net.stepper(self.theta)      # to_state / from_state
        self.in_channels = in_shape[0]

    def opening(self, x):
        return self.layout.from_state(self.net.opening(self.theta, x))

    def forward(self, u0):
        return _FlatFn.apply(u0, self)


class _FlatFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u0, mod):
        ctx.mod, ctx.x = mod, u0[:, :mod.in_channels].contiguous()   # opening: pad/replicate
        ctx.states = mod.lp.forward(mod.theta, ctx.x).states
        return mod.layout.from_state(ctx.states[-1]).clone()

    @staticmethod
    def backward(ctx, grad):
        mod = ctx.mod
        zeros = mod.net.classifier_views(torch.zeros_like(mod.theta))
        ev = Evaluation(0.0, 0, mod.layout.to_state(grad).contiguous(), zeros)
        mod.lp.backward(mod.theta, ctx.x, ctx.states, ev)
        return None, None


def _options(a, **kw):
    return NetworkOptions(layers=a.layers, T=2.0, activation="tanh", init="normal",
                          gamma_tik=0.0, gamma_class=0.0, gamma_ddt=0.0, **kw)


def dense_runs(a, x, mgrit):
    solve = FlatSolve(_options(a, width=a.width, opening="pad", init_hidden=0.5),
                      (a.width,), mgrit)
    K, b = solve.K, solve.b
    mods = {stack: LayerParallel([Dense(K[n], b[n]) for n in range(a.layers)], T=2.0,
                                 mgrit=mgrit, stack=stack) for stack in (False, True)}
    builtin = LayerParallel(BuiltinSteps.dense(K, b), T=2.0, mgrit=mgrit)
    return solve.opening(x).requires_grad_(), {
        "dense ResNet solver": solve, "LayerParallel BuiltinSteps": builtin,
        "LayerParallel": mods[False], "LayerParallel stack": mods[True]}


def conv_runs(a, x, mgrit):
    solve = FlatSolve(_options(a, name="conv", channels=a.channels, opening="replicate",
                               init_hidden=0.3), (1, a.side, a.side), mgrit)
    mods = {stack: LayerParallel([Conv(solve.K[n], solve.b[n]) for n in range(a.layers)],
                                 T=2.0, mgrit=mgrit, stack=stack) for stack in (False, True)}
    builtin = LayerParallel(BuiltinSteps.conv(solve.K, solve.b), T=2.0, mgrit=mgrit)
    return solve.opening(x).requires_grad_(), {
        "conv ResNet solver": solve, "LayerParallel BuiltinSteps": builtin,
        "LayerParallel": mods[False], "LayerParallel stack": mods[True]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--network", choices=("dense", "conv"), default="dense")
    p.add_argument("--layers", type=int)
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--channels", type=int, default=8)
    p.add_argument("--side", type=int, default=14)
    p.add_argument("--batch", type=int)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--variants", nargs="*", default=[],
                   help="only the variants whose name contains one of these")
    p.add_argument("--solves", nargs="*", default=["converged", "fixed"],
                   choices=("converged", "fixed"))
    a = p.parse_args()
    conv = a.network == "conv"
    a.layers = a.layers or (16 if conv else 64)
    a.batch = a.batch or (32 if conv else 256)
    shape = (a.batch, 1, a.side, a.side) if conv else (a.batch, a.width)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    rows, cpu = [], {}
    for label, opts in (("converged", dict(tol=1e-9, max_iter=50)),
                        ("fixed 2+2", dict(tol=0.0, max_iter=2, adj_max_iter=2))):
        if label.split()[0] not in a.solves:
            continue
        mgrit = MGRITOptions(levels=3 if not conv else 2, cfactor0=4, **opts)
        u, runs = (conv_runs if conv else dense_runs)(a, x, mgrit)
        runs = {f"{k} {label}": m for k, m in runs.items()
                if not a.variants or any(v in k for v in a.variants)}
        for k in runs:
            cpu[k] = []
        for _ in range(a.rounds):
            for k, m in runs.items():
                params = list(m.parameters())
                c0 = time.process_time()
                for _ in range(a.reps):
                    for p in params:        # as a training step's optimizer.zero_grad()
                        p.grad = None
                    m(u).pow(2).sum().backward()
                cpu[k].append((time.process_time() - c0) / a.reps)
        outs = [m(u).detach() for m in runs.values()]
        assert label != "converged" or all(float((o - outs[0]).abs().max()) < 1e-6
                                           for o in outs)
    for k, ts in cpu.items():
        rows.append({"variant": k, "cpu_ms": 1e3 * statistics.median(ts)})
        print(f"| {k:34s} | {1e3 * statistics.median(ts):8.1f} |")
    save(f"module_vs_{a.network}", {"args": vars(a), "rows": rows})


if __name__ == "__main__":
    main()
