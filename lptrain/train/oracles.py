"""How each mode obtains the data terms and their gradient: serial here, with what the
MGRIT oracles share (SolveStats, measured, ExactOracle, the accuracy `Converged`);
mgrit_oracle.py: MGRIT, oneshot.py: one-shot.

Each oracle is a train/protocol.py DataTerms: the batch's mean loss and its
gradient, summed over the ranks; train/objective.py adds the regulariser and
train/data_parallel.py sums over data groups.  The optimizers and the loop see
the same protocol in every mode.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from lptrain.data.base import chunks
from lptrain.model.serial import Buffers, adjoint, propagate
from lptrain.parallel.blocks import ALL_ROWS
from lptrain.parallel.grid import shard
from lptrain.parallel.layer_parallel import observed_sum, observed_sum_tensor
from lptrain.train.control import Measured, convergence_factor
from lptrain.train.protocol import Batch, Evaluated, Point, StaleEvaluation

__all__ = ["Batch", "Evaluated", "ExactOracle", "Point", "SerialOracle",
           "SolveStats", "measured"]


@dataclass
class SolveStats:
    """MGRIT record of the accepted point of one optimizer iteration."""

    fwd_iterations: int = 0
    fwd_history: list = field(default_factory=list)
    adj_iterations: int = 0
    adj_history: list = field(default_factory=list)
    adaptive_extra: int = 0
    rung: int = 0           # solve accuracy the point was evaluated at (SimultaneousOracle)
    fwd_total: int = 0      # MGRIT iterations of every solve of the optimizer iteration,
    adj_total: int = 0      # line-search trials and re-evaluations included
    fwd_error: float = math.nan   # estimated gradient error from the forward solve,
    adj_error: float = math.nan   # ... and from the adjoint (train/control.py)
    fwd_plan: int = -1      # simultaneous: iterations the controller plans for the next
    adj_plan: int = -1      # evaluation of this batch
    error_scale: float = 1.0      # calibration factor in the estimates (train/control.py)
    true_error: float = math.nan  # the exact relative gradient error, where calibrated
    unconverged: int = 0    # mode=mgrit: solves that stopped at max_iter above tolerance
    refined: int = 0        # simultaneous: evaluations repeated at their θ with more
    #                         iterations, the estimate far above grad_tol (oneshot.Rungs)

    def row(self) -> dict:
        return dict(fwd_iterations=self.fwd_iterations,
                    fwd_residual=_last(self.fwd_history),
                    adj_iterations=self.adj_iterations,
                    adj_residual=_last(self.adj_history),
                    fwd_factor=convergence_factor(self.fwd_history),
                    adj_factor=convergence_factor(self.adj_history),
                    adaptive_extra=self.adaptive_extra, rung=self.rung,
                    fwd_total=self.fwd_total, adj_total=self.adj_total,
                    grad_error=self.fwd_error + self.adj_error,
                    fwd_error=self.fwd_error, adj_error=self.adj_error,
                    fwd_plan=self.fwd_plan, adj_plan=self.adj_plan,
                    error_scale=self.error_scale, true_error=self.true_error,
                    unconverged=self.unconverged, refined=self.refined,
                    fwd_history=list(self.fwd_history), adj_history=list(self.adj_history))


def measured(fwd, adj, weight: float = 1.0) -> Measured:
    """The controller's record of a forward and an adjoint SolveResult."""
    def parts(res, w, kind):
        h = res.history
        return {f"{kind}_first_sq": (w * h[0]) ** 2, f"{kind}_last_sq": (w * h[-1]) ** 2,
                f"{kind}_state_sq": (w * res.state_norm) ** 2, f"{kind}_ratios": len(h) - 1,
                f"{kind}_prev_sq": (w * h[-2]) ** 2 if len(h) >= 2 else 0.0}
    return Measured(**parts(fwd, 1.0, "fwd"), **parts(adj, weight, "adj"))


def _last(history) -> float:
    return history[-1] if history else float("nan")


class ExactOracle:
    """What the DataTerms protocol asks besides the evaluations, for an oracle whose
    gradients are exact and that keeps no warm starts."""

    measures = False

    def tighten(self) -> bool:
        return False

    def relax(self) -> None:
        pass

    def record(self) -> dict | None:
        return None

    def skip(self, key: int) -> None:
        pass

    def measure(self, ev: Evaluated, weight: float = 1.0) -> Measured | None:
        return None

    def observe(self, ev: Evaluated | None, measured, grad_norm: float) -> None:
        pass

    def refine(self) -> bool:
        return False

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    @staticmethod
    def warm_entries(state: dict) -> list:
        return []

    @staticmethod
    def with_warm_entries(state: dict, entries: list) -> dict:
        return state

    @staticmethod
    def warm_rows(state: dict) -> str:
        return ALL_ROWS


