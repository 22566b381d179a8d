"""A user's branch f at one state: the vector-Jacobian products of its autograd graph
(`Linear`, what `ModuleSteps.linearize` returns, model/module_steps.py), run in the
parameters the graph was built with (`with_params`).
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn
from torch.nn.utils.stateless import _reparametrize_module

Params = dict[str, torch.Tensor]


def with_params(module: nn.Module, P: Params):
    """A context in which `module` computes with P, as functional_call's f did: where f
    recomputes in its backward (torch.utils.checkpoint inside f), the products run in
    it, so the recomputation sees the parameters the graph was built with."""
    return lambda: _reparametrize_module(module, P)


class Linear:
    """f at one state: the vector-Jacobian products of its graph (kept for reuse).
    around: the context the products run in (`with_params`; none by default)."""

    def __init__(self, y, x, leaves, layout=lambda t: t, around=nullcontext):
        self.y, self.x, self.leaves, self.layout = y, x, leaves, layout
        self.around = around

    def _grad(self, inputs, lam):
        with self.around():
            return torch.autograd.grad(self.y, inputs, self.layout(lam), retain_graph=True,
                                       allow_unused=True)

    def vjp_state(self, lam: torch.Tensor) -> torch.Tensor:
        """(∂f/∂u)ᵀ λ (only the state's product: autograd skips the parameters')."""
        if not self.y.requires_grad:     # f does not depend on u
            return torch.zeros_like(lam)
        (g,) = self._grad(self.x, lam)
        return torch.zeros_like(lam) if g is None else g

    def vjp_params(self, lam: torch.Tensor) -> Params:
        """(∂f/∂θ)ᵀ λ by parameter name (zeros for parameters f does not use)."""
        names = list(self.leaves)
        if not names:                    # every parameter of f frozen
            return {}
        grads = self._grad([self.leaves[k] for k in names], lam)
        return self._by_name(names, grads)

    def vjp_both(self, lam: torch.Tensor) -> tuple[torch.Tensor, Params | None]:
        """`vjp_state(λ)` and `vjp_params(λ)` (the same values) from one backward pass
        through f's graph: the branch's input products are shared, not run twice.
        None for the parameters' where f has no graph (as `vjp_params` would raise)."""
        if not self.y.requires_grad:
            return self.vjp_state(lam), None
        names = list(self.leaves)
        g, *grads = self._grad([self.x, *(self.leaves[k] for k in names)], lam)
        return torch.zeros_like(lam) if g is None else g, self._by_name(names, grads)

    def _by_name(self, names, grads) -> Params:
        return {k: torch.zeros_like(self.leaves[k]) if g is None else g
                for k, g in zip(names, grads)}
