"""lptrain's built-in dense and conv steps as a step family for `lptrain.LayerParallel`.

    steps = BuiltinSteps.dense(K, b, activation="tanh")   # K (N, w, w), b (N, w) or (N, 1)
    steps = BuiltinSteps.conv(K, b, activation="tanh")    # K (N, c, c, 3, 3), b (N, c) or (N, 1)
    net = LayerParallel(steps, T=2.0, mgrit=..., comm=...)

Layer n is a module f_n(u) = σ(K_n u + b_n) (dense, states (B, w)) or σ(K_n ⋆ u + b_n)
(3×3 convolution, states (B, c, H, W)) with parameters `K` and `b`, so a rank holds,
trains and saves its own layers as for any user module.  Their parameters are views
of one stacked (N, ...) tensor per kind, so MGRIT runs the steps of model/steps.py
on it (stacked steps, the forward's saved activations, hand-written adjoint and
weight products: parallel/stepper_family.py) with no copy per solve; if a layer's
parameters stop being such views (`.to()` another dtype, a tensor assigned), the
stack is rebuilt from them at the next forward.
"""
from __future__ import annotations

from operator import is_, itemgetter
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from lptrain.errors import ConfigError, one_of
from lptrain.model.activations import ACTIVATIONS, Activation
from lptrain.model.module_steps import ModuleSteps
from lptrain.model.steps import STEPPERS
from lptrain.parallel.stepper_family import StepperFamily


class _Views(NamedTuple):
    """The built layers' parameter dicts, K and b parameters, and the addresses of
    the stacks' rows they should point to (layer order as built)."""

    params: list
    Ks: list
    bs: list
    K_rows: list
    b_rows: list


class StepperLayer(nn.Module):
    """One built-in residual branch: σ(K u + b) (dense) or σ(K ⋆ u + b) (conv)."""

    def __init__(self, kind: str, K: torch.Tensor, b: torch.Tensor, act: Activation):
        super().__init__()
        self.kind, self.act = kind, act
        self.K, self.b = nn.Parameter(K), nn.Parameter(b)     # views of the stacks

    def extra_repr(self) -> str:
        """What print() shows of the layer: its kind, K's shape and the activation."""
        return f"{self.kind}, K {tuple(self.K.shape)}, activation={self.act.name}"

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        if self.kind == "dense":
            return self.act(F.linear(u, self.K, self.b))
        bias = self.b.expand(self.K.shape[0]) if self.b.numel() == 1 else self.b
        return self.act(F.conv2d(u, self.K, bias, padding=1))