@dataclass
class _SerialTape:
    stepper: object
    states: object
    saved: object
    classified: tuple     # (λ_N, ∂loss/∂W, ∂loss/∂μ)
    x: torch.Tensor       # this rank's samples


class SerialOracle(ExactOracle):
    """Exact layer-serial propagation; the batch is split over ranks (data parallel).

    observer: an `mgrit.protocols.Observer` told of each sum (None: none)."""

    def __init__(self, net, exchange, observer=None):
        self.net, self.exchange, self.observer = net, exchange, observer
        self._buffers = Buffers()     # the training sweep's states, reused by the next one
        self._latest: Evaluated | None = None

    def _shard(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's part of a batch: the rule of the data groups (parallel.grid.shard)."""
        lo, hi = shard(t.shape[0], self.exchange.size, self.exchange.rank)
        return t[lo:hi]

    def begin(self, batch: Batch):
        self.batch = batch
        self.n_total = batch.x.shape[0]
        self.x, self.y = self._shard(batch.x), self._shard(batch.y)

    def _forward(self, theta, x, y, n_total, want_grad):
        stepper = self.net.stepper(theta)
        states, saved = propagate(stepper, self.net.opening(theta, x), self.net.h, want_grad,
                                  self._buffers if want_grad else None)
        loss, correct, lamN, gW, gmu = self.net.classify(theta, states[-1], y, n_total,
                                                         want_grad)
        return stepper, states, saved, float(loss), correct, (lamN, gW, gmu)

    def value(self, theta) -> Evaluated:
        if self._latest is not None:      # its states are overwritten: free them first
            self._latest.tape = None
        st, states, saved, loss, correct, cls = self._forward(theta, self.x, self.y,
                                                              self.n_total, True)
        loss = self._sum(loss)
        acc = self._sum(correct) / self.n_total
        self._latest = Evaluated(Point(objective=loss, loss=loss, accuracy=acc), theta,
                                 self.batch, tape=_SerialTape(st, states, saved, cls, self.x))
        return self._latest

    def gradient(self, ev: Evaluated) -> torch.Tensor:
        tape = ev.held()
        if tape.saved is None:
            raise StaleEvaluation("gradient of a serial evaluation taken twice: the first "
                                  "consumed its saved activations; evaluate again")
        saved, tape.saved = tape.saved, None    # the adjoint sweep may write over it
        lamN, gW, gmu = tape.classified
        lam0, gK, gb = adjoint(tape.stepper, tape.states, saved, lamN, self.net.h)
        grad = self.net.assemble(torch.zeros_like(ev.theta), (gK, gb), (gW, gmu))
        self.net.opening_vjp(ev.theta, tape.x, lam0, grad)
        return observed_sum_tensor(self.exchange, self.observer, grad)

    def _sum(self, value: float) -> float:
        return observed_sum(self.exchange, self.observer, value)

    def accept(self, ev: Evaluated):
        ev.tape = None

    def validate(self, theta, x, y, chunk: int | None = None) -> tuple[float, float]:
        """Mean loss and accuracy on (x, y), propagated `chunk` samples at a time."""
        n, loss, correct = x.shape[0], 0.0, 0.0
        for part in chunks(n, chunk):     # each chunk split over the ranks like a batch
            *_, l, c, _ = self._forward(theta, self._shard(x[part]), self._shard(y[part]), n,
                                        False)
            loss, correct = loss + l, correct + c
        return self._sum(loss), self._sum(correct) / n


class Converged:
    """The accuracy of mode=mgrit: every solve to mgrit.tol / adjoint_tol, no rungs.

    An MGRITOracle asks its accuracy policy how many iterations a solve gets
    (`budget`), whether to add one more (`more`, the adaptive guard), and tells it
    each gradient's error estimate (`observe`); oneshot.py's Rungs is the other one.
    """

    rung = 0
    last_gnorm = math.inf     # the adaptive guard's reference (Rungs keeps the last one)
    exact = True              # a solve that ends above its tolerance is a shortfall

    def __init__(self, mgrit_opts):
        self.mgrit = mgrit_opts

    def begin(self, key: int, warm: bool) -> None:
        pass

    def budget(self) -> tuple[int, float, int, float]:
        m = self.mgrit
        return m.max_iter, m.tol, m.adjoint_max_iter, m.adjoint_tol

    def more(self, history: list, grad_norm: float, extra: int) -> bool:
        return False

    def tighten(self) -> bool:
        return False

    def relax(self) -> None:
        pass

    def observe(self, stats: SolveStats, m: Measured, grad_norm: float) -> None:
        pass

    def refine(self) -> bool:
        return False

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
