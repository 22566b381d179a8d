"""Forward and adjoint MGRIT for one ResNet, and the gradient they give.

Every rank holds all weights θ (they are small); rank r owns the layers of
its level-0 range, the opening layer lives with layer 0 and the classifier
with layer N.  Gradients are assembled per rank and summed over ranks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lptrain.mgrit.options import MGRITOptions
from lptrain.mgrit.solver import MGRIT, SolveResult, fixed_solve
from lptrain.parallel.stepper_family import StepperFamily


@dataclass
class Evaluation:
    """Objective pieces after a forward solve (identical on every rank)."""

    loss: float
    correct: int
    lamN: torch.Tensor | None   # ∂loss/∂u_N, on the rank owning layer N
    grad_cls: tuple | None      # (gW, gmu) on that rank


class LayerParallel:
    """MGRIT solvers for the forward and the adjoint propagation of `net`."""

    def __init__(self, net, options: MGRITOptions, exchange, observer=None):
        """observer: an `mgrit.protocols.Observer` of both solvers and of the messages
        and sums made around them (None: none)."""
        self.net, self.options, self.exchange = net, options, exchange
        self.observer = observer
        N = net.opts.layers
        self.N = N
        self.hier = options.hierarchy(N, exchange.size)
        self.fwd = MGRIT(self.hier, exchange, options.cycle_options(), observer)
        self.rev = self.hier.reversed()
        self.adj = MGRIT(self.rev, exchange.reversed(), options.cycle_options(linear=True),
                         None if observer is None else Mirrored(observer, exchange.size))
        # the steps' propagators (one saved buffer reused; a fixed adjoint's last sweep
        # leaves the weight products of the layers it steps through)
        self.family = StepperFamily(None, reuse=True, sweep_products=True)
        self.average = options.coarse_weights == "average"
        self._kept = self._adjoint = None
        self.lo, self.hi = self.hier.ranges[0][exchange.rank]
        self.rev_lo = self.rev.ranges[0][exchange.size - 1 - exchange.rank][0]
        self.first, self.last = self.lo == 0, self.hi == N + 1

    @property
    def n_levels(self) -> int:
        return len(self.hier.levels)

    @property
    def n_c_points(self) -> int:
        """C-points of the finest level, where residuals are measured (0: one level)."""
        return len(self.hier.levels[0].cpoints)

    def template(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.new_state(x)

    # -- forward ---------------------------------------------------------------
    @property
    def span(self) -> range:
        """This rank's level-0 points lo..hi−1."""
        return range(self.lo, self.hi)

    def forward(self, theta, x, warm=None, max_iter=None, tol=None, save=True,
                resume=False) -> SolveResult:
        """Forward MGRIT: this rank's states u_lo..u_{hi−1}.

        With save, the finest-level activations stay for the next backward();
        resume continues the last solve (same θ and x) in place.
        """
        o = self.options
        if resume:
            return self.fwd.resume(max_iter, 0.0 if tol is None else tol, o.rtol)
        template = self.template(x)
        family = self.family.bind(self.net.stepper(theta))
        kept = {} if save else None
        prop = family.forward_propagator(self.net.h, self.average, self.span, template, kept)
        if save:
            self._kept = kept
        u0 = self.net.opening(theta, x) if self.first else None
        return self.fwd.solve(prop, template, u0, warm,
                              max_iter=o.max_iter if max_iter is None else max_iter,
                              tol=o.tol if tol is None else tol, rtol=o.rtol)

    def evaluate(self, theta, states, labels, n_total: int, want_grad: bool) -> Evaluation:
        """Loss and hits of u_N (computed on the last rank, shared with all)."""
        lamN = grads = None
        loss = correct = 0.0
        if self.last:
            loss, correct, lamN, gW, gmu = self.net.classify(theta, states[-1], labels,
                                                             n_total, want_grad)
            grads = (gW, gmu)
        loss = observed_sum(self.exchange, self.observer, float(loss))
        correct = int(round(observed_sum(self.exchange, self.observer, float(correct))))
        return Evaluation(loss, correct, lamN, grads)

    # -- adjoint ---------------------------------------------------------------
    def backward(self, theta, x, states, ev: Evaluation, warm=None, max_iter=None,
                 tol=None, resume=False) -> tuple[torch.Tensor, SolveResult]:
        """Adjoint MGRIT and the loss gradient ∂loss/∂θ (summed over ranks).

        `states` must come from the last forward() with save=True; resume
        continues the last adjoint solve in place.
        """
        o, net = self.options, self.net
        max_iter = o.adjoint_max_iter if max_iter is None else max_iter
        tol = o.adjoint_tol if tol is None else tol
        if resume:
            prop = self._adjoint
            res = self.adj.resume(max_iter, tol, o.rtol)
        else:
            extra = self._next_first_state(states)
            state = (lambda n: states[n - self.lo] if n < self.hi else extra)
            # without a tolerance the last sweep is known: its steps leave the weight
            # products of their layers (each layer once over all ranks) while σ′ ⊙ λ is hot
            prop = self._adjoint = self.family.adjoint_propagator(
                net.h, self.average, self.span, state, self._kept,
                fixed=fixed_solve(tol, o.rtol))
            res = self.adj.solve(prop, self.template(x), ev.lamN, warm, max_iter=max_iter,
                                 tol=tol, rtol=o.rtol)
        grad = torch.zeros_like(theta)
        gK, gb = net.hidden_views(grad)
        self.family.weight_products(prop, lambda n: res.states[self.N - n - self.rev_lo],
                                    gK, gb)
        scale = prop.stepper.act.weight_factor(net.h)
        gK.mul_(scale)
        gb.mul_(scale)
        if self.last:
            net.assemble(grad, classifier=ev.grad_cls)
        if self.first:
            net.opening_vjp(theta, x, res.states[-1], grad)
        return observed_sum_tensor(self.exchange, self.observer, grad), res

    def _next_first_state(self, states):
        return next_first_state(self.exchange, self.hier, self.last, states, self.observer)


