"""The user's step (model/custom.py) as a time stepper: u ← u + h·f(u; θ_n) by layer index.

The same protocol as model/steps.py's DenseSteps and ConvSteps, so the serial sweeps,
the MGRIT propagators and the cost measurement run it unchanged: the layer weights
(K, b) are row n of θ's hidden block K (N, p) and an empty b (N, 0); a stack of m steps
passes K (m, p). States are batch-major (B, *state). What the adjoint keeps of a step
is its input state; vector-Jacobian products come from autograd through f at that
state (one forward of f and its backward per adjoint step). The activation is the
identity stand-in `LINEAR`: f's derivative lives in the module. Every step's f(u) is
checked to keep u's shape and dtype (`kept_update`): the step was tried on a small
state only (custom.py), and f can behave otherwise on another batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lptrain.model.custom import CustomStep
from lptrain.model.module_steps import kept_update, value_only
from lptrain.model.steps import ConvSteps, DenseSteps


@dataclass(frozen=True)
class _Linear:
    """The activation protocol (model/activations.py) for steps whose nonlinearity is
    inside f: `vjp` keeps the state and λ for the products that follow, and the weight
    products scale by h."""

    name: str = "module"
    scale_in: float = 1.0
    scale_out: float = 1.0
    shift: float = 0.0
    slope: float = 1.0

    def weight_factor(self, h: float) -> float:
        return h

    def vjp(self, saved, lam, out=None):
        """The cotangent of a step: its kept input state and λ (`out` is not needed)."""
        return Cotangent(saved, lam)

    def derivative(self, saved):
        return saved


LINEAR = _Linear()


class Cotangent:
    """λ_{n+1} at the step's input state u_n, and the products of f's one backward
    there once computed: (∂f/∂u)ᵀ λ (`state`) and (∂f/∂θ_n)ᵀ λ (`weights`)."""

    def __init__(self, u, lam, state=None, weights=None):
        self.u, self.lam, self.state, self.weights = u, lam, state, weights


class ModuleThetaSteps:
    """Residual steps of a user module with each layer's parameters a row of θ."""

    BATCH_AXIS = 0
    WEIGHTS_NEED_K = True    # vjp_weights(u, g, K): f's products depend on its parameters

    def __init__(self, K: torch.Tensor, b: torch.Tensor, step: CustomStep):
        self.K, self.b, self.spec = K, b, step
        self.act = LINEAR
        self.n_layers = K.shape[0]
        self.core = step.steps(K.dtype, K.device)    # ModuleSteps: f and its graph
        self._rank = 1 + len(step.state_shape)      # dims of one state (batch first)

    # -- layout: batch first, as the conv steps ---------------------------------------
    state_dims = staticmethod(ConvSteps.state_dims)
    to_state = from_state = staticmethod(ConvSteps.to_state)

    # -- weights -------------------------------------------------------------------
    # coarse steps: f with the mean parameters of the covered layers
    weights = DenseSteps.weights
    weights_many = DenseSteps.weights_many
    mean_weights = DenseSteps.mean_weights
    block_mean_weights = DenseSteps.block_mean_weights

    # -- forward -------------------------------------------------------------------
    def apply(self, u, K, b, h, save=None, out=None, plus=None):
        """u + h·f(u; K) [+ plus] into `out` if given; K (m, p): m stacked states."""
        if K.dim() == 2:
            out = torch.empty_like(u) if out is None else out
            for i in range(K.shape[0]):
                self.apply(u[i], K[i], b[i], _item(h, i), None if save is None else save[i],
                           out[i], None if plus is None else plus[i])
            return out
        if save is not None:
            save.copy_(u)
        f = kept_update(self.spec.name, u, self.core.f(0, u, self.spec.unflatten(K)))
        f = value_only(f, (u, K))
        y = torch.add(u, f, alpha=h, out=out)
        return y if plus is None else y.add_(plus)

    def step(self, u, n: int, h: float, save=None, out=None):
        K, b = self.weights(n)
        return self.apply(u, K, b, h, save, out)

    # -- adjoint -------------------------------------------------------------------
    def linearize(self, u, K, b):
        """What the adjoint of the step at u keeps: u itself."""
        return u.clone()

    def _vjps(self, u, lam, K, params: bool):
        """(∂f/∂u)ᵀ λ and, with params, (∂f/∂K)ᵀ λ at state u from one backward of f's
        graph (ModuleSteps.linearize); zeros where f does not depend on one."""
        lin = self.core.linearize(u, 0, self.spec.unflatten(K), params=params,
                                  who=self.spec.name)
        if not params:
            return [lin.vjp_state(lam)]
        names = list(lin.leaves)
        wrt = [lin.x, *(lin.leaves[k] for k in names)]
        grads = [None] * len(wrt)
        if lin.y.requires_grad:
            with lin.around():           # f's parameters again, should f recompute
                grads = torch.autograd.grad(lin.y, wrt, lam, allow_unused=True)
        grads = [torch.zeros_like(t) if g is None else g for g, t in zip(grads, wrt)]
        return [grads[0], self.spec.flatten(dict(zip(names, grads[1:])))]

    def vjp_saved(self, saved, lam, K, h, out=None):
        """λ + h (∂f/∂u)ᵀ λ at the kept state."""
        if K.dim() == 2:
            out = torch.empty_like(lam) if out is None else out
            for i in range(K.shape[0]):
                self.vjp_saved(saved[i], lam[i], K[i], _item(h, i), out[i])
            return out
        (gu,) = self._vjps(saved, lam, K, False)
        return torch.add(lam, gu, alpha=h, out=out)

    def vjp_and_g(self, saved, lam, K, h: float, out=None):
        """vjp_saved and, in the Cotangent, the layer's weight products from the same
        backward of f."""
        gu, gk = self._vjps(saved, lam, K, True)
        return torch.add(lam, gu, alpha=h, out=out), Cotangent(saved, lam, gu, gk)

    def vjp_weights(self, u, g, K=None):
        """(∂f/∂K)ᵀ λ at state u (unscaled: callers scale by act.weight_factor) and the
        empty bias part, for g a Cotangent (act.vjp's) or a plain cotangent tensor.
        A Cotangent also keeps (∂f/∂u)ᵀ λ from the same backward for vjp_from_g."""
        if isinstance(g, Cotangent) and g.weights is not None:
            gk = g.weights
        else:
            if K is None:
                raise ValueError("custom steps: vjp_weights needs the layer's weights K")
            lam = g.lam if isinstance(g, Cotangent) else g
            if u.dim() > self._rank:           # stacked states, K (m, p)
                parts = [self.vjp_weights(u[i], lam[i], K[i]) for i in range(u.shape[0])]
                return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
            gu, gk = self._vjps(u, lam, K, True)
            if isinstance(g, Cotangent):
                g.state, g.weights = gu, gk
        return gk, gk.new_zeros((*gk.shape[:-1], 0))

    def vjp_from_g(self, g, lam, K, h, out=None):
        """λ + h (∂f/∂u)ᵀ λ' for g = Cotangent(u, λ') (computed unless vjp_weights did);
        a plain tensor g is taken as the product (∂f/∂u)ᵀ λ' itself."""
        if isinstance(g, Cotangent):
            if g.state is None:
                (g.state,) = self._vjps(g.u, g.lam, K, False)
            g = g.state
        return torch.add(lam, g, alpha=h, out=out)


def _item(h, i):
    return float(h[i]) if isinstance(h, torch.Tensor) else h
