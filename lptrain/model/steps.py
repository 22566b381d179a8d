"""Residual steps u ← u + h·σ(K u + b) as time steppers indexed by integer layer.

A stepper holds the hidden weights of all N layers and knows nothing of MPI or
MGRIT.  Each stepper owns its state layout: dense states are feature-major
(w, B), conv states (B, c, H, W); a stack of m states (one per MGRIT
interval) adds a leading dimension m.  `to_state` and `from_state` convert
from and to batch-major (B, ...) at the network's edges.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lptrain.model.activations import Activation
from lptrain.model.conv_ops import CONV_OPS


class DenseSteps:
    """Dense residual layers: K (N, w, w), b (N, w) or (N, 1); states (w, B).

    Feature-major states make K u one GEMM whose long dimension is
    contiguous, which is much faster than u Kᵀ on (B, w) states, in the
    forward step and the adjoint alike (BENCHMARKS.md).
    """

    def __init__(self, K: torch.Tensor, b: torch.Tensor, act: Activation):
        self.K, self.b = _scaled(K, b, act)
        self.act = act
        self.n_layers = K.shape[0]

    # -- layout --------------------------------------------------------------
    BATCH_AXIS = 1        # of a state: the samples
    # a serial adjoint sweep leaves the weight products to one batched call after it
    # (model/serial.py): vjp_weights of a stack is one bmm
    WEIGHTS_AFTER_SWEEP = True

    @staticmethod
    def state_dims(batch: int, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (shape[0], batch)

    @staticmethod
    def to_state(u: torch.Tensor) -> torch.Tensor:
        """(B, w) → (w, B), contiguous."""
        return u.t().contiguous()

    @staticmethod
    def from_state(u: torch.Tensor) -> torch.Tensor:
        """(w, B) → (B, w), a view."""
        return u.t()

    # -- weights -------------------------------------------------------------
    def weights(self, n: int):
        return self.K[n], self.b[n]

    def weights_many(self, ns):
        """Weights of layers ns (an index tensor, or a slice: views)."""
        return self.K[ns], self.b[ns]

    def mean_weights(self, start: int, stop: int):
        return self.K[start:stop].mean(0), self.b[start:stop].mean(0)

    def block_mean_weights(self, first: int, length: int, count: int):
        """mean_weights of the `count` blocks of `length` layers from `first`, stacked:
        one reduction (the same values: each mean runs over the block in order)."""
        stop = first + length * count
        return (self.K[first:stop].unflatten(0, (count, length)).mean(1),
                self.b[first:stop].unflatten(0, (count, length)).mean(1))

    # -- forward ---------------------------------------------------------------
    def apply(self, u, K, b, h, save=None, out=None, plus=None):
        """One step with the stepper's weights: u + h·σ(z) [+ plus], into `out` if given.

        u (w, B) with K (w, w), or u (m, w, B) with K (m, w, w) and h a
        float or a tensor of m step sizes.  `save`, if given, receives what
        the adjoint needs (see Activation); `plus` is added to the result (an
        MGRIT level's right-hand side).
        """
        y = _euler(u, self.act.f_(self._z(u, K, b), save), h, self.act, out)
        return y if plus is None else y.add_(plus)

    @staticmethod
    def _z(u, K, b):
        """z' = K u + b with the stored (scaled) weights."""
        if u.dim() == 2:
            return torch.addmm(b.unsqueeze(-1), K, u)
        return torch.baddbmm(b.unsqueeze(-1), K, u)

    def step(self, u, n: int, h: float, save=None, out=None):
        """u_{n+1} = u_n + h·σ(K_n u_n + b_n)."""
        K, b = self.weights(n)
        return self.apply(u, K, b, h, save, out)

    def sweep(self, states, saved, h: float) -> None:
        """`step` through all layers: states[n + 1] from states[n] (and saved[n] unless
        saved is None), the same operations as step's with the per-layer views taken
        once and one scratch pre-activation, so that a layer costs its kernels and
        little else (their per-call cost does not shrink with a shard of the batch)."""
        K, b, u = self.K.unbind(0), self.b.unsqueeze(-1).unbind(0), states.unbind(0)
        keep = (None,) * self.n_layers if saved is None else saved.unbind(0)
        z, act = torch.empty_like(u[0]), self.act
        for n in range(self.n_layers):
            a = act.f_(torch.addmm(b[n], K[n], u[n], out=z), keep[n])
            _euler(u[n], a, h, act, out=u[n + 1])

    # -- adjoint ---------------------------------------------------------------
    def linearize(self, u, K, b):
        """What the adjoint of a step at state u needs (the activation's saved data),
        computed as `apply` saves it."""
        return self.act.saved_of(self._z(u, K, b))

    def vjp_saved(self, saved, lam, K, h, out=None):
        """λ_{n+1} + h Kᵀ[σ′ ⊙ λ_{n+1}] from the activation's saved data."""
        return self.vjp_from_g(self.act.vjp(saved, lam), lam, K, h * self.act.scale_out, out)

    def vjp_and_g(self, saved, lam, K, h: float, out=None):
        """vjp_saved of one state, and g = f′ ⊙ λ_{n+1}: what vjp_weights takes for the
        layer (scaled by act.weight_factor(h) after)."""
        g = self.act.vjp(saved, lam)
        return self.vjp_from_g(g, lam, K, h * self.act.scale_out, out), g

    def vjp_from_g(self, g, lam, K, h, out=None):
        """λ_{n+1} + h Kᵀ g with the stored K.  Stacked steps of several sizes (h an
        (m,) tensor) take each run of equal sizes with h as the product's alpha, as one
        step does: scaling g first rounds otherwise, and which steps share a stack
        depends on the ranks' split."""
        if lam.dim() == 2:
            return torch.addmm(lam, K.t(), g, alpha=h, out=out)
        Kt = K.transpose(1, 2)
        if not isinstance(h, torch.Tensor):
            return torch.baddbmm(lam, Kt, g, alpha=h, out=out)
        out = torch.empty_like(lam) if out is None else out
        for i, j, size in _runs(h.tolist()):
            torch.baddbmm(lam[i:j], Kt[i:j], g[i:j], alpha=size, out=out[i:j])
        return out

    def vjp_weights(self, u, g):
        """g uᵀ and Σ g: the weight gradients (gK, gb) of the layer(s) with input u
        for g = h·σ′ ⊙ λ (callers pass f′ ⊙ λ and scale by act.weight_factor(h) after)."""
        if u.dim() == 2:
            gK = torch.mm(g, u.t())
        else:
            gK = torch.bmm(g, u.transpose(1, 2))
        gb = g.sum(-1)
        if self.b.shape[-1] == 1:
            gb = gb.sum(-1, keepdim=True)
        return gK, gb


class ConvSteps:
    """3×3 convolutional residual layers: K (N, c, c, 3, 3), b (N, c) or (N, 1).

    The adjoint's convolutions are `conv_ops` (model/conv_ops.py: the fast form;
    the reference form is what the tests compare it with).
    """

    conv_ops = CONV_OPS["fast"]

    def __init__(self, K: torch.Tensor, b: torch.Tensor, act: Activation):
        self.K, self.b = _scaled(K, b, act)
        self.act = act
        self.n_layers = K.shape[0]

    BATCH_AXIS = 0

    @staticmethod
    def state_dims(batch: int, shape: tuple[int, ...]) -> tuple[int, ...]:
        return (batch, *shape)

    @staticmethod
    def to_state(u: torch.Tensor) -> torch.Tensor:
        return u

    from_state = to_state

    weights = DenseSteps.weights
    weights_many = DenseSteps.weights_many
    mean_weights = DenseSteps.mean_weights
    block_mean_weights = DenseSteps.block_mean_weights

    @staticmethod
    def _z(u, K, b):
        bias = b.expand(K.shape[0]) if b.numel() == 1 else b
        return F.conv2d(u, K, bias, padding=1)

    def apply(self, u, K, b, h, save=None, out=None, plus=None):
        if u.dim() == 4:
            y = _euler(u, self.act.f_(self._z(u, K, b), save), h, self.act, out)
            return y if plus is None else y.add_(plus)
        out = torch.empty_like(u) if out is None else out
        for i in range(u.shape[0]):
            self.apply(u[i], K[i], b[i], _item(h, i), None if save is None else save[i],
                       out[i], None if plus is None else plus[i])
        return out

    def step(self, u, n: int, h: float, save=None, out=None):
        K, b = self.weights(n)
        return self.apply(u, K, b, h, save, out)

    vjp_saved = DenseSteps.vjp_saved
    vjp_and_g = DenseSteps.vjp_and_g

    def linearize(self, u, K, b):
        if u.dim() == 4:
            return self.act.saved_of(self._z(u, K, b))
        return torch.stack([self.linearize(u[i], K[i], b[i]) for i in range(u.shape[0])])

    def vjp_from_g(self, g, lam, K, h, out=None):
        """λ_{n+1} + h Kᵀ g (one state, or a stack of m with h a float or m sizes)."""
        if lam.dim() == 4:
            return torch.add(lam, self.conv_ops.input_vjp(g, K, h), out=out)
        out = torch.empty_like(lam) if out is None else out
        for i in range(lam.shape[0]):
            self.vjp_from_g(g[i], lam[i], K[i], _item(h, i), out[i])
        return out

    def vjp_weights(self, u, g):
        if u.dim() == 5:
            parts = [self.vjp_weights(u[i], g[i]) for i in range(u.shape[0])]
            return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
        gK = self.conv_ops.weight_vjp(u, g)
        gb = g.sum((0, 2, 3))
        if self.b.shape[-1] == 1:
            gb = gb.sum(-1, keepdim=True)
        return gK, gb


STEPPERS = {"dense": DenseSteps, "conv": ConvSteps}


def _scaled(K, b, act: Activation):
    """The weights a stepper stores: scale_in·(K, b), so z' = K u + b needs no extra pass.

    Then λ ← λ + h·scale_out·Kᵀ(f′ ⊙ λ) with the stored K, and the gradient of the
    parameters is h·slope·(f′ ⊙ λ) uᵀ.
    """
    s = act.scale_in
    return (K, b) if s == 1.0 else (K * s, b * s)


def _euler(u, a, h, act, out=None):
    """u + h·σ = u + h·scale_out·a + h·shift for a = f(z')."""
    if isinstance(h, torch.Tensor):
        hb = _bcast(h, a)
        y = torch.addcmul(u, hb, a, value=act.scale_out, out=out)
        return y.add_(hb * act.shift) if act.shift else y
    y = torch.add(u, a, alpha=h * act.scale_out, out=out)
    return y.add_(h * act.shift) if act.shift else y


def _bcast(h, like):
    """h as a float, or an (m,) tensor reshaped to broadcast over like (m, ...)."""
    if not isinstance(h, torch.Tensor):
        return h
    return h.view(-1, *([1] * (like.dim() - 1)))


def _runs(sizes: list) -> list[tuple[int, int, float]]:
    """(i, j, size) of each run sizes[i:j] of equal values, in order."""
    runs, i = [], 0
    for j in range(1, len(sizes) + 1):
        if j == len(sizes) or sizes[j] != sizes[i]:
            runs.append((i, j, sizes[i]))
            i = j
    return runs


def _item(h, i):
    return float(h[i]) if isinstance(h, torch.Tensor) else h
