"""How each mode obtains the objective and its gradient: serial, mgrit, simultaneous.

The optimizers see only `begin(batch)`, `value(θ)`, `gradient()`, `accept()`,
and the inexactness controls `tighten()` / `relax()`; the three modes differ in
nothing else.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from lptrain.data.base import chunks
from lptrain.mgrit.exchange import allreduce_tensor
from lptrain.model.serial import Buffers, adjoint, propagate
from lptrain.parallel.blocks import ALL_ROWS
from lptrain.parallel.grid import shard
from lptrain.parallel.layer_parallel import LayerParallel
from lptrain.train.control import Measured, convergence_factor, gradient_error


@dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    key: int = 0      # which mini-batch (for per-batch warm starts)
    n: int | None = None  # samples of the whole batch over all data groups (None: x's)


@dataclass
class Point:
    objective: float
    loss: float
    accuracy: float


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
                    fwd_history=list(self.fwd_history), adj_history=list(self.adj_history))


def measured(fwd, adj, weight: float = 1.0) -> Measured:
    """The controller's record of a forward and an adjoint SolveResult."""
    def parts(res, w):
        h = res.history
        return (w * h[0]) ** 2, (w * h[-1]) ** 2, (w * res.state_norm) ** 2, len(h) - 1
    return Measured(*parts(fwd, 1.0), *parts(adj, weight))


def _last(history) -> float:
    return history[-1] if history else float("nan")


class ExactOracle:
    """Inexactness controls of an oracle whose gradients are exact already."""

    def tighten(self) -> bool:
        """Make the next evaluations more accurate; False when they cannot be."""
        return False

    def relax(self) -> None:
        """Back to the configured accuracy (after a successful optimizer iteration)."""

    def record(self) -> dict | None:
        """The MGRIT record of the optimizer iteration (None: no MGRIT solves)."""
        return None

    def skip(self, key: int) -> None:
        """This rank holds no samples of batch `key` (a data group without any): keep
        the warm-start bookkeeping as the ranks that have samples do."""

    @staticmethod
    def warm_entries(state: dict) -> list:
        """[key, forward states, adjoint states] of every batch a state_dict keeps warm
        starts of (this rank's blocks: parallel/blocks.py), least recently used first."""
        return []

    @staticmethod
    def with_warm_entries(state: dict, entries: list) -> dict:
        """`state` with its warm starts replaced by `entries` (as warm_entries gives)."""
        return state

    @staticmethod
    def warm_rows(state: dict) -> str:
        """Which rows the warm-start blocks of a state_dict hold: all rows of the
        rank's range (ALL_ROWS) or only its C-points (C_POINTS; parallel/blocks.py)."""
        return ALL_ROWS


