"""Forward and adjoint MGRIT over a ModuleSteps network, and its parameter gradients.

Rank r holds the layers of its level-0 points [lo, hi) (their parameters and
gradients live only there) plus copies of the few other layers its steps use,
refreshed from their owners before each forward solve (parallel/halo.py).
States have any shape; the solver's buffers stack them on a leading dimension.
"""
from __future__ import annotations

import torch

from lptrain.mgrit.options import MGRITOptions
from lptrain.mgrit.protocols import StepFamily
from lptrain.mgrit.solver import MGRIT, SolveResult, fixed_solve
from lptrain.parallel.coarse import UserCoarse
from lptrain.parallel.halo import owned_layers, share_params, transfers
from lptrain.parallel.layer_parallel import next_first_state
from lptrain.parallel.module_propagators import AutogradFamily


class ModuleSolver:
    """MGRIT solvers for the forward and adjoint propagation of `steps` on one rank.

    The propagators come from the steps' family (`mgrit.protocols.StepFamily`): their
    own where `steps` is one (built-in steps: parallel/builtin_steps.py), else
    autograd's through the modules (`AutogradFamily`).
    """

    def __init__(self, steps, h: float, options: MGRITOptions, exchange, coarse=None):
        """coarse: a CoarseSteps of the user's coarse modules (None: fine f, coarse H)."""
        self.steps, self.h, self.options, self.exchange = steps, h, options, exchange
        self.N = N = steps.n_layers
        self.average = options.coarse_weights == "average"
        self.hier = options.hierarchy(N, exchange.size)
        self.fwd = MGRIT(self.hier, exchange, options.cycle_options())
        self.rev = self.hier.reversed()
        self.adj = MGRIT(self.rev, exchange.reversed(), options.cycle_options(linear=True))
        rank = exchange.rank
        self.lo, self.hi = self.hier.ranges[0][rank]
        self.rev_lo = self.rev.ranges[0][exchange.size - 1 - rank][0]
        self.first, self.last = self.lo == 0, self.hi == N + 1
        self.owned = owned_layers(self.hier, rank)
        self.plan = transfers(self.hier, self.average)
        self.coarse = None if coarse is None else UserCoarse(coarse, self.hier, h)
        self.family = steps if isinstance(steps, StepFamily) else \
            AutogradFamily(steps, self.owned, self.coarse)
        self.span = range(self.lo, self.hi)

    def share(self) -> None:
        """Copies of the other ranks' layers this rank steps with, from their owners."""
        if self.plan:
            share_params(self.steps, self.plan, self.exchange)

    # -- forward ---------------------------------------------------------------------
    def forward(self, u0, template, warm=None, max_iter=None, tol=None,
                keep: dict | None = None, reuse_warm: bool = False) -> SolveResult:
        """Forward MGRIT: this rank's states u_lo..u_{hi−1} (u0 read on the first rank).

        keep: a dict that receives what the adjoint about the returned states needs
        (the family's: f's linearisations where a fixed solve's last sweep evaluates
        f there, or saved activations), for `backward`'s `kept`.  reuse_warm: the
        caller replaces `warm` after this solve (`MGRIT.solve`).
        """
        o = self.options
        tol = o.tol if tol is None else tol
        fixed = fixed_solve(tol, o.rtol)
        prop = self.family.forward_propagator(self.h, self.average, self.span, template,
                                              keep, fixed)
        return self.fwd.solve(prop, template, u0 if self.first else None, warm,
                              max_iter=o.max_iter if max_iter is None else max_iter,
                              tol=tol, rtol=o.rtol, reuse_warm=reuse_warm)

    # -- adjoint ---------------------------------------------------------------------
    def backward(self, states, lamN, template, warm=None, max_iter=None, tol=None,
                 kept: dict | None = None, reuse_warm: bool = False):
        """Adjoint MGRIT from λ_N (read on the last rank) about the forward `states`.

        Returns the solve (this rank's λ_{lo+1}..λ_hi; λ_0 last on the first rank)
        and {layer: {parameter name: gradient}} for this rank's layers.
        """
        o = self.options
        state = Rows(states, -self.lo, 1, self.hi, self._next_first_state(states))
        tol = o.adjoint_tol if tol is None else tol
        prop = self.family.adjoint_propagator(self.h, self.average, self.span, state, kept,
                                              fixed_solve(tol, o.rtol))
        res = self.adj.solve(prop, template, lamN if self.last else None, warm,
                             max_iter=o.adjoint_max_iter if max_iter is None else max_iter,
                             tol=tol, rtol=o.rtol, reuse_warm=reuse_warm)
        lam = Rows(res.states, self.N - self.rev_lo, -1)       # λ_n, as `lam` below
        return res, self.family.param_grads(prop, self.owned, lam)

    def adjoint_state(self, grad_uN: torch.Tensor) -> torch.Tensor:
        """λ_N from the caller's gradient of u_N: the family's state, contiguous, or in the
        memory format its adjoint keeps λ in where it has one (`adjoint_layout`:
        autograd's, whose linearisations see channels_last); the adjoint solve's rows
        take the layout of this template."""
        lam = self.family.to_state(grad_uN.detach()).contiguous()
        layout = getattr(self.family, "adjoint_layout", None)
        return lam if layout is None else layout(lam)

    def input_gradient(self, lam0: torch.Tensor) -> torch.Tensor:
        """λ_0 for the caller: a new tensor, contiguous where the adjoint kept λ in a
        layout of its own (as it was before: the caller's backward then runs as on
        contiguous gradients)."""
        lam = self.family.from_state(lam0)
        if hasattr(self.family, "adjoint_layout"):
            return lam.clone(memory_format=torch.contiguous_format)
        return lam.clone()

    def lam(self, adjoint_states, n: int) -> torch.Tensor:
        """λ_n from this rank's adjoint states (n in lo+1..hi, or 0 on the first rank)."""
        return adjoint_states[self.N - n - self.rev_lo]

    def _next_first_state(self, states):
        return next_first_state(self.exchange, self.hier, self.last, states)


class Rows:
    """x(n) = buf[offset + sign·n] for n < limit (else `beyond`: u_hi from the next
    rank), and `x.many(ns)` for consecutive ns: those rows on a new dim 0, a view of
    buf for sign +1 and a flipped copy for −1 — the values and layout of
    torch.stack([x(n) for n in ns]) without a Python call per row."""

    def __init__(self, buf: torch.Tensor, offset: int, sign: int, limit: int | None = None,
                 beyond: torch.Tensor | None = None):
        self.buf, self.offset, self.sign, self.beyond = buf, offset, sign, beyond
        self.limit = limit

    def __call__(self, n: int):
        if self.limit is not None and n >= self.limit:
            return self.beyond
        return self.buf[self.offset + self.sign * n]

    def many(self, ns) -> torch.Tensor:
        lo, hi = ns[0], ns[-1]
        if hi - lo != len(ns) - 1 or (self.limit is not None and hi >= self.limit):
            return torch.stack([self(n) for n in ns])
        if self.sign > 0:
            return self.buf[self.offset + lo:self.offset + hi + 1]
        return self.buf[self.offset - hi:self.offset - lo + 1].flip(0)
