"""LayerParallel with users' own steps on however many ranks this runs on.

Run under mpiexec: rank 0 saves the results to argv[1]; the pytest side compares
them with `reference()`, the same layers stepped serially with autograd.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from lptrain.mgrit.options import MGRITOptions  # noqa: E402
from lptrain.parallel.builtin_steps import BuiltinSteps  # noqa: E402
from lptrain.parallel.lp_module import LayerParallel, average_gradients  # noqa: E402

N = 16
TOL = dict(tol=1e-13, max_iter=80)


def _init(module: nn.Module, seed: int, scale: float) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return module


class Dense(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, u):
        return torch.tanh(self.lin(u))


def dense(n):
    return _init(Dense(5).double(), 10 + n, 0.5)


def frozen(n):
    """dense with parameters the user froze: every bias, and all of layer 5."""
    m = dense(n)
    m.lin.bias.requires_grad_(False)
    return m.requires_grad_(False) if n == 5 else m


def normed(n):
    """Linear, BatchNorm, tanh, with running statistics of its own per layer; the cases
    run it in eval mode (set after building, as a user evaluates a trained network)."""
    m = _init(nn.Sequential(nn.Linear(5, 5), nn.BatchNorm1d(5), nn.Tanh()).double(),
              100 + n, 0.5)
    gen = torch.Generator().manual_seed(130 + n)
    with torch.no_grad():
        m[1].running_mean.copy_(0.3 * torch.randn(5, generator=gen, dtype=torch.float64))
        m[1].running_var.copy_(0.5 + torch.rand(5, generator=gen, dtype=torch.float64))
    return m


def batchnormed(n):
    """Linear (no bias: BatchNorm takes the mean), BatchNorm, tanh; run in training mode."""
    return _init(nn.Sequential(nn.Linear(5, 5, bias=False), nn.BatchNorm1d(5),
                               nn.Tanh()).double(), 160 + n, 0.5)


def dropped(n):
    """Dense with dropout after the activation: its masks are drawn per forward."""
    m = dense(n)
    return nn.Sequential(m, nn.Dropout(0.3))


def conv(n):
    return _init(nn.Sequential(nn.Conv2d(2, 2, 3, padding=1), nn.Tanh()).double(), 40 + n, 0.4)


def conv_gn_conv(n):
    """A step no lptrain code knows: conv, GroupNorm, conv."""
    m = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.SiLU(),
                      nn.Conv2d(4, 2, 3, padding=1)).double()
    return _init(m, 70 + n, 0.3)


class ExactCoarse(nn.Module):
    """g with u + H·g(u) = the covered dense layers stepped one after another (copies
    built from `dense`, outside the module tree): MGRIT converges in one cycle."""

    def __init__(self, c):
        super().__init__()
        self.c, self.fine = c, {n: dense(n) for n in c.layers}

    def forward(self, u):
        v = u
        for n in self.c.layers:
            v = v + (1.0 / N) * self.fine[n](v)
        return (v - u) / self.c.h


def cheap_coarse(c):
    """conv_gn_conv without its GroupNorm: the convolutions' parameters (same names)
    follow the fine layers'."""
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.Identity(), nn.SiLU(),
                         nn.Conv2d(4, 2, 3, padding=1)).double()


EVAL = {"normed"}      # cases run in eval mode
KEYS = 7               # the seed of every module's dropout keys before a forward


def _buffers(state: dict, *markers: str) -> torch.Tensor:
    """The entries of a state dict whose names hold one of `markers`, in one vector."""
    return torch.cat([v.reshape(-1).double() for k, v in sorted(state.items())
                      if any(m in k for m in markers)])

# the user's coarse steps of a case (default: the fine f with the coarse step size)
COARSE = {"exact": ExactCoarse, "cheap": cheap_coarse}


