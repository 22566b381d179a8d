"""The ODE-ResNet: options, flat parameter layout, opening, classifier, regulariser."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict

import torch
import torch.nn.functional as F

from lptrain.errors import ConfigError, one_of, require
from lptrain.model.activations import ACTIVATIONS
from lptrain.model.custom import CustomStep, check_spec
from lptrain.model.custom_steps import ModuleThetaSteps
from lptrain.model.steps import STEPPERS

# the kinds of step: the built-in steppers and the user's module (model/custom.py)
KINDS = {**STEPPERS, "custom": ModuleThetaSteps}
OPENINGS = {"dense": ("dense", "pad"), "conv": ("replicate", "conv"),
            "custom": ("dense", "pad", "replicate", "conv")}
VECTOR_OPENINGS = ("dense", "pad")     # openings of feature vectors (the others: images)
MAX_T = 1e4      # final times beyond this give steps forward Euler cannot take
MIN_H = 1e-8     # layer steps below this add nothing (near 1e-162 the regulariser's h² is 0)
MAX_INIT = 1e2   # initial weight scales beyond this saturate every activation


class _Seed(torch.autograd.Function):
    """A scalar whose gradient with respect to u is λ: `autograd.grad(_Seed.apply(u, λ),
    θ)` is the VJP (∂u/∂θ)ᵀλ, λ handed to u's node as `grad_outputs=λ` would hand it,
    without the shape checks that import sympy on a process's first such call. Its
    value is 0 (never used); only as autograd.grad's output, whose seed is 1."""

    @staticmethod
    def forward(ctx, u, lam):
        ctx.save_for_backward(lam)
        return u.new_zeros(())

    @staticmethod
    def backward(ctx, seed):
        (lam,) = ctx.saved_tensors
        return lam, None


@dataclass
class NetworkOptions:
    name: str = "dense"          # dense | conv | custom
    width: int = 8               # dense: state width; conv: ignored (see channels)
    channels: int = 4            # conv: channels of the state
    layers: int = 32             # N residual steps
    T: float = 1.0               # final time; h = T / N
    activation: str = "smoothrelu"
    bias: str = "vector"         # scalar (the authors') | vector
    opening: str = "dense"       # dense | pad (dense nets); replicate | conv (conv nets)
    pool: int = 1                # conv: the classifier sees pool×pool averages of u_N
    init: str = "uniform"        # uniform: U[0,1)·scale (the authors') | normal: N(0,1)·scale
    init_opening: float = 1e-3
    init_hidden: float = 1e-3
    init_classifier: float = 1e-3
    gamma_tik: float = 1e-7
    gamma_class: float = 1e-7
    gamma_ddt: float = 1e-5
    # custom: {_target_: the step's class, its keyword arguments} (model/custom.py)
    step: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        require(self.name in KINDS, "network.name", self.name, one_of(sorted(KINDS)))
        if self.name == "custom":
            check_spec(self.step, required=False)    # built (and required) by ResNet
        else:
            require(not self.step, "network.step", self.step,
                    f"only network=custom takes a step (network={self.name})")
        require(self.width > 0, "network.width", self.width, "must be positive")
        require(self.channels > 0, "network.channels", self.channels, "must be positive")
        require(self.layers > 0, "network.layers", self.layers, "must be positive")
        require(0 < self.T <= MAX_T, "network.T", self.T, f"must be in (0, {MAX_T:g}]")
        most = int(MAX_T / MIN_H)      # layers that any T <= MAX_T steps at h >= MIN_H
        require(self.layers <= most, "network.layers", self.layers,
                f"the layer step h = T/N is below {MIN_H:g} for every network.T up to "
                f"{MAX_T:g}: at most {most} layers")
        require(self.T >= MIN_H * self.layers * (1 - 1e-12), "network.T", self.T,
                f"the layer step h = T/N = {self.T / self.layers:.3g} (N = {self.layers}) "
                f"is below {MIN_H:g}: take T >= {MIN_H * self.layers:.3g}")
        require(self.activation in ACTIVATIONS, "network.activation", self.activation,
                one_of(sorted(ACTIVATIONS)))
        require(self.bias in ("scalar", "vector"), "network.bias", self.bias,
                one_of(("scalar", "vector")))
        require(self.opening in OPENINGS[self.name], "network.opening", self.opening,
                f"{one_of(OPENINGS[self.name])} for network={self.name}")
        require(self.pool >= 1, "network.pool", self.pool, "must be >= 1 (1: no pooling)")
        require(self.init in ("uniform", "normal"), "network.init", self.init,
                one_of(("uniform", "normal")))
        for key in ("init_opening", "init_hidden", "init_classifier"):
            require(0 <= getattr(self, key) <= MAX_INIT, f"network.{key}", getattr(self, key),
                    f"must be in [0, {MAX_INIT:g}] (a scale of the initial weights)")
        for key in ("gamma_tik", "gamma_class", "gamma_ddt"):
            require(0 <= getattr(self, key) < math.inf, f"network.{key}", getattr(self, key),
                    "must be a finite number >= 0")

    @property
    def h(self) -> float:
        return self.T / self.layers