def next_first_state(exchange, hier, last: bool, states, observer=None):
    """u_hi from the next rank (None on the last rank): each rank sends its first
    fine state to the rank before it (both messages told to `observer`, if any)."""
    left = hier.left(0, exchange.rank)
    if left is not None:
        exchange.send(states[0], left)
        if observer is not None:
            observer.message(0, left, True)
    extra = None
    if not last:
        right = hier.right(0, exchange.rank)
        extra = exchange.recv(states[0], right)
        if observer is not None:
            observer.message(0, right, False)
    exchange.wait()
    return extra


def observed_sum(exchange, observer, value: float) -> float:
    """`value` summed over `exchange`'s ranks, the sum told to `observer` (if any)."""
    total = exchange.allreduce_sum(value)
    if observer is not None:
        observer.sum(0, 1)
    return total


def observed_sum_tensor(exchange, observer, t):
    """Tensor `t` summed over `exchange`'s ranks, the sum told to `observer` (if any)."""
    total = exchange.allreduce_tensor(t)
    if observer is not None:
        observer.sum(0, t.numel(), t.element_size())
    return total


class Mirrored:
    """The observer of the adjoint solver, whose exchange numbers rank r as size−1−r:
    `observer` sees the layer group's own numbering."""

    def __init__(self, observer, size: int):
        self.observer, self.size = observer, size

    def step(self, level: int, states: int, last: bool) -> None:
        self.observer.step(level, states, last)

    def message(self, level: int, peer: int, sent: bool) -> None:
        self.observer.message(level, self.size - 1 - peer, sent)

    def sum(self, level: int, values: int, itemsize: int = 8) -> None:
        self.observer.sum(level, values, itemsize)

    def kernel(self, name: str, states: int, seconds: float) -> None:
        self.observer.kernel(name, states, seconds)