def _input(shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


# name: (factory, input shape, MGRIT options, stack)
CASES = {
    "dense": (dense, (6, 5), dict(levels=3, cfactor0=2, cfactor=2,
                                  coarse_weights="average"), True),
    "conv": (conv, (3, 2, 5, 5), dict(levels=4, cfactor0=2, cfactor=2, cycle="F",
                                       coarse_weights="inject"), False),
    "convgn": (conv_gn_conv, (3, 2, 4, 4), dict(levels=3, cfactor0=2, cfactor=2,
                                                 coarse_weights="average"), False),
    # fixed iterations: the adjoint uses the forward's last-sweep linearisations
    "fixed": (conv_gn_conv, (3, 2, 4, 4), dict(levels=3, cfactor0=2, cfactor=2,
                                                coarse_weights="inject", tol=0.0,
                                                max_iter=30), False),
    "exact": (dense, (6, 5), dict(levels=3, cfactor0=2, cfactor=2), False),
    "frozen": (frozen, (6, 5), dict(levels=3, cfactor0=2, cfactor=2), False),
    # borrowed layers must compute with the owner's buffers and eval mode
    "normed": (normed, (6, 5), dict(levels=3, cfactor0=2, cfactor=2), False),
    # running statistics updated once a forward, at the solved states, as serial's
    "batchnorm": (batchnormed, (6, 5), dict(levels=3, cfactor0=2, cfactor=2), False),
    # the same masks at every evaluation of a layer within a forward and its backward
    "dropout": (dropped, (6, 5), dict(levels=3, cfactor0=2, cfactor=2), False),
    "cheap": (conv_gn_conv, (3, 2, 4, 4), dict(levels=3, cfactor0=2, cfactor=2,
                                                coarse_weights="average"), False),
}


# lptrain's own steps as a step family (their propagators, not autograd's):
# name: (kind, activation, bias width, input shape, MGRIT options)
BUILTIN = {
    "bdense": ("dense", "tanh", 5, (6, 5), dict(levels=3, cfactor0=2, cfactor=2,
                                                 coarse_weights="average")),
    "bconv": ("conv", "smoothrelu", 1, (3, 2, 5, 5), dict(levels=4, cfactor0=2, cfactor=2,
                                                          cycle="F")),
}


def builtin(name, seed=0) -> BuiltinSteps:
    kind, act, nb, shape, _ = BUILTIN[name]
    gen = torch.Generator().manual_seed(90 + seed)
    c = shape[1]
    K = torch.randn((N, c, c) + ((3, 3) if kind == "conv" else ()), generator=gen,
                    dtype=torch.float64) * (0.5 if kind == "dense" else 0.3)
    b = 0.2 * torch.randn(N, nb, generator=gen, dtype=torch.float64)
    return BuiltinSteps(kind, K, b, act)


def loss_of(out, seed):
    return (out * _input(out.shape, seed).to(out)).sum() + 0.5 * (out ** 2).sum()


def _by_layer(prefix: str, mod: LayerParallel, comm, value=lambda p: p.grad.clone()):
    """{prefix-n-name: value(p)} for every parameter of every layer, gathered from the
    ranks that own them."""
    mine = {f"{prefix}-{n}-{k}": value(p)
            for n in mod.owned for k, p in mod.steps.module(n).named_parameters()}
    out = {}
    for part in [mine] if comm is None else comm.allgather(mine):
        out.update(part)
    return out


def _grads(name, mod: LayerParallel, u0, comm) -> dict:
    """The input's and every layer's parameter gradients (1 for a frozen parameter left
    without one, as autograd leaves it)."""
    def grad(p):
        return p.grad.detach().clone() if p.requires_grad else \
            torch.tensor(float(p.grad is None))
    return {f"{name}-gu": u0.grad.detach().clone(),
            **_by_layer(f"{name}-grad", mod, comm, grad)}


def run(comm=None) -> dict:
    """Converged layer-parallel solves: outputs and every gradient."""
    import module_habits as habits
    results = {}
    for name, (make, shape, opts, stack) in CASES.items():
        mod = LayerParallel(make, T=1.0, n_layers=N, comm=comm, stack=stack,
                            mgrit=MGRITOptions(**{**TOL, **opts}),
                            coarse_steps=COARSE.get(name))
        mod.train(name not in EVAL)
        u0 = _input(shape, 1).requires_grad_()
        mod.generator.manual_seed(KEYS)
        out = mod(u0)
        loss_of(out, 2).backward()
        if name == "batchnorm":
            results[f"{name}-statistics"] = _buffers(mod.state_dict(), "running", "batches")
        if name == "exact":
            results["exact-iters"] = torch.tensor([mod.last_forward.iterations,
                                                   mod.last_backward.iterations], dtype=float)
        results[f"{name}-out"] = out.detach()
        results.update(_grads(name, mod, u0, comm))
        mod.generator.manual_seed(KEYS)
        with torch.no_grad():
            results[f"{name}-nograd"] = mod(u0)
        state = mod.state_dict()
        other = LayerParallel(lambda n: make(n + 100), T=1.0, n_layers=N, comm=comm,
                              stack=stack, mgrit=MGRITOptions(**{**TOL, **opts}))
        other.load_state_dict(state)         # every layer given, each rank keeps its own
        other.train(name not in EVAL)
        other.generator.manual_seed(KEYS)
        with torch.no_grad():
            results[f"{name}-loaded"] = other(u0)
        results[f"{name}-state"] = torch.cat([state[f"layers.{n}.{k}"].reshape(-1)
                                              for n in range(N)
                                              for k, _ in make(0).named_parameters()])
    for name, (_, _, _, shape, opts) in BUILTIN.items():
        mod = LayerParallel(builtin(name), T=1.0, comm=comm,
                            mgrit=MGRITOptions(**{**TOL, **opts}))
        u0 = _input(shape, 1).requires_grad_()
        out = mod(u0)
        loss_of(out, 2).backward()
        results[f"{name}-out"] = out.detach()
        results.update(_grads(name, mod, u0, comm))
        other = LayerParallel(builtin(name, seed=1), T=1.0, comm=comm,
                              mgrit=MGRITOptions(**{**TOL, **opts}))
        other.load_state_dict(mod.state_dict())
        with torch.no_grad():
            results[f"{name}-loaded"] = other(u0)
    results.update(data_parallel(comm))
    results.update(habits.other_inputs(comm))
    results.update(habits.resumed(comm))
    results.update(habits.initialized(comm))
    results.update(clipped(comm))
    results.update(low_precision(comm))
    results.update(spectral_training(comm))
    return results


def reference() -> dict:
    """The same quantities by serial autograd over all layers in one process."""
    import module_habits as habits
    results = {}
    for name, (make, shape, _, _) in CASES.items():
        mod = LayerParallel(make, T=1.0, n_layers=N)
        mod.train(name not in EVAL)
        u0 = _input(shape, 1).requires_grad_()
        mod.generator.manual_seed(KEYS)
        out = mod.serial(u0)
        loss_of(out, 2).backward()
        if name == "batchnorm":
            results[f"{name}-statistics"] = _buffers(mod.state_dict(), "running", "batches")
        results[f"{name}-out"] = out.detach()
        results.update(_grads(name, mod, u0, None))
        results[f"{name}-nograd"] = results[f"{name}-loaded"] = out.detach()
        results[f"{name}-state"] = torch.cat([p.detach().reshape(-1) for p in mod.parameters()])
    results["exact-iters"] = torch.tensor([1.0, 1.0], dtype=float)    # exact coarse steps
    for name, (_, _, _, shape, _) in BUILTIN.items():
        mod = LayerParallel(builtin(name), T=1.0)       # serial(): autograd through the layers
        u0 = _input(shape, 1).requires_grad_()
        out = mod.serial(u0)
        loss_of(out, 2).backward()
        results[f"{name}-out"] = results[f"{name}-loaded"] = out.detach()
        results.update(_grads(name, mod, u0, None))
    results.update(data_parallel(None))
    results.update(clipped(None))
    results.update(low_precision(None))      # one rank's MGRIT: not serial's
    results.update(spectral_training(None))
    results.update(habits.other_inputs(None))
    results.update(habits.resumed(None))
    results.update(habits.initialized(None))
    return results


def clipped(comm) -> dict:
    """A head after LayerParallel, gradients clipped to a norm below theirs by
    lptrain's clip_grad_norm_ (the whole network's norm, over the layer ranks); with
    comm None by serial autograd and torch's clip_grad_norm_, the reference."""
    from lptrain.parallel.lp_module import clip_grad_norm_
    torch.manual_seed(5)
    body = LayerParallel(dense, T=1.0, n_layers=N, comm=comm,
                         mgrit=MGRITOptions(levels=3, cfactor0=2, cfactor=2, **TOL))
    head = _init(nn.Linear(5, 3).double(), 200, 0.5)
    u0 = _input((6, 5), 4)
    out = head(body.serial(u0) if comm is None else body(u0))
    loss_of(out, 6).backward()
    params = [*body.parameters(), *head.parameters()]
    norm = torch.nn.utils.clip_grad_norm_(params, 0.3) if comm is None \
        else clip_grad_norm_(params, 0.3, body)
    got = {"clip-norm": torch.as_tensor(float(norm), dtype=torch.float64)}
    for p_norm in (1.0, math.inf):            # the clipped gradients' other norms
        other = torch.nn.utils.clip_grad_norm_(params, 1e30, p_norm) if comm is None \
            else clip_grad_norm_(params, 1e30, body, norm_type=p_norm)
        got[f"clip-norm-{p_norm:g}"] = torch.as_tensor(float(other), dtype=torch.float64)
    got.update({f"clip-head-{k}": p.grad.clone() for k, p in head.named_parameters()})
    return {**got, **_by_layer("clip-grad", body, comm)}


def spectral(n):
    """dense with its weight spectrally normalised (power-iteration vectors set per layer)."""
    from torch.nn.utils.parametrizations import spectral_norm
    m = dense(n)
    spectral_norm(m.lin)
    sn, gen = m.lin.parametrizations.weight[0], torch.Generator().manual_seed(190 + n)
    with torch.no_grad():
        for buf in (sn._u, sn._v):
            buf.copy_(nn.functional.normalize(torch.randn(5, generator=gen,
                                                          dtype=torch.float64), dim=0))
    return m


def spectral_training(comm) -> dict:
    """Spectral normalisation in training mode: one power iteration per forward, from
    the same vectors in every evaluation of f (also the borrowed copies'), as serial's
    (comm None: serial autograd, the reference). Outputs, gradients, vectors after."""
    torch.manual_seed(8)
    mod = LayerParallel(spectral, T=1.0, n_layers=N, comm=comm,
                        mgrit=MGRITOptions(levels=3, cfactor0=2, cfactor=2, **TOL))
    u0 = _input((6, 5), 9).requires_grad_()
    out = mod.serial(u0) if comm is None else mod(u0)
    loss_of(out, 10).backward()
    return {"sn-out": out.detach(), "sn-gu": u0.grad.clone(),
            "sn-vectors": _buffers(mod.state_dict(), "._"), **_by_layer("sn-grad", mod, comm)}


def low_precision(comm) -> dict:
    """bfloat16 and float16 layers, 2 fixed iterations each way: states, parameters and
    gradients cross ranks as 16-bit floats (numpy has no bfloat16). Every rank count
    computes what one rank computes."""
    out = {}
    for dtype in (torch.bfloat16, torch.float16):
        torch.manual_seed(6)
        mod = LayerParallel(dense, T=1.0, n_layers=N, comm=comm,
                            mgrit=MGRITOptions(levels=3, cfactor0=2, cfactor=2, tol=0.0,
                                               max_iter=2)).to(dtype)
        u0 = _input((6, 5), 7).to(dtype).requires_grad_()
        y = mod(u0)
        loss_of(y.double(), 8).backward()
        name = str(dtype).split(".")[-1]
        out[f"{name}-out"] = y.detach().double()
        out[f"{name}-gu"] = u0.grad.double()
        out.update(_by_layer(f"{name}-grad", mod, comm, lambda p: p.grad.double()))
    return out


def data_parallel(comm) -> dict:
    """A layer × data grid (4 ranks: 2 × 2, else 1 × P): each data group a shard of the
    batch, gradients averaged over the groups, equal to the whole batch in one process."""
    from lptrain.parallel.context import grid_exchanges
    from lptrain.parallel.grid import Grid
    u0 = _input((12, 5), 3)
    size = 1 if comm is None else comm.Get_size()
    grid = Grid(2, 2) if size == 4 else Grid(1, size)
    exchanges = grid_exchanges(comm, grid)
    group = grid.coords(0 if comm is None else comm.Get_rank())[1]
    mod = LayerParallel(dense, T=1.0, n_layers=N, comm=getattr(exchanges.layer, "comm", None),
                        mgrit=MGRITOptions(levels=3, cfactor0=2, cfactor=2, **TOL))
    shard = u0.view(grid.data, 12 // grid.data, 5)[group]
    (mod(shard) ** 2).sum().mul(grid.data / 12.0).backward()
    average_gradients(mod, exchanges.data)
    return _by_layer("data-grad", mod, comm)


if __name__ == "__main__":
    from sizes import main
    main(run)