@dataclass(frozen=True)
class Block:
    name: str
    shape: tuple[int, ...]
    group: str  # opening | hidden | classifier
    offset: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class Layout:
    """Where each parameter block lives in the flat vector θ."""

    def __init__(self, specs: list[tuple[str, tuple[int, ...], str]]):
        self.blocks, offset = {}, 0
        for name, shape, group in specs:
            self.blocks[name] = Block(name, tuple(shape), group, offset)
            offset += math.prod(shape)
        self.size = offset

    def views(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        return {b.name: theta.narrow(0, b.offset, b.size).view(b.shape)
                for b in self.blocks.values()}

    def __contains__(self, name: str) -> bool:
        return name in self.blocks


class ResNet:
    """Opening layer, N residual steps (a stepper) and a softmax classifier.

    Parameters live in one flat tensor θ laid out by `self.layout`; every
    method takes θ (or its views) explicitly so optimizers work on θ alone.
    """

    def __init__(self, opts: NetworkOptions, in_shape: tuple[int, ...], n_classes: int):
        self.opts, self.in_shape, self.n_classes = opts, tuple(in_shape), n_classes
        self.act = ACTIVATIONS[opts.activation]
        self.h = opts.h
        self.state_shape = self._state_shape()
        self.feature_shape = self._feature_shape()
        # custom: the user's module, built and tried once here (ConfigError if it fails)
        self.custom = CustomStep(opts.step, self.state_shape) if opts.name == "custom" \
            else None
        self.layout = Layout(self._specs())

    def _state_shape(self) -> tuple[int, ...]:
        o = self.opts
        if o.name == "custom":
            return self._custom_state_shape()
        if o.name == "dense":
            if len(self.in_shape) != 1:
                raise ConfigError(f"network.name=dense: a dense network takes feature "
                                  f"vectors, the data has samples of shape {self.in_shape}; "
                                  f"use network=conv for images")
            require(o.opening != "pad" or o.width >= self.in_shape[0], "network.width",
                    o.width, f"opening=pad needs width >= {self.in_shape[0]} features")
            return (o.width,)
        if len(self.in_shape) != 3:
            raise ConfigError(f"network=conv: expects images (C, H, W), data has shape "
                              f"{self.in_shape}")
        return (o.channels, *self.in_shape[1:])

    def _custom_state_shape(self) -> tuple[int, ...]:
        """Feature vectors open into (width,), images (C, H, W) into (channels, H, W)."""
        o, vectors = self.opts, len(self.in_shape) == 1
        if not vectors and len(self.in_shape) != 3:
            raise ConfigError(f"network=custom: expects feature vectors or images (C, H, W), "
                              f"data has shape {self.in_shape}")
        kinds = VECTOR_OPENINGS if vectors else tuple(k for k in OPENINGS["custom"]
                                                     if k not in VECTOR_OPENINGS)
        require(o.opening in kinds, "network.opening", o.opening,
                f"{one_of(kinds)} for network=custom on "
                f"{'feature vectors' if vectors else 'images'} of shape {self.in_shape}")
        if vectors:
            require(o.opening != "pad" or o.width >= self.in_shape[0], "network.width",
                    o.width, f"opening=pad needs width >= {self.in_shape[0]} features")
            return (o.width,)
        return (o.channels, *self.in_shape[1:])

    def _feature_shape(self) -> tuple[int, ...]:
        """What the classifier sees of u_N: the state, or its pool×pool averages."""
        p, s = self.opts.pool, self.state_shape
        if p == 1:
            return s
        require(len(s) == 3, "network.pool", p, "pooling needs images: network=conv")
        require(s[1] % p == 0 and s[2] % p == 0, "network.pool", p,
                f"must divide the image sides {s[1]}x{s[2]}")
        return (s[0], s[1] // p, s[2] // p)

    def _specs(self):
        o, N, s = self.opts, self.opts.layers, self.state_shape
        nb = 1 if o.bias == "scalar" else s[0]
        specs = []
        if o.opening == "dense":
            specs += [("open_K", (s[0], self.in_shape[0]), "opening"),
                      ("open_b", (s[0],), "opening")]
        elif o.opening == "conv":
            specs += [("open_K", (s[0], self.in_shape[0], 3, 3), "opening"),
                      ("open_b", (s[0],), "opening")]
        k_shape = (N, s[0], s[0]) if o.name == "dense" else (N, s[0], s[0], 3, 3)
        if self.custom is not None:     # a row of each layer's module parameters, no bias
            k_shape, nb = (N, self.custom.size), 0
        specs += [("K", k_shape, "hidden"), ("b", (N, nb), "hidden"),
                  ("W", (self.n_classes, math.prod(self.feature_shape)), "classifier"),
                  ("mu", (self.n_classes,), "classifier")]
        return specs

    # -- parameters ----------------------------------------------------------
    def signature(self) -> dict:
        """θ's blocks and, for the user's step, each layer's parameters, as names and
        shapes: what a saved θ is checked against where it is loaded (model/signature.py)."""
        step = None if self.custom is None else \
            [[n, list(s)] for n, s in zip(self.custom.names, self.custom.shapes)]
        return {"blocks": [[b.name, list(b.shape)] for b in self.layout.blocks.values()],
                "step": step}

    def init_params(self, seed: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
        """θ drawn from one seeded generator: identical on every rank."""
        gen = torch.Generator().manual_seed(seed)
        theta = torch.empty(self.layout.size, dtype=torch.float64)
        scale = {"opening": self.opts.init_opening, "hidden": self.opts.init_hidden,
                 "classifier": self.opts.init_classifier}
        for blk in self.layout.blocks.values():
            part = theta.narrow(0, blk.offset, blk.size)
            if self.opts.init == "uniform":
                part.uniform_(0.0, 1.0, generator=gen)
            else:
                part.normal_(0.0, 1.0, generator=gen)
            part.mul_(scale[blk.group])
        if self.custom is not None:     # the module's own initialisation (model/custom.py)
            self.layout.views(theta)["K"].copy_(self.custom.initial(self.opts.layers, seed))
        return theta.to(dtype=dtype, device=device)

    @property
    def _steps(self):
        """The stepper class: it owns the state layout."""
        return KINDS[self.opts.name]

    def stepper(self, theta: torch.Tensor):
        if self.custom is not None:
            return self._steps(*self.hidden_views(theta), self.custom)
        return self._steps(*self.hidden_views(theta), self.act)

    # -- blocks by role: the one place their names are spelled -------------------
    HIDDEN = ("K", "b")           # the N residual layers' weights and biases
    CLASSIFIER = ("W", "mu")      # the classifier's weights and biases

    def hidden_views(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, b) of a parameter-shaped flat tensor (θ or a gradient), as views."""
        v = self.layout.views(flat)
        return tuple(v[name] for name in self.HIDDEN)

    def classifier_views(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(W, mu) of a parameter-shaped flat tensor, as views."""
        v = self.layout.views(flat)
        return tuple(v[name] for name in self.CLASSIFIER)

    def assemble(self, flat: torch.Tensor, hidden=None, classifier=None) -> torch.Tensor:
        """Copy (K, b) and/or (W, mu) parts into their blocks of `flat`; returns flat."""
        for views, parts in ((self.hidden_views(flat), hidden),
                             (self.classifier_views(flat), classifier)):
            if parts is not None:
                for view, part in zip(views, parts):
                    view.copy_(part)
        return flat

    def state_dims(self, batch: int) -> tuple[int, ...]:
        """Shape of one state of `batch` samples in the stepper's layout."""
        return self._steps.state_dims(batch, self.state_shape)

    @property
    def batch_axis(self) -> int:
        """The axis of a state that indexes the samples."""
        return self._steps.BATCH_AXIS

    def new_state(self, x: torch.Tensor) -> torch.Tensor:
        """An uninitialised state for the batch x (its dtype and device)."""
        return x.new_empty(self.state_dims(x.shape[0]))

    def batch_major(self, u: torch.Tensor) -> torch.Tensor:
        """A state as (B, ...) (a view for dense states)."""
        return self._steps.from_state(u)

    # -- opening -------------------------------------------------------------
    def opening(self, theta: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """u_0 from the input batch y, in the stepper's layout."""
        v, o = self.layout.views(theta), self.opts.opening
        if o == "dense":
            return self.act(self._open_dense(v["open_K"], v["open_b"], y))
        if o == "conv":
            return self.act(F.conv2d(y, v["open_K"], v["open_b"], padding=1))
        if o == "pad":
            u = F.pad(y, (0, self.state_shape[0] - y.shape[1]))
            return u if self.batch_axis == 0 else u.t().contiguous()
        return y.expand(-1, self.state_shape[0], -1, -1).contiguous()  # replicate

    def _open_dense(self, K, b, y):
        """K y + b in the stepper's layout: feature-major (w, B) or batch-major (B, w)."""
        if self.batch_axis == 0:
            return F.linear(y, K, b)
        return torch.addmm(b.unsqueeze(1), K, y.t())

    def opening_vjp(self, theta, y, lam0, grad: torch.Tensor) -> None:
        """Accumulate ∂/∂θ_opening of ⟨λ_0, u_0(θ)⟩ into grad (views of θ's layout)."""
        if self.opts.opening not in ("dense", "conv"):
            return
        v, grad_views = self.layout.views(theta), self.layout.views(grad)
        with torch.enable_grad():
            K = v["open_K"].detach().requires_grad_()
            b = v["open_b"].detach().requires_grad_()
            u0 = self.act(self._open_dense(K, b, y) if self.opts.opening == "dense"
                          else F.conv2d(y, K, b, padding=1))
            gK, gb = torch.autograd.grad(_Seed.apply(u0, lam0), (K, b))
        grad_views["open_K"].add_(gK)
        grad_views["open_b"].add_(gb)

    # -- classifier ----------------------------------------------------------
    def classify(self, theta, uN, labels, n_total: int, want_grad: bool):
        """Cross-entropy summed over this batch / n_total, hits, λ_N and classifier grads.

        Returns (loss, correct, lamN, gW, gmu); the last three are None
        unless want_grad. A sample with a non-finite logit is no hit: argmax takes a NaN
        for the largest, and all-NaN logits scored 1/classes as if the model guessed.
        """
        v = self.layout.views(theta)
        flat, logits = self._logits(v, uN)
        loss = F.cross_entropy(logits, labels, reduction="sum") / n_total
        hits = (logits.argmax(1) == labels) & torch.isfinite(logits).all(1)
        correct = int(hits.sum())
        if not want_grad:
            return loss, correct, None, None, None
        dz = torch.softmax(logits, 1)
        dz[torch.arange(labels.numel()), labels] -= 1.0
        dz /= n_total
        lam = self._unpool(torch.mm(dz, v["W"]).view(dz.shape[0], *self.feature_shape))
        return loss, correct, self._steps.to_state(lam), torch.mm(dz.t(), flat), dz.sum(0)

    def logits(self, theta, uN) -> torch.Tensor:
        """Class scores (B, n_classes) of the final states u_N."""
        return self._logits(self.layout.views(theta), uN)[1]

    def _logits(self, v, uN):
        flat = self.batch_major(uN)
        if self.opts.pool > 1:
            flat = F.avg_pool2d(flat, self.opts.pool)
        # the width spelled out: a rank whose data shard is empty has 0 rows
        flat = flat.reshape(flat.shape[0], math.prod(self.feature_shape))
        return flat, torch.addmm(v["mu"], flat, v["W"].t())

    def _unpool(self, g: torch.Tensor) -> torch.Tensor:
        """The adjoint of the pooling: each average's gradient spread over its p×p pixels."""
        p = self.opts.pool
        if p == 1:
            return g
        return g.repeat_interleave(p, -1).repeat_interleave(p, -2).div_(p * p)

    # -- regulariser ---------------------------------------------------------
    def regulariser(self, theta: torch.Tensor, grad: torch.Tensor | None = None) -> float:
        """R(θ) of docs/method.md §1; adds ∇R into grad when given."""
        o, v = self.opts, self.layout.views(theta)
        grad_views = self.layout.views(grad) if grad is not None else None
        value = 0.0
        for blk in self.layout.blocks.values():
            gamma = o.gamma_class if blk.group == "classifier" else o.gamma_tik
            value += 0.5 * gamma * float(v[blk.name].pow(2).sum())
            if grad_views is not None:
                grad_views[blk.name].add_(v[blk.name], alpha=gamma)
        if o.layers > 1 and o.gamma_ddt > 0:
            scale = o.gamma_ddt / self.h ** 2
            for name in self.HIDDEN:
                d = v[name][1:] - v[name][:-1]
                value += 0.5 * scale * float(d.pow(2).sum())
                if grad_views is not None:
                    grad_views[name][1:].add_(d, alpha=scale)
                    grad_views[name][:-1].sub_(d, alpha=scale)
        return value
