"""Forward and adjoint MGRIT for one ResNet, and the gradient they give.

Every rank holds all weights θ (they are small); rank r owns the layers of
its level-0 range, the opening layer lives with layer 0 and the classifier
with layer N.  Gradients are assembled per rank and summed over ranks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lptrain.mgrit.exchange import allreduce_tensor
from lptrain.mgrit.hierarchy import build_hierarchy
from lptrain.mgrit.options import MGRITOptions
from lptrain.mgrit.solver import MGRIT, CycleOptions, SolveResult
from lptrain.parallel.propagators import AdjointPropagator, ForwardPropagator


@dataclass
class Evaluation:
    """Objective pieces after a forward solve (identical on every rank)."""

    loss: float
    correct: int
    lamN: torch.Tensor | None   # ∂loss/∂u_N, on the rank owning layer N
    grad_cls: tuple | None      # (gW, gmu) on that rank


class LayerParallel:
    """MGRIT solvers for the forward and the adjoint propagation of `net`."""

    def __init__(self, net, options: MGRITOptions, exchange):
        self.net, self.opt, self.ex = net, options, exchange
        N = net.opts.layers
        self.N = N
        self.hier = build_hierarchy(N, options.cfactor0, options.cfactor, options.levels,
                                    options.min_coarse, exchange.size)
        cyc = CycleOptions(options.nrelax0, options.nrelax, options.cycle,
                           options.skip_first_down)
        self.fwd = MGRIT(self.hier, exchange, cyc)
        self.rev = self.hier.reversed()
        self.adj = MGRIT(self.rev, exchange.reversed(), cyc)
        self.lo, self.hi = self.hier.ranges[0][exchange.rank]
        self.rev_lo = self.rev.ranges[0][exchange.size - 1 - exchange.rank][0]
        self.first, self.last = self.lo == 0, self.hi == N + 1

    @property
    def n_levels(self) -> int:
        return len(self.hier.levels)

    def template(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_empty((x.shape[0], *self.net.state_shape))

    # -- forward ---------------------------------------------------------------
    def forward(self, theta, x, warm=None, max_iter=None, tol=None) -> SolveResult:
        """Forward MGRIT: this rank's states u_lo..u_{hi−1}."""
        o = self.opt
        prop = ForwardPropagator(self.net.stepper(theta), self.net.h, o.coarse_weights)
        u0 = self.net.opening(theta, x) if self.first else None
        return self.fwd.solve(prop, self.template(x), u0, warm,
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
        loss = self.ex.allreduce_sum(float(loss))
        correct = int(round(self.ex.allreduce_sum(float(correct))))
        return Evaluation(loss, correct, lamN, grads)

    # -- adjoint ---------------------------------------------------------------
    def backward(self, theta, x, states, ev: Evaluation, warm=None, max_iter=None,
                 tol=None) -> tuple[torch.Tensor, SolveResult]:
        """Adjoint MGRIT and the loss gradient ∂loss/∂θ (summed over ranks)."""
        o, net = self.opt, self.net
        stepper = net.stepper(theta)
        lin = self._linearisation_states(states)
        prop = AdjointPropagator(stepper, net.h, self.N, lin, self.lo, o.coarse_weights)
        res = self.adj.solve(prop, self.template(x), ev.lamN, warm,
                             max_iter=o.adjoint_max_iter if max_iter is None else max_iter,
                             tol=o.adjoint_tol if tol is None else tol, rtol=o.rtol)
        grad = torch.zeros_like(theta)
        gv = net.layout.views(grad)
        own = min(self.hi, self.N) - self.lo            # layers lo..lo+own−1
        q = [self.N - n - 1 - self.rev_lo for n in range(self.lo, self.lo + own)]
        lam_next = res.states[torch.tensor(q)]           # λ_{n+1} of each own layer
        g = prop.dsig[:own].mul(lam_next).mul_(net.h)
        gK, gb = stepper.vjp_weights(states[:own], g)
        gv["K"][self.lo:self.lo + own] = gK
        gv["b"][self.lo:self.lo + own] = gb
        if self.last:
            gv["W"].copy_(ev.grad_cls[0])
            gv["mu"].copy_(ev.grad_cls[1])
        if self.first:
            net.opening_vjp(theta, x, res.states[-1], grad)
        return allreduce_tensor(self.ex, grad), res

    def _linearisation_states(self, states):
        """u_n for this rank's layers plus the next rank's first layer."""
        left = self.hier.left(0, self.ex.rank)
        if left is not None:
            self.ex.send(states[0], left)
        if self.last:
            self.ex.wait()
            return states[:self.N - self.lo]
        extra = self.ex.recv(states[0], self.hier.right(0, self.ex.rank))
        self.ex.wait()
        return torch.cat([states, extra.unsqueeze(0)])
