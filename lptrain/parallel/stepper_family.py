"""A stepper's layers (model/steps.py, model/custom_steps.py) as a step family with its
own fast paths: stacked forward steps, the forward's saved activations reused by the
hand-written adjoint, and batched weight products.

This is the `mgrit.protocols.StepFamily` of the built-in dense and conv steps (and of the
CLI's `network=custom`, whose stepper takes autograd's products itself).  The CLI's
solver (layer_parallel.py) and `LayerParallel` of built-in steps (builtin_steps.py)
build their propagators through it.
"""
from __future__ import annotations

import torch

from lptrain.model.serial import weight_args
from lptrain.parallel.propagators import AdjointPropagator, ForwardPropagator, Linearisation


class StepperFamily:
    """The propagators of one stepper over a rank's points `span` = range(lo, hi).

    `keep` (forward) receives "saved": layer n's activation data at saved[n − first]
    (first = max(lo − 1, 0)), written by the level-0 steps of a sweep that may be the
    solve's last; the adjoint reads them back through a `Linearisation`.

    reuse: one saved buffer for every forward (the caller runs each adjoint before
    the next forward, as the CLI's solver does), else a new one per forward unless
    an adjoint has handed its buffer back (`param_grads`).
    sweep_products: fixed adjoint solves leave the weight products of the layers
    their last sweep steps through, on whichever rank steps them (the caller sums
    over ranks); else they are taken after the solve for the rank's own layers.
    """

    def __init__(self, stepper, reuse: bool = False, sweep_products: bool = False):
        self.stepper, self.reuse, self.sweep_products = stepper, reuse, sweep_products
        self._free: list[torch.Tensor] = []

    def bind(self, stepper) -> "StepperFamily":
        """This family with `stepper`'s weights (the CLI's solver: one per θ)."""
        self.stepper = stepper
        return self

    @property
    def n_layers(self) -> int:
        return self.stepper.n_layers

    def to_state(self, u: torch.Tensor) -> torch.Tensor:
        return self.stepper.to_state(u)

    def from_state(self, u: torch.Tensor) -> torch.Tensor:
        return self.stepper.from_state(u)

    # -- forward ---------------------------------------------------------------
    def forward_propagator(self, h: float, average: bool, span: range, template,
                           keep: dict | None, fixed: bool = False) -> ForwardPropagator:
        first = max(span.start - 1, 0)
        saved = None
        if keep is not None:
            n = min(span.stop - 1, self.n_layers) - first
            saved = keep["saved"] = self._buffer((n, *template.shape), template)
            keep["stepper"] = self.stepper
        return ForwardPropagator(self.stepper, h, "average" if average else "inject",
                                 saved, first)

    def _buffer(self, shape, template) -> torch.Tensor:
        while self._free:
            t = self._free.pop()
            if t.shape == shape and t.dtype == template.dtype and t.device == template.device:
                if self.reuse:
                    self._free.append(t)
                return t
        t = template.new_zeros(shape)
        if self.reuse:
            self._free.append(t)
        return t

    # -- adjoint ---------------------------------------------------------------
    def adjoint_propagator(self, h: float, average: bool, span: range, state,
                           kept: dict, fixed: bool = False) -> "StepperAdjoint":
        """Φᵀ about the forward that filled `kept`; state(n) = u_n for n in lo..hi
        (u_hi the next rank's first state; None on the last rank).  fixed: the solve
        has no tolerance, so its last sweep is known (see sweep_products)."""
        if kept is None:            # no forward's data (a second backward): recompute
            kept = {"stepper": self.stepper, "saved": None}
        stepper = kept["stepper"]
        lin = self._linearisation(stepper, span, kept["saved"], state)
        weights = None
        if fixed and self.sweep_products:
            weights = (torch.zeros_like(stepper.K), torch.zeros_like(stepper.b))
        return StepperAdjoint(stepper, h, self.n_layers, lin, state,
                              "average" if average else "inject", weights=weights,
                              span=span, saved=kept["saved"])

    def _linearisation(self, stepper, span, saved, state) -> Linearisation:
        """Activation data of layers lo..min(hi, N−1): the forward's saved activations
        where it evaluated those steps, recomputed for the last one or two layers."""
        lo, hi, N = span.start, span.stop, self.n_layers
        first = max(lo - 1, 0)
        top = min(hi, N - 1)                 # last layer needed
        have = min(hi - 2 if hi != N + 1 else N - 1, top)
        if saved is None:
            have, saved = lo - 1, state(lo).new_empty((0, *state(lo).shape))
        main = saved[lo - first:max(have, lo - 1) - first + 1]
        tail = {}
        for n in range(max(have + 1, lo), top + 1):
            K, b = stepper.weights(n)
            tail[n] = stepper.linearize(state(n), K, b)
        return Linearisation(main, lo, tail)

    def weight_products(self, adjoint: "StepperAdjoint", lam, gK, gb) -> None:
        """The unscaled weight products (g uᵀ, Σ g for g = f′ ⊙ λ_{n+1}) of the rank's
        layers lo..min(hi, N)−1 into rows of gK, gb (N, ...); lam(n) = λ_n.  After a
        fixed solve with sweep_products: those the last sweep left (other rows zero)."""
        if adjoint.weights is not None:
            gK.copy_(adjoint.weights[0])
            gb.copy_(adjoint.weights[1])
            return
        stepper, lin = adjoint.stepper, adjoint.lin
        g = None
        for n in range(adjoint.span.start, min(adjoint.span.stop, self.n_layers)):
            g = stepper.act.vjp(lin.one(n), lam(n + 1), out=g)
            gK[n], gb[n] = stepper.vjp_weights(adjoint.state(n), g, *weight_args(stepper, n))

    def param_grads(self, adjoint: "StepperAdjoint", layers, lam) -> dict:
        """{n: {"K": ∂loss/∂K_n, "b": ∂loss/∂b_n}} of `layers` (the rank's own) from
        λ_{n+1} = lam(n + 1), for the weights before the stepper's scale_in."""
        stepper = adjoint.stepper
        gK, gb = torch.zeros_like(stepper.K), torch.zeros_like(stepper.b)
        ns = list(layers)
        if adjoint.weights is None and len(ns) > 1 and \
                getattr(stepper, "WEIGHTS_AFTER_SWEEP", False):
            # one batched product for all layers (dense: one bmm), as the serial sweep
            g = stepper.act.vjp(adjoint.lin.many(ns), _rows(lam, [n + 1 for n in ns]))
            gK[ns[0]:ns[-1] + 1], gb[ns[0]:ns[-1] + 1] = stepper.vjp_weights(
                _rows(adjoint.state, ns), g)
        else:
            self.weight_products(adjoint, lam, gK, gb)
        scale = stepper.act.weight_factor(adjoint.h)
        gK.mul_(scale)
        gb.mul_(scale)
        if not self.reuse and adjoint.saved is not None \
                and all(t is not adjoint.saved for t in self._free):
            self._free.append(adjoint.saved)      # the adjoint is done with it
        Ks, bs = gK.unbind(0), gb.unbind(0)      # the rows as views, in one call
        return {n: {"K": Ks[n], "b": bs[n]} for n in ns}


def _rows(x, ns) -> torch.Tensor:
    """x(n) for consecutive ns on a new dim 0: x.many(ns) where x offers it (a view or
    one copy: module_solver.Rows), else stacked."""
    many = getattr(x, "many", None)
    return many(ns) if many is not None else torch.stack([x(n) for n in ns])


class StepperAdjoint(AdjointPropagator):
    """The adjoint propagator with the rank's points `span` and the forward's saved
    buffer it reads (handed back to the family when the gradients are taken)."""

    def __init__(self, *args, span: range, saved: torch.Tensor, **kwargs):
        super().__init__(*args, **kwargs)
        self.span, self.saved = span, saved