class SerialOracle(ExactOracle):
    """Exact layer-serial propagation; the batch is split over ranks (data parallel)."""

    def __init__(self, net, exchange):
        self.net, self.exchange = net, exchange
        self._buffers = Buffers()     # the training sweep's states, reused by the next one

    def _shard(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's part of a batch: the rule of the data groups (parallel.grid.shard)."""
        lo, hi = shard(t.shape[0], self.exchange.size, self.exchange.rank)
        return t[lo:hi]

    def begin(self, batch: Batch):
        self.n_total = batch.x.shape[0]
        self.x, self.y = self._shard(batch.x), self._shard(batch.y)

    def _forward(self, theta, x, y, n_total, want_grad):
        stepper = self.net.stepper(theta)
        states, saved = propagate(stepper, self.net.opening(theta, x), self.net.h, want_grad,
                                  self._buffers if want_grad else None)
        loss, correct, lamN, gW, gmu = self.net.classify(theta, states[-1], y, n_total,
                                                         want_grad)
        return stepper, states, saved, float(loss), correct, (lamN, gW, gmu)

    def value(self, theta) -> Point:
        self.theta = theta
        self._tape = None       # a rejected line-search trial's states: free them first
        st, states, saved, loss, correct, cls = self._forward(theta, self.x, self.y,
                                                              self.n_total, True)
        self._tape = (st, states, saved, cls)
        loss = self.exchange.allreduce_sum(loss)
        acc = self.exchange.allreduce_sum(correct) / self.n_total
        return Point(loss + self.net.regulariser(theta), loss, acc)

    def gradient(self) -> torch.Tensor:
        st, states, saved, (lamN, gW, gmu) = self._tape
        lam0, gK, gb = adjoint(st, states, saved, lamN, self.net.h)
        grad = self.net.assemble(torch.zeros_like(self.theta), (gK, gb), (gW, gmu))
        self.net.opening_vjp(self.theta, self.x, lam0, grad)
        grad = allreduce_tensor(self.exchange, grad)
        self.net.regulariser(self.theta, grad)
        return grad

    def accept(self):
        self._tape = None

    def state_dict(self) -> dict:
        """What a checkpoint keeps of this rank's oracle (serial: nothing)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def validate(self, theta, x, y, chunk: int | None = None) -> tuple[float, float]:
        """Mean loss and accuracy on (x, y), propagated `chunk` samples at a time."""
        n, loss, correct = x.shape[0], 0.0, 0.0
        for part in chunks(n, chunk):     # each chunk split over the ranks like a batch
            *_, l, c, _ = self._forward(theta, self._shard(x[part]), self._shard(y[part]), n,
                                        False)
            loss, correct = loss + l, correct + c
        return self.exchange.allreduce_sum(loss), self.exchange.allreduce_sum(correct) / n


class MGRITOracle(ExactOracle):
    """Forward and adjoint MGRIT to tolerance (exact gradients), warm-started.

    Every evaluation warm-starts the next one, a rejected line-search trial's
    included (its states are the latest iterate of the solves).
    """

    def __init__(self, net, exchange, mgrit_opts):
        self.net, self.exchange, self.mgrit = net, exchange, mgrit_opts
        self.lp = LayerParallel(net, mgrit_opts, exchange)
        self.validator = SerialOracle(net, exchange)   # exact, data-sharded sweeps
        self.warm_fwd = self.warm_adj = None
        self.warm_key = None
        self.stats = self._trial = SolveStats()
        self.external_control = False   # True: a DataParallelOracle calls control()

    def begin(self, batch: Batch):
        self.batch = batch
        self._spent = [0, 0]          # MGRIT iterations of this optimizer iteration

    def record(self) -> dict:
        self.stats.fwd_total, self.stats.adj_total = self._spent
        return self.stats.row()

    def _solve_forward(self, theta, warm):
        return self.lp.forward(theta, self.batch.x, warm=warm)

    def value(self, theta) -> Point:
        b = self.batch
        self.theta = theta
        res = self._solve_forward(theta, self._warm_fwd())
        self.fwd = res
        self._spent[0] += res.iterations
        self._store(self.batch.key, fwd=res.states)
        self.ev = self.lp.evaluate(theta, res.states, b.y, b.x.shape[0], True)
        self._trial = SolveStats(res.iterations, list(res.history))
        return Point(self.ev.loss + self.net.regulariser(theta), self.ev.loss,
                     self.ev.correct / b.x.shape[0])

    def _solve_adjoint(self, warm):
        return self.lp.backward(self.theta, self.batch.x, self.fwd.states, self.ev, warm=warm)

    def gradient(self) -> torch.Tensor:
        grad, res = self._solve_adjoint(self._warm_adj())
        self.adj = res
        self._spent[1] += res.iterations
        self._store(self.batch.key, adj=res.states)
        self._trial.adj_iterations, self._trial.adj_history = res.iterations, list(res.history)
        self.net.regulariser(self.theta, grad)
        if not self.external_control:
            self.control(measured(self.fwd, self.adj), float(grad.norm()), self.batch.key)
        return grad

    def control(self, m: Measured, grad_norm: float, key: int) -> None:
        """Estimate the gradient error of the evaluation just finished (train/control.py);
        m and grad_norm are over all ranks and data groups."""
        fwd, adj = gradient_error(m, self.net.opts.T, self.lp.n_c_points, grad_norm)
        self._trial.fwd_error, self._trial.adj_error = fwd, adj

    def accept(self):
        self.stats = self._trial

    # checkpoints: this rank's warm starts (its block of the layers) and controller state
    STATE = ("warm_fwd", "warm_adj", "warm_key")

    def state_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.STATE}

    def load_state_dict(self, state: dict) -> None:
        for name in self.STATE:
            setattr(self, name, state[name])

    @staticmethod
    def warm_entries(state: dict) -> list:
        key = state["warm_key"]
        return [] if key is None else [[key, state["warm_fwd"], state["warm_adj"]]]

    @staticmethod
    def with_warm_entries(state: dict, entries: list) -> dict:
        key, fwd, adj = entries[-1] if entries else (None, None, None)
        return {**state, "warm_key": key, "warm_fwd": fwd, "warm_adj": adj}

    def skip(self, key: int) -> None:
        self._store(key)

    # Warm starts.  The solvers alternate between two buffers and never write
    # into the warm start they are given, so the latest states are kept by
    # reference; only states of other mini-batches need copies.
    def _warm_fwd(self):
        return self.warm_fwd if self.warm_key == self.batch.key else None

    def _warm_adj(self):
        return self.warm_adj if self.warm_key == self.batch.key else None

    def _store(self, key, fwd=None, adj=None):
        if self.warm_key != key:
            self.warm_fwd = self.warm_adj = None
            self.warm_key = key
        if fwd is not None:
            self.warm_fwd = fwd
        if adj is not None:
            self.warm_adj = adj

    def validate(self, theta, x, y, chunk: int | None = None) -> tuple[float, float]:
        """Mean loss and accuracy on (x, y), exactly: every rank holds all of θ, so each
        sweeps all layers serially over its share of a chunk, which costs a P-th of one
        serial sweep where a converged MGRIT solve costs several."""
        return self.validator.validate(theta, x, y, chunk)


def make_oracle(mode, net, exchange, mgrit_opts, mini_batches: bool = False):
    """The oracle of `mode` (a ModeOptions)."""
    if mode.name == "serial":
        return SerialOracle(net, exchange)
    if mode.name == "mgrit":
        return MGRITOracle(net, exchange, mgrit_opts)
    from lptrain.train.oneshot import SimultaneousOracle   # it builds on MGRITOracle
    return SimultaneousOracle(net, exchange, mgrit_opts, mode.warm_batches, mini_batches)