class BuiltinSteps(ModuleSteps):
    """N built-in residual layers of one kind ("dense" or "conv"), initial weights K, b.

    A `ModuleSteps` (the modules, their parameters and the halo exchange work as for
    a user's layers) and an `mgrit.protocols.StepFamily` whose propagators are the
    built-in steppers' (those of `lptrain` on the command line).
    """

    def __init__(self, kind: str, K: torch.Tensor, b: torch.Tensor, activation: str = "tanh"):
        if kind not in STEPPERS:
            raise ConfigError(f"kind={kind!r}: built-in steps are {sorted(STEPPERS)}")
        if activation not in ACTIVATIONS:
            raise ConfigError(f"activation={activation!r}: {one_of(sorted(ACTIVATIONS))}")
        _check_shapes(kind, K, b)
        self.kind, self.act = kind, ACTIVATIONS[activation]
        self._K = K.detach().clone().contiguous()
        self._b = b.detach().clone().contiguous()
        self._stepper_cls = STEPPERS[kind]
        self.fast = StepperFamily(None)
        self._views = _Views([], [], [], [], [])    # the built layers' as last checked
        with torch.random.fork_rng(devices=[]):     # no draw from the caller's stream
            super().__init__(self._layer, n_layers=K.shape[0], build=(), channels_last=False)

    @classmethod
    def dense(cls, K, b, activation: str = "tanh") -> "BuiltinSteps":
        return cls("dense", K, b, activation)

    @classmethod
    def conv(cls, K, b, activation: str = "tanh") -> "BuiltinSteps":
        return cls("conv", K, b, activation)

    def sample_shape(self) -> tuple:
        """(w,) for dense steps, (c, any, any) for conv steps."""
        w = self._K.shape[1]
        return (w,) if self.kind == "dense" else (w, None, None)

    def _layer(self, n: int) -> StepperLayer:
        return StepperLayer(self.kind, self._K[n], self._b[n], self.act)

    # -- the stacks the steppers run on ----------------------------------------------
    def _sync(self) -> None:
        """Stacks whose rows are the built layers' parameters (rebuilt if they are not)."""
        built = len(self.modules) + len(self.halo)
        if built == 0:
            return
        if built != len(self._views.Ks):
            self._take_views(self._built())
        if self._aliased():
            return
        layers = self._built()
        ref = layers[0][1].K
        K = self._K.to(dtype=ref.dtype, device=ref.device).clone()
        b = self._b.to(dtype=ref.dtype, device=ref.device).clone()
        for n, m in layers:
            K[n], b[n] = m.K.detach(), m.b.detach()
        self._K, self._b = K, b
        for n, m in layers:
            m.K.data, m.b.data = K[n], b[n]
        self._take_views(layers)

    def _built(self) -> list:
        return [(int(k), m) for k, m in self.modules.items()] + list(self.halo.items())

    def _take_views(self, layers) -> None:
        """Remember the layers' parameters and the stacks' rows they should point to."""
        K, b = self._K, self._b
        sk, sb = K.stride(0) * K.element_size(), b.stride(0) * b.element_size()
        self._views = _Views([m._parameters for _, m in layers], [m.K for _, m in layers],
                             [m.b for _, m in layers],
                             [K.data_ptr() + n * sk for n, _ in layers],
                             [b.data_ptr() + n * sb for n, _ in layers])

    def _aliased(self) -> bool:
        """Whether every built layer's K and b are still the stacks' rows (the same
        parameter objects, pointing there, in the stacks' dtype and device); checked
        with C-level maps, not a Python loop over the layers."""
        v, K = self._views, self._K
        return all(map(is_, map(itemgetter("K"), v.params), v.Ks)) \
            and all(map(is_, map(itemgetter("b"), v.params), v.bs)) \
            and list(map(torch.Tensor.data_ptr, v.Ks)) == v.K_rows \
            and list(map(torch.Tensor.data_ptr, v.bs)) == v.b_rows \
            and v.Ks[0].dtype == K.dtype and v.bs[0].dtype == self._b.dtype \
            and v.Ks[0].device == K.device

    def load_flat(self, n: int, vec: torch.Tensor) -> None:
        """A borrowed layer's K, b and training flag from one vector (ModuleSteps.flat's
        order); K and b written
        through `.data`: every layer's parameters are rows of the stacks and share their
        version counters, so the write must not look like an in-place change of this
        rank's own parameters that an earlier forward saved for its backward."""
        m = self.module(n)
        k, kb = m.K.numel(), m.K.numel() + m.b.numel()
        if vec.numel() != self.numel(n):
            raise ValueError(f"layer {n}: {vec.numel()} values for {self.numel(n)} "
                             "parameters and training flags")
        m.K.data.copy_(vec[:k].view_as(m.K))
        m.b.data.copy_(vec[k:kb].view_as(m.b))
        self._load_modes(n, vec[kb:])

    def stepper(self):
        """The built-in stepper over the current parameters."""
        self._sync()
        return self._stepper_cls(self._K, self._b, self.act)

    # -- mgrit.protocols.StepFamily --------------------------------------------------
    def to_state(self, u):
        return self._stepper_cls.to_state(u)

    def from_state(self, u):
        return self._stepper_cls.from_state(u)

    def forward_propagator(self, h, average, span, template, keep, fixed=False):
        return self.fast.bind(self.stepper()).forward_propagator(h, average, span,
                                                                 template, keep)

    def adjoint_propagator(self, h, average, span, state, kept, fixed=False):
        if kept is None:        # a second backward of one forward: the current weights
            self.fast.bind(self.stepper())
        return self.fast.adjoint_propagator(h, average, span, state, kept)

    def param_grads(self, adjoint, layers, lam) -> dict:
        return self.fast.param_grads(adjoint, layers, lam)


def _check_shapes(kind: str, K: torch.Tensor, b: torch.Tensor) -> None:
    for name, t in (("K", K), ("b", b)):
        if not t.is_floating_point():
            raise ConfigError(f"{kind} steps: {name} is {t.dtype}; the weights must be "
                              f"floating point, e.g. torch.float64")
    want = 3 if kind == "dense" else 5
    if K.dim() != want or K.shape[1] != K.shape[2] or (kind == "conv"
                                                       and tuple(K.shape[3:]) != (3, 3)):
        form = "(N, w, w)" if kind == "dense" else "(N, c, c, 3, 3)"
        raise ConfigError(f"{kind} steps: K of shape {tuple(K.shape)}, need {form}")
    if b.dim() != 2 or b.shape[0] != K.shape[0] or b.shape[1] not in (1, K.shape[1]):
        raise ConfigError(f"{kind} steps: b of shape {tuple(b.shape)}, need "
                          f"({K.shape[0]}, {K.shape[1]}) or ({K.shape[0]}, 1)")
