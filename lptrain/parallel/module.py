"""A torch module whose forward runs MGRIT across its layers and whose backward runs
the adjoint MGRIT: layer-parallel residual layers inside a user's own PyTorch code."""
from __future__ import annotations

import torch
from torch import nn

from lptrain.mgrit.options import MGRITOptions
from lptrain.model.network import NetworkOptions, ResNet
from lptrain.model.steps import DenseSteps
from lptrain.parallel.context import make_exchange
from lptrain.parallel.layer_parallel import Evaluation, LayerParallel


class LayerParallelResNet(nn.Module):
    """N dense residual steps u ← u + h·σ(K_n u + b_n) solved by MGRIT.

    Every rank of `comm` (an mpi4py communicator, None for one process)
    holds all weights and calls the module with the same input u_0 of shape
    (batch, width); the output u_N is returned on every rank.  Gradients of
    K and b are summed over the ranks, so any optimizer can step them
    identically everywhere.  Call backward before the next forward.
    """

    def __init__(self, width: int, layers: int, T: float = 1.0, activation: str = "tanh",
                 bias: str = "vector", mgrit: MGRITOptions | None = None, comm=None,
                 init_scale: float = 0.1, seed: int = 0, dtype=torch.float64,
                 warm_start: bool = False):
        super().__init__()
        opts = NetworkOptions(width=width, layers=layers, T=T, activation=activation,
                              bias=bias, opening="pad", init="normal",
                              init_hidden=init_scale, gamma_tik=0.0, gamma_class=0.0,
                              gamma_ddt=0.0)
        self.net = ResNet(opts, (width,), 1)
        K, b = self.net.hidden_views(self.net.init_params(seed, dtype))
        self.K = nn.Parameter(K.clone())
        self.b = nn.Parameter(b.clone())
        self.options = mgrit or MGRITOptions()
        self.exchange = make_exchange(comm)
        self.solver = LayerParallel(self.net, self.options, self.exchange)
        self.warm_start = warm_start
        self._warm = (None, None)
        self._calls = 0
        self.last_forward = self.last_backward = None   # SolveResult of the latest solves

    def forward(self, u0: torch.Tensor) -> torch.Tensor:
        return _MGRITFunction.apply(u0, self.K, self.b, self)

    def serial(self, u0: torch.Tensor) -> torch.Tensor:
        """The same layers stepped one after another with autograd (the reference)."""
        stepper = DenseSteps(self.K, self.b, self.net.act)
        u = DenseSteps.to_state(u0)
        for n in range(self.net.opts.layers):
            u = stepper.step(u, n, self.net.h)
        return DenseSteps.from_state(u)

    def _theta(self, K, b):
        return self.net.assemble(K.new_zeros(self.net.layout.size), hidden=(K, b))


class _MGRITFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u0, K, b, mod: LayerParallelResNet):
        lp, exchange = mod.solver, mod.exchange
        theta = mod._theta(K.detach(), b.detach())
        x = u0.detach()
        res = lp.forward(theta, x, warm=mod._warm[0] if mod.warm_start else None)
        mod.last_forward = res
        mod._calls += 1
        ctx.mod, ctx.theta, ctx.x, ctx.states, ctx.call = mod, theta, x, res.states, mod._calls
        last = exchange.size - 1
        uN = exchange.broadcast_tensor(res.states[-1] if lp.last else None, last, lp.template(x))
        return DenseSteps.from_state(uN).clone()

    @staticmethod
    def backward(ctx, grad_uN):
        mod = ctx.mod
        if ctx.call != mod._calls:
            raise RuntimeError("LayerParallelResNet: backward must run before the next "
                               "forward (the solver keeps one set of states)")
        lp, exchange = mod.solver, mod.exchange
        zeros = (None, None)
        if lp.last:
            zeros = mod.net.classifier_views(torch.zeros_like(ctx.theta))
        lamN = DenseSteps.to_state(grad_uN.detach()) if lp.last else None
        ev = Evaluation(0.0, 0, lamN, zeros)
        grad, res = lp.backward(ctx.theta, ctx.x, ctx.states, ev,
                                warm=mod._warm[1] if mod.warm_start else None)
        mod.last_backward = res
        mod._warm = (ctx.states, res.states)
        lam0 = exchange.broadcast_tensor(res.states[-1] if lp.first else None, 0,
                                         lp.template(ctx.x))
        gK, gb = mod.net.hidden_views(grad)
        return DenseSteps.from_state(lam0).clone(), gK.clone(), gb.clone(), None
