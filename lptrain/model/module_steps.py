"""A user's residual branches f_n (torch modules) as a time stepper u ← u + h·f_n(u).

Interface (numerics only: no MPI, no MGRIT; lptrain/parallel/module_solver.py
drives it):

    steps = ModuleSteps(layers, n_layers=None, build=None, stack=False)

    layers    a sequence of N `nn.Module`s (f_0..f_{N−1}), or a factory
              `layers(n) -> nn.Module` (then `n_layers` is required) so that a
              rank constructs only the layers it needs (`build`, default all).
              The factory runs with torch's seed set to base + n (base: one draw
              from the caller's stream), so layer n starts the same on any rank;
              it is let go once every layer is built (a lambda's layers pickle).
    stack     True: stacked steps of several layers run as one `torch.func.vmap`
              over the layers' stacked parameters.  Only for layers that share
              one structure (the same module class and hyper-parameters, differing
              only in parameter values); False: one layer at a time (any modules).
    channels_last  linearisations (`linearize`) see 4-d states in channels_last
              memory format (same values, a faster convolution backward on CPUs),
              except in layers that draw (dropout): a mask is drawn in memory order,
              so f and its linearisations see their states contiguous there.

    steps.modules            nn.ModuleDict 'n' -> f_n of the layers built here
    steps.ensure(n, halo=False)  build layer n (the factory) if it is not here yet;
                             halo=True: outside `modules` (another rank's layer)
    steps.params(n)          {name: tensor} current parameters of f_n (detached)
    steps.mean_params(ns)    their mean over layers ns (coarse "average" steps)
    steps.f(n, u, P=None)    f_n(u), with parameters P (default: its own) via
                             torch.func.functional_call; any state shape
    steps.step(u, n, h, P=None, out=None)  u + h·f_n(u) [into out]
    steps.step_many(U, ns, hs, Ps)       the same for states stacked on dim 0
    steps.linearize(u, n, P=None, params=False) -> Linear: f_n's graph at u;
        Linear.vjp_state(λ) = (∂f/∂u)ᵀλ, Linear.vjp_params(λ) = (∂f/∂θ)ᵀλ
        (a dict by parameter name; needs params=True), Linear.vjp_both(λ) both
        in one backward pass (model/module_vjp.py)
    steps.draws = (key, layers)  dropout in those layers draws from a generator seeded
                             by (key, n) at every call (the same mask all solve long)
    steps.flat(n) / steps.load_flat(n, vec)   parameters and buffers of f_n as one
                             vector (a borrowed layer's copy on another rank)

A step of size h from layer n uses f_n's parameters; coarse MGRIT steps use
the fine f with the coarse step size and either the parameters of the layer
where the step starts (inject) or their mean over the covered layers
(average: functional_call with averaged tensors, so any module works whose
parameters may be averaged meaningfully).  Buffers (e.g. running statistics)
are the module's own and are not averaged.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from itertools import chain

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn.modules.dropout import _DropoutNd

from lptrain.errors import ConfigError
from lptrain.model.module_vjp import Linear, Params, with_params


# what needs the layers of one structure, and the way out (first_structure)
AVERAGED = ("coarse_weights='average'", "their weights cannot be averaged: use "
            "coarse_weights='inject'")
STACKED = ("stack=True", "one vmap cannot run them: use stack=False")


class ModuleSteps:
    """Residual steps u + h·f_n(u) of user modules f_n, built where they are needed."""

    def __init__(self, layers: Sequence[nn.Module] | Callable[[int], nn.Module],
                 n_layers: int | None = None, build=None, stack: bool = False,
                 channels_last: bool = True):
        if callable(layers) and not isinstance(layers, nn.Module):
            if n_layers is None or n_layers < 1:
                raise ConfigError(f"n_layers={n_layers!r}: a layer factory needs the number "
                                  "of layers (>= 1)")
            self._factory, self.n_layers = layers, int(n_layers)
            # layer n is built from seed base + n, whichever rank builds it and whatever it
            # built before; the caller's random stream advances by this one draw
            self._seed = int(torch.randint(2 ** 62, (1,)))
        else:
            layers = list(layers)
            if not layers or not all(isinstance(m, nn.Module) for m in layers):
                raise ConfigError(f"layers: need a non-empty sequence of nn.Module, got "
                                  f"{[type(m).__name__ for m in layers]}")
            if n_layers is not None and n_layers != len(layers):
                raise ConfigError(f"n_layers={n_layers} but {len(layers)} modules given")
            self._given, self._factory, self.n_layers = layers, None, len(layers)
        self.stack, self.channels_last = stack, channels_last
        self.draws: tuple[int, set[int]] | None = None   # (key, layers): see _keyed
        self.pinned: dict[int, list] = {}       # layer: its buffers' values for a solve
        self.modules = nn.ModuleDict()
        self.halo: dict[int, nn.Module] = {}
        for n in range(self.n_layers) if build is None else sorted(set(build)):
            self.ensure(n)

    # -- layers ----------------------------------------------------------------------
    def sample_shape(self) -> tuple | None:
        """The shape of one sample's state the layers take (None in an entry: any size;
        None: any shape, as a user's layers may take)."""
        return None

    def ensure(self, n: int, halo: bool = False) -> nn.Module:
        """f_n, built (by the factory) or taken (from the sequence) if not here yet.

        halo: a copy of another rank's layer, kept outside `modules` (so not among
        the parameters an optimizer sees); its owner sends its parameter values.
        """
        if str(n) in self.modules or n in self.halo:
            return self.module(n)
        if not 0 <= n < self.n_layers:
            raise IndexError(f"layer {n} outside 0..{self.n_layers - 1}")
        module = self._build(n) if self._factory else self._given[n]
        if not isinstance(module, nn.Module):
            raise ConfigError(f"layer factory returned {type(module).__name__} for "
                              f"layer {n}, not an nn.Module")
        if halo:
            self.halo[n] = module
        else:
            self.modules[str(n)] = module
        if len(self.modules) + len(self.halo) == self.n_layers:
            self._factory = None    # nothing left to build: torch.save pickles no lambda
        return module

    def _build(self, n: int) -> nn.Module:
        with seeded(self._seed + n):
            return self._factory(n)

    def module(self, n: int) -> nn.Module:
        key = str(n)
        if key in self.modules:
            return self.modules[key]
        if n in self.halo:
            return self.halo[n]
        raise IndexError(f"layer {n} is not built on this rank (built: {self.built})")

    @property
    def built(self) -> list[int]:
        return sorted(int(k) for k in self.modules)

    def params(self, n: int) -> Params:
        return {k: p.detach() for k, p in self.module(n).named_parameters()}

    def mean_params(self, ns) -> Params:
        """The mean of layers `ns`' parameters (coarse_weights=average), for layers of
        one structure (ConfigError)."""
        self.check_one_structure(ns)
        ps = [self.params(n) for n in ns]
        return {k: torch.stack([p[k] for p in ps]).mean(0) for k in ps[0]}

    def structure(self, n: int) -> list[tuple[str, tuple[int, ...]]]:
        """f_n's parameter names and shapes."""
        return [(k, tuple(p.shape)) for k, p in self.module(n).named_parameters()]

    def check_one_dtype(self, ns) -> None:
        """ConfigError unless layers `ns` hold their floating tensors in one dtype (a
        layer built in another one ended in torch's error from inside the solve)."""
        seen: dict = {}          # dtype -> the first layer holding it
        for n in ns:
            for t in self._state(n):
                if t.is_floating_point():
                    seen.setdefault(t.dtype, n)
        if len(seen) > 1:
            (a, first), (b, other) = list(seen.items())[:2]
            who = f"layer {first} holds" if first == other else \
                f"layers {first} and {other} hold"
            raise ConfigError(f"{who} {a} and {b} tensors: build every layer in one dtype "
                              f"(.to(dtype) on each)")

    def check_one_structure(self, ns, why: str = AVERAGED) -> None:
        """ConfigError unless layers `ns` have the same parameter names and shapes, which
        `why` needs (a coarse step with averaged weights; layers stacked in one vmap)."""
        first_structure(((n, self.structure(n)) for n in ns), why)

    def _state(self, n: int) -> list[torch.Tensor]:
        """f_n's parameters, then its buffers (e.g. a BatchNorm's running statistics):
        the tensors f_n computes with."""
        module = self.module(n)
        return [*module.parameters(), *module.buffers()]

    def flat(self, n: int) -> torch.Tensor:
        """f_n's parameters, buffers and each submodule's training flag (1 or 0) as one
        vector in the parameters' dtype: what a copy of the layer on another rank needs
        to compute what the owner's does (train() or eval() set per submodule too)."""
        ts = [t.detach() for t in self._state(n)]
        dtype = self.flat_dtype(n)
        modes = torch.tensor([float(m.training) for m in self.module(n).modules()],
                             dtype=dtype, device=ts[0].device if ts else None)
        return torch.cat([*(t.reshape(-1).to(dtype) for t in ts), modes])

    def flat_dtype(self, n: int) -> torch.dtype:
        """The dtype of `flat(n)`: f_n's first floating tensor's, the default one for a
        layer without (an activation alone), on the owner and on a rank receiving it."""
        return next((t.dtype for t in self._state(n) if t.is_floating_point()),
                    torch.get_default_dtype())

    def load_flat(self, n: int, vec: torch.Tensor) -> None:
        """Set f_n's parameters, buffers and training flags from one vector (as `flat`
        lays them out)."""
        if vec.numel() != self.numel(n):
            raise ValueError(f"layer {n}: {vec.numel()} values for {self.numel(n)} "
                             f"parameters, buffers and training flags")
        offset = 0
        with torch.no_grad():
            for t in self._state(n):
                t.copy_(vec[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
        self._load_modes(n, vec[offset:])

    def _load_modes(self, n: int, flags: torch.Tensor) -> None:
        """Each submodule of f_n in training mode or not, as `flat`'s tail gives it."""
        for m, mode in zip(self.module(n).modules(), flags.tolist()):
            m.training = mode != 0.0

    def numel(self, n: int) -> int:
        """The length of `flat(n)`."""
        return sum(t.numel() for t in self._state(n)) + len(list(self.module(n).modules()))

    # -- forward -------------------------------------------------------------------
    def layout(self, u: torch.Tensor) -> torch.Tensor:
        """u as linearisations see it: 4-d states in channels_last memory format (same
        values; the convolutions' backward is faster in it on CPUs, their forward not:
        BENCHMARKS.md, so forward steps keep the caller's format)."""
        if self.channels_last and u.dim() == 4:
            return u.contiguous(memory_format=torch.channels_last)
        return u

    def _copy(self, u: torch.Tensor) -> torch.Tensor:
        cl = self.channels_last and u.dim() == 4
        return u.detach().clone(memory_format=torch.channels_last if cl
                                else torch.contiguous_format)

    # -- random draws --------------------------------------------------------------
    def draw_layers(self, layers) -> set[int]:
        """Those of `layers` (built here) with a dropout module in training mode: f
        draws a mask each time it runs."""
        return {n for n in layers for m in self.module(n).modules()
                if isinstance(m, _DropoutNd) and m.training and m.p > 0}

    def _keyed(self, n: int):
        """Layer n as one function for a whole solve: its buffers pinned (fresh copies of
        `pinned`'s values: parallel/train_buffers.py), its draws from the generator
        seeded with the key `draws` gives it (the same mask at every evaluation of f_n
        within one forward and its backward), or torch's as they come where the layer
        draws nothing or no key is set."""
        for buffers, name, value in self.pinned.get(n, ()):
            buffers[name] = value.clone()
        if not self._draws(n):
            return nullcontext()
        return seeded((self.draws[0] * self.n_layers + n) % 2 ** 63)

    def _draws(self, n: int) -> bool:
        return self.draws is not None and n in self.draws[1]

    def f(self, n: int, u: torch.Tensor, P: Params | None = None) -> torch.Tensor:
        """f_n(u), with parameters P in place of f_n's own if given."""
        module = self.module(n)
        if self._draws(n):
            u = u.contiguous()      # a mask is drawn in memory order: one order for all
        with self._keyed(n):
            if P is None:
                return module(u)
            return functional_call(module, P, (u,))

    def step(self, u, n: int, h: float, P: Params | None = None, out=None) -> torch.Tensor:
        """u + h·f_n(u) (a new tensor, or written into `out`)."""
        y = kept_update(n, u, self.f(n, u, P))
        given = chain((u,), self.module(n).parameters() if P is None else P.values())
        return torch.add(u, value_only(y, given), alpha=h, out=out)

    def step_many(self, U, ns, hs, Ps) -> torch.Tensor:
        """U[i] + hs[i]·f_{ns[i]}(U[i]) for states stacked on dim 0 (a new tensor);
        Ps[i] None: layer ns[i]'s own parameters."""
        if self.stack and len(ns) > 1 and self.draws is None and not self.pinned:
            Ps = [self.params(n) if P is None else P for n, P in zip(ns, Ps)]
            P = {k: torch.stack([p[k] for p in Ps]) for k in Ps[0]}
            module = self.module(ns[0])
            F = kept_update(ns[0], U, vmap(lambda p, u: functional_call(module, p, (u,)))(P, U))
            F = value_only(F, chain((U,), P.values()))
            h = torch.as_tensor(hs, dtype=U.dtype, device=U.device)
            return torch.addcmul(U, h.view(-1, *([1] * (U.dim() - 1))), F)
        return torch.stack([self.step(U[i], n, hs[i], Ps[i]) for i, n in enumerate(ns)])

    # -- adjoint -------------------------------------------------------------------
    def linearize(self, u, n: int, P: Params | None = None, params: bool = False,
                  who=None) -> Linear:
        """f_n's autograd graph at state u (what its vector-Jacobian products need); its
        f_n(u) is held to `kept_update` as a forward step's is (`who` names the step in
        the error, else layer n).

        Without P the graph runs through f_n's own parameters (no functional_call);
        their products are only computed when asked for (`vjp_params`), never
        accumulated into .grad, and only for those that require grad: a parameter
        the user froze is part of f, not of its gradient."""
        around = nullcontext            # f's own parameters: nothing to re-enter
        drawn = self._draws(n)          # the forward's masks: f's memory order (f above)
        layout = (lambda t: t) if drawn else self.layout
        with torch.enable_grad(), self._keyed(n):
            # a copy: u's buffer may be overwritten
            x = (u.detach().clone(memory_format=torch.contiguous_format) if drawn
                 else self._copy(u)).requires_grad_()
            if P is None:
                y = self.module(n)(x)
                leaves = {k: p for k, p in self.module(n).named_parameters()
                          if p.requires_grad}
            else:
                leaves = {k: v.detach().requires_grad_(params) for k, v in P.items()}
                y = functional_call(self.module(n), leaves, (x,))
                around = with_params(self.module(n), leaves)
        kept_update(n if who is None else who, x, y)
        return Linear(y, x, leaves if params else None, layout, around)


@contextmanager
def seeded(seed: int):
    """torch's CPU generator seeded with `seed` in the block and restored after (a layer
    built alike on every rank, the caller's random stream untouched). Where CUDA is
    available its generators are seeded too, by torch.manual_seed (not restored); else
    the CPU generator alone: torch.manual_seed then queues the seed for each device
    kind that could start later, capturing a stack trace for each, at every layer."""
    with torch.random.fork_rng(devices=[]):
        if torch.cuda.is_available():
            torch.manual_seed(seed)
        else:
            torch.default_generator.manual_seed(seed)
        yield


def first_structure(structures, why=AVERAGED) -> None:
    """ConfigError naming the first two of (layer, structure) pairs that differ, and why
    (`why`: what needs one structure, and the way out)."""
    first = None
    for n, structure in structures:
        if first is None:
            first = (n, structure)
        elif structure != first[1]:
            raise ConfigError(f"{why[0]}: layers {first[0]} and {n} differ in their "
                              f"parameters ({_describe(first[1])} against "
                              f"{_describe(structure)}); {why[1]}")


def _describe(structure) -> str:
    """'weight 6x6, bias 6' (or 'none')."""
    return ", ".join(f"{k} {'x'.join(map(str, shape)) or 'scalar'}"
                     for k, shape in structure) or "none"


def value_only(y, inputs=()):
    """A forward step's update y, without its graph where no caller can want one (under
    torch.no_grad, or none of `inputs`, the state and parameters it was computed from,
    requires grad; an iterable, looked at only where y has a graph): a step that takes
    autograd.grad with create_graph inside (a Hamiltonian branch) returns a graph even
    then, which `out=` and in-place updates of the state refuse. The adjoint
    differentiates f anew at the kept state (`linearize`)."""
    if isinstance(y, torch.Tensor) and y.requires_grad and (
            not torch.is_grad_enabled() or not any(t.requires_grad for t in inputs)):
        return y.detach()
    return y


def kept_update(n, u: torch.Tensor, y) -> torch.Tensor:
    """y = f_n(u) (n: the layer, or the step's name), ValueError unless it is a tensor of
    u's shape and, outside autocast, of u's dtype (a tuple, another shape or a dtype of
    its own: the state would change silently or fail deep in torch)."""
    if not isinstance(y, torch.Tensor):
        raise ValueError(f"{_named(n)} maps a state to a {type(y).__name__}, not a tensor: a "
                         f"residual branch returns the state's update")
    if y.shape != u.shape:
        raise ValueError(f"{_named(n)} maps a state of shape {tuple(u.shape)} to "
                         f"{tuple(y.shape)}: a residual branch must keep the shape")
    if y.dtype != u.dtype and not torch.is_autocast_enabled(u.device.type):  # autocast casts
        raise ValueError(f"{_named(n)} maps a {u.dtype} state to {y.dtype}: a residual branch "
                         f"must keep the state's dtype")
    return y


def _named(n) -> str:
    return f"layer {n}" if isinstance(n, int) else str(n)
