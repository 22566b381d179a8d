"""A user's coarse-level residual branches g: coarse MGRIT steps u ← u + H·g(u).

The factory is called once per coarse step with a `CoarseStep` (its level, its
index on that level, the fine layers it covers and its step size H) and returns an
`nn.Module` that keeps the state's shape.  Its parameters whose names and shapes
equal the fine layers' follow training: every step runs g with those parameters
set to the covered layers' coarse parameters (their mean for coarse_weights=average,
the first layer's for inject), as `load_state_dict(strict=False)` would match them.
Its other parameters and buffers are its own, as the factory made them (the factory
runs with torch's seed set to a base + a number of the step, so every rank builds
the same module).  A module is built on the rank that first steps with it, and
follows the states' dtype and device.  The factory is kept for the steps not yet
built, so pickling the module (torch.save, multiprocessing) pickles it: by its name,
which a lambda or a function defined inside another has none of.
"""
from __future__ import annotations

import copy
import functools
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain

import torch
from torch import nn
from torch.func import functional_call

from lptrain.errors import ConfigError
from lptrain.model.module_steps import kept_update, seeded, value_only
from lptrain.model.module_vjp import Linear, Params, with_params


@dataclass(frozen=True)
class CoarseStep:
    """The step from point `index` of coarse level `level` (>= 1): it covers the fine
    layers `layers`, with step size h = T/N · len(layers)."""

    level: int
    index: int
    layers: range
    h: float


class CoarseSteps:
    """The user's coarse modules, built on first use, keyed by CoarseStep."""

    def __init__(self, factory: Callable[[CoarseStep], nn.Module]):
        if not callable(factory) or isinstance(factory, nn.Module):
            raise ConfigError(f"coarse_steps={factory!r}: need a factory "
                              "coarse_steps(CoarseStep) -> nn.Module")
        self.factory = factory
        self._seed = int(torch.randint(2 ** 62, (1,)))
        self._built: dict[CoarseStep, tuple[nn.Module, list[str]]] = {}

    def __reduce_ex__(self, protocol):
        """Pickled with the factory, refused in one line where that has no importable
        name: pickle's own error named a `<lambda>` but not the argument or the remedy.
        Checked by name, not by a trial pickle, which would recurse forever on a factory
        that holds the module being pickled (a bound method, a partial of the model)."""
        name = _local_name(self.factory)
        if name is not None:
            raise pickle.PicklingError(
                f"coarse_steps={name} cannot be pickled (torch.save(module), "
                f"multiprocessing): it has no importable name; give a named function "
                f"defined at the top level of a module (def coarse(c): ...)")
        return super().__reduce_ex__(protocol)

    def __copy__(self) -> "CoarseSteps":
        """A shallow copy (the same factory and built modules), not by pickling, so a
        lambda factory copies as it did before pickling was checked."""
        other = object.__new__(CoarseSteps)
        other.__dict__.update(self.__dict__)
        return other

    def __deepcopy__(self, memo) -> "CoarseSteps":
        """A copy with copies of the built modules and the same factory (any callable,
        a lambda too: deepcopy takes functions as they are, not by pickling)."""
        other = object.__new__(CoarseSteps)
        memo[id(self)] = other
        other.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return other

    def module(self, step: CoarseStep, like: torch.Tensor,
               P: Params) -> tuple[nn.Module, list[str]]:
        """g of `step` on `like`'s dtype and device, and the names it takes from the fine
        layers' parameters P."""
        if step not in self._built:
            self._built[step] = self._build(step, P)
        g, tracked = self._built[step]
        ref = next(g.parameters(), None)
        if ref is not None and (ref.dtype != like.dtype or ref.device != like.device):
            g.to(device=like.device, dtype=like.dtype)
        return g, tracked

    def _build(self, step: CoarseStep, P: Params):
        with seeded(self._seed + 7919 * step.level + step.index):
            g = self.factory(step)
        if not isinstance(g, nn.Module):
            raise ConfigError(f"coarse_steps returned {type(g).__name__} for {step}, "
                              "not an nn.Module")
        tracked = []
        for name, p in g.named_parameters():
            if name in P:
                if p.shape != P[name].shape:
                    raise ConfigError(
                        f"coarse step {step.level}:{step.index}: parameter {name!r} has shape "
                        f"{tuple(p.shape)}, the fine layers' {tuple(P[name].shape)}; rename "
                        "it to keep it the coarse module's own")
                tracked.append(name)
        return g, tracked

    def f(self, step: CoarseStep, u, P: Params) -> torch.Tensor:
        """g(u), its tracked parameters taken from P."""
        g, tracked = self.module(step, u, P)
        if not tracked:
            return g(u)
        return functional_call(g, {k: P[k] for k in tracked}, (u,))

    def step(self, u, step: CoarseStep, P: Params) -> torch.Tensor:
        """u + H·g(u) (a new tensor)."""
        y = kept_update(f"coarse step {step.level}:{step.index}", u, self.f(step, u, P))
        return torch.add(u, value_only(y, chain((u,), P.values())), alpha=step.h)

    def linearize(self, u, step: CoarseStep, P: Params, layout) -> Linear:
        """g's autograd graph at u (state products only)."""
        with torch.enable_grad():
            x = layout(u.detach()).clone().requires_grad_()
            P = {k: v.detach() for k, v in P.items()}
            y = self.f(step, x, P)
        g, tracked = self.module(step, u, P)
        return Linear(y, x, None, layout, with_params(g, {k: P[k] for k in tracked}))


def _local_name(factory) -> str | None:
    """The name of `factory`'s function (through partials and bound methods) where
    pickle cannot look it up (its qualified name has a `<lambda>` or `<locals>`), else
    None."""
    while isinstance(factory, functools.partial):
        factory = factory.func
    qualname = getattr(factory, "__qualname__", None)
    if isinstance(qualname, str) and ("<lambda>" in qualname or "<locals>" in qualname):
        return factory.__name__
    return None
