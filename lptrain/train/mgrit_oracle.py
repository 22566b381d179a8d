"""The data terms of the MGRIT modes: forward and adjoint MGRIT solves, warm-started; to
tolerance with oracles.py's `Converged` (mode=mgrit), inexact with oneshot.py's `Rungs`.

The oracle is a train/protocol.py DataTerms like oracles.py's SerialOracle, which it
uses for its exact validation sweeps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lptrain.parallel.layer_parallel import LayerParallel
from lptrain.train.control import Measured, gradient_error
from lptrain.train.oracles import Converged, ExactOracle, SerialOracle, SolveStats, measured
from lptrain.train.protocol import Batch, Evaluated, Point
from lptrain.train.warm import LatestWarm


@dataclass
class _MGRITTape:
    fwd: object               # the forward SolveResult
    classified: object        # LayerParallel.evaluate's loss, hits, λ_N, classifier grads
    adj: object = None        # the adjoint SolveResult, once the gradient is taken


def _finite(res) -> bool:
    """Whether a solve's last residual norm is finite (the solver stops at one that is
    not, its states those of the iterate before)."""
    return not res.history or math.isfinite(res.history[-1])


class MGRITOracle(ExactOracle):
    """Forward and adjoint MGRIT, warm-started; to tolerance with the default accuracy
    (`Converged`: exact gradients), inexact with oneshot.py's `Rungs`.

    Every evaluation warm-starts the next one, a rejected line-search trial's
    included (its states are the latest iterate of the solves).  Where warm starts
    are kept is the `warm` store's business (warm.py; the class's WARM reads its
    checkpoint state).
    """

    measures = True
    WARM = LatestWarm

    def __init__(self, net, exchange, mgrit_opts, accuracy=None, warm=None, observer=None):
        self.net, self.exchange, self.mgrit = net, exchange, mgrit_opts
        self.lp = LayerParallel(net, mgrit_opts, exchange, observer)
        # exact, data-sharded sweeps
        self.validator = SerialOracle(net, exchange, observer)
        self.accuracy = accuracy or Converged(mgrit_opts)
        self.warm = warm if warm is not None else LatestWarm(self.lp)
        self.stats = SolveStats()
        self._latest: Evaluated | None = None
        self._spent = [0, 0]
        self._refined = 0     # evaluations of this optimizer iteration repeated (refine)

    def begin(self, batch: Batch):
        self.batch = batch
        self.accuracy.begin(batch.key, self.warm.holds(batch.key))
        self._spent = [0, 0]          # MGRIT iterations of this optimizer iteration
        self._refined = 0

    def skip(self, key: int) -> None:
        self.accuracy.begin(key, self.warm.holds(key))   # as the groups with samples plan
        self.warm.store(key)
        self.stats, self._spent, self._refined = SolveStats(), [0, 0], 0

    def tighten(self) -> bool:
        return self.accuracy.tighten()

    def relax(self) -> None:
        self.accuracy.relax()

    def record(self) -> dict:
        self.stats.fwd_total, self.stats.adj_total = self._spent
        self.stats.refined = self._refined
        return self.stats.row()

    def _adaptive(self, solve, iters: int, tol: float, warm, norm):
        """solve(warm=, max_iter=, tol=) -> (output, SolveResult) at the budget, then one
        iteration more (resume=True) while the accuracy's guard asks with norm(output);
        the result's history and iterations cover every iteration, each residual once
        (a resumed solve opens with the one its predecessor closed with: counted twice,
        it read as an iteration of ratio 1, in the convergence factor and the count of
        iterations the controller compares its plan with)."""
        out, res = solve(warm=warm, max_iter=iters, tol=tol)
        history, total, extra = list(res.history), res.iterations, 0
        while self.accuracy.more(history, norm(out), extra):
            out, res = solve(max_iter=1, tol=0.0, resume=True)
            history += res.history[1:]      # its first: the residual measured last
            total += res.iterations
            extra += 1
        res.history, res.iterations = history, total
        return out, res, extra

    def value(self, theta) -> Evaluated:
        if self._latest is not None:      # the solvers reuse its buffers
            self._latest.tape = None
        b = self.batch
        iters, tol, *_ = self.accuracy.budget()
        _, res, extra = self._adaptive(lambda **kw: (None, self.lp.forward(theta, b.x, **kw)),
                                       iters, tol, self.warm.get(b.key)[0],
                                       lambda _: self.accuracy.last_gnorm)
        self._spent[0] += res.iterations
        finite = _finite(res)
        if finite:          # a solve that overflowed leaves no warm start to keep
            self.warm.store(b.key, fwd=res.states)
        cls = self.lp.evaluate(theta, res.states, b.y, b.x.shape[0], True)
        stats = SolveStats(fwd_iterations=res.iterations, fwd_history=list(res.history),
                           adaptive_extra=extra, rung=self.accuracy.rung,
                           unconverged=self._short(res, tol))
        # its states are the last finite iterate's, not θ's: the objective is not finite
        loss = cls.loss if finite else res.history[-1]
        point = Point(objective=loss, loss=loss, accuracy=cls.correct / b.x.shape[0])
        self._latest = Evaluated(point, theta, b, tape=_MGRITTape(res, cls), stats=stats)
        return self._latest

    def gradient(self, ev: Evaluated) -> torch.Tensor:
        tape, b = ev.held(), ev.batch
        *_, iters, tol = self.accuracy.budget()
        grad, res, extra = self._adaptive(
            lambda **kw: self.lp.backward(ev.theta, b.x, tape.fwd.states, tape.classified,
                                          **kw),
            iters, tol, self.warm.get(b.key)[1], lambda g: float(g.norm()))
        tape.adj = res
        self._spent[1] += res.iterations
        if _finite(res):
            self.warm.store(b.key, adj=res.states)
        else:   # a gradient of the iterate before is no gradient: NaN, which the data
            # groups' sum carries to every rank (one group raising here left the others
            # waiting in that sum) and the optimizer refuses (optimizers.finite_gradient)
            grad = torch.full_like(grad, math.nan)
        ev.stats.adj_iterations, ev.stats.adj_history = res.iterations, list(res.history)
        ev.stats.adaptive_extra += extra
        ev.stats.unconverged += self._short(res, tol)
        return grad

    def _short(self, res, tol: float) -> int:
        """1 where an exact policy's solve to a tolerance (`tol`, mgrit.rtol) stopped at
        its max_iter above it (tol = rtol = 0 asks for max_iter iterations: never)."""
        wanted = tol > 0 or self.mgrit.rtol > 0
        return int(self.accuracy.exact and wanted and not res.converged)

    def measure(self, ev: Evaluated, weight: float = 1.0) -> Measured:
        tape = ev.held()
        return measured(tape.fwd, tape.adj, weight)

    def observe(self, ev: Evaluated | None, m: Measured, grad_norm: float) -> None:
        """Estimate the gradient error of the evaluation just finished (train/control.py)
        and let the accuracy policy plan from it; m and grad_norm are over all ranks and
        data groups."""
        stats = ev.stats if ev is not None else SolveStats()
        stats.fwd_error, stats.adj_error = gradient_error(m, self.net.opts.T,
                                                          self.lp.n_c_points, grad_norm)
        self.accuracy.observe(stats, m, grad_norm)

    def refine(self) -> bool:
        """Whether the evaluation just observed is to be repeated at its θ with more
        iterations (the accuracy policy's call: oneshot.Rungs; never to tolerance)."""
        again = self.accuracy.refine()
        self._refined += again
        return again

    def accept(self, ev: Evaluated):
        self.stats = ev.stats

    # checkpoints: this rank's warm starts (its block of the layers) and controller state
    def state_dict(self) -> dict:
        return {**self.warm.state_dict(), **self.accuracy.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.warm.load_state_dict(state)
        self.accuracy.load_state_dict(state)

    @classmethod
    def warm_entries(cls, state: dict) -> list:
        return cls.WARM.warm_entries(state)

    @classmethod
    def with_warm_entries(cls, state: dict, entries: list) -> dict:
        return cls.WARM.with_warm_entries(state, entries)

    @classmethod
    def warm_rows(cls, state: dict) -> str:
        return cls.WARM.warm_rows(state)

    def validate(self, theta, x, y, chunk: int | None = None) -> tuple[float, float]:
        """Mean loss and accuracy on (x, y), exactly: every rank holds all of θ, so each
        sweeps all layers serially over its share of a chunk, which costs a P-th of one
        serial sweep where a converged MGRIT solve costs several."""
        return self.validator.validate(theta, x, y, chunk)
