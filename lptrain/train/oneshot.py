"""The one-shot (simultaneous) oracle: a few warm-started MGRIT iterations per evaluation."""
from __future__ import annotations

import math
from collections import OrderedDict

import torch

from lptrain.parallel.blocks import ALL_ROWS, C_POINTS
from lptrain.train.control import ControlOptions, IterationController
from lptrain.train.oracles import MGRITOracle, Point


class SimultaneousOracle(MGRITOracle):
    """One-shot: a few warm-started MGRIT iterations per evaluation (inexact gradient).

    Accuracy comes in rungs: rung 0 runs the iterations the controller plans
    (`_plan_key`: for the batch, or with mini-batches for all warm or all cold ones;
    train/control.py: mgrit.fwd_iters / adj_iters to begin with,
    then what keeps the estimated gradient error below mgrit.grad_tol), each
    `tighten()` multiplies both by RUNG_FACTOR, and the top rung solves to
    mgrit.tol / adj_tol like mode=mgrit; `relax()` returns to rung 0.  Warm
    starts are kept per mini-batch key for up to `warm_batches` batches (least
    recently used dropped); a batch without one starts cold, which with
    skip_first_down is a coarse-grid propagation of u_0.  The kept warm starts of
    mini-batches are compact: only the C-point rows of the rank's blocks, all a warm
    solve reads (mgrit/solver.py); a full-batch run keeps the solvers' buffers.
    """

    RUNG_FACTOR = 4
    # plan keys of mini-batch runs: every batch with kept states shares one plan, every
    # batch without one (cold) another; a full-batch run plans for its one batch (key 0)
    WARM_PLAN, COLD_PLAN = -1, -2

    def __init__(self, net, exchange, mgrit_opts, warm_batches: int = 1,
                 mini_batches: bool = False):
        super().__init__(net, exchange, mgrit_opts)
        self.capacity = max(warm_batches, 1)
        self.copy = mini_batches      # other batches' solves reuse the solver buffers
        self.cache: OrderedDict = OrderedDict()
        self.last_gnorm = math.inf
        self.rung = 0
        mgrit, f, r = mgrit_opts, self.RUNG_FACTOR, 0
        while (mgrit.fwd_iters * f ** r < mgrit.max_iter
               or mgrit.adj_iters * f ** r < mgrit.adjoint_max_iter):
            r += 1
        self.top = r
        self.controller = IterationController(ControlOptions.of(mgrit_opts))

    def begin(self, batch):
        super().begin(batch)
        self.plan_key = self._plan_key(batch.key)

    def skip(self, key: int) -> None:
        self.plan_key = self._plan_key(key)     # as the groups with samples plan
        super().skip(key)

    def _plan_key(self, key: int) -> int:
        """Which plan an evaluation of batch `key` follows.  With mini-batches each
        batch comes back an epoch later, and all warm starts are about equally old:
        one shared plan re-planned every step follows the error faster than a plan per
        batch re-planned once an epoch."""
        if not self.copy:
            return key
        return self.WARM_PLAN if key in self.cache else self.COLD_PLAN

    def tighten(self) -> bool:
        if self.rung >= self.top:
            return False
        self.rung += 1
        return True

    def relax(self) -> None:
        self.rung = 0

    def budget(self) -> tuple[int, float, int, float]:
        """(forward iterations, tol, adjoint iterations, tol) at the current rung."""
        mgrit = self.mgrit
        if self.rung >= self.top:
            return mgrit.max_iter, mgrit.tol, mgrit.adjoint_max_iter, mgrit.adjoint_tol
        scale = self.RUNG_FACTOR ** self.rung
        fwd, adj = self.controller.plan(self.plan_key)
        return fwd * scale, 0.0, adj * scale, 0.0

    STATE = (*MGRITOracle.STATE, "last_gnorm", "rung")

    def state_dict(self) -> dict:
        return {**super().state_dict(),
                "cache": [[key, fwd, adj] for key, (fwd, adj) in self.cache.items()],
                "warm_rows": C_POINTS if self.copy else ALL_ROWS,
                "controller": self.controller.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """The state of a checkpoint; with mini-batches, blocks of all rows (a checkpoint
        written before warm starts were compact) are cut to their C-points."""
        super().load_state_dict(state)
        full = self.copy and self.warm_rows(state) == ALL_ROWS
        self.cache = OrderedDict(
            (key, (self._compact(self.lp.fwd, fwd), self._compact(self.lp.adj, adj))
             if full else (fwd, adj)) for key, fwd, adj in state["cache"])
        if "controller" in state:        # checkpoints written before the controller
            self.controller.load_state_dict(state["controller"])

    @staticmethod
    def warm_entries(state: dict) -> list:
        return [list(entry) for entry in state["cache"]]

    @staticmethod
    def with_warm_entries(state: dict, entries: list) -> dict:
        return {**state, "cache": [list(entry) for entry in entries]}

    @staticmethod
    def warm_rows(state: dict) -> str:
        return state.get("warm_rows", ALL_ROWS)

    @staticmethod
    def _compact(solver, states):
        """The C-point rows of a block (None stays None)."""
        return None if states is None else solver.c_point_states(states)

    def control(self, m, grad_norm: float, key: int) -> None:
        """Estimate the gradient error (scaled by the controller's calibration) and
        plan the batch's next iterations; only rung-0 evaluations re-plan (higher
        rungs multiply the plan)."""
        super().control(m, grad_norm, key)
        t, scale = self._trial, self.controller.scale
        self._raw_error = t.fwd_error + t.adj_error
        t.fwd_error, t.adj_error, t.error_scale = t.fwd_error * scale, t.adj_error * scale, scale
        if self.rung == 0:
            self.controller.update(self.plan_key, m, (t.fwd_error, t.adj_error))
        t.fwd_plan, t.adj_plan = self.controller.plan(self.plan_key)

    def calibration_due(self) -> bool:
        """Whether the gradient just computed is to be compared with the exact one
        (train/calibrate.py): a rung-0 evaluation the controller calibrates at."""
        return self.rung == 0 and self.controller.calibration_due()

    def calibrate(self, true_error: float) -> None:
        """The true relative error of the gradient just computed."""
        self.controller.calibrate(true_error, self._raw_error)
        self._trial.true_error = true_error

    def _solve_forward(self, theta, warm):
        extra = 0
        iters, tol, *_ = self.budget()
        res = self.lp.forward(theta, self.batch.x, warm=warm, max_iter=iters, tol=tol)
        history, iters = list(res.history), res.iterations
        while self._guard(history, self.last_gnorm, extra):
            res = self.lp.forward(theta, self.batch.x, max_iter=1, tol=0.0, resume=True)
            history += res.history
            iters += res.iterations
            extra += 1
        res.history, res.iterations = history, iters
        self._extra = extra
        return res

    def _guard(self, history, gnorm: float, extra: int) -> bool:
        """The adaptive guard: one more iteration while the residual exceeds
        mgrit.adaptive_ratio × the gradient norm (fixed-iteration rungs only)."""
        mgrit = self.mgrit
        return mgrit.adaptive and self.rung < self.top and extra < mgrit.adaptive_max_extra \
            and bool(history) and history[-1] > mgrit.adaptive_ratio * gnorm

    def value(self, theta) -> Point:
        point = super().value(theta)
        self._trial.adaptive_extra = self._extra
        self._trial.rung = self.rung
        return point

    def _solve_adjoint(self, warm):
        *_, iters, tol = self.budget()
        grad, res = self.lp.backward(self.theta, self.batch.x, self.fwd.states, self.ev,
                                     warm=warm, max_iter=iters, tol=tol)
        history, iters, extra = list(res.history), res.iterations, 0
        while self._guard(history, float(grad.norm()), extra):
            grad, res = self.lp.backward(self.theta, self.batch.x, self.fwd.states, self.ev,
                                         max_iter=1, tol=0.0, resume=True)
            history += res.history
            iters += res.iterations
            extra += 1
        res.history, res.iterations = history, iters
        self._trial.adaptive_extra += extra
        return grad, res

    def gradient(self) -> torch.Tensor:
        grad = super().gradient()
        self.last_gnorm = float(grad.norm())
        return grad

    def _warm_fwd(self):
        entry = self.cache.get(self.batch.key)
        return None if entry is None else entry[0]

    def _warm_adj(self):
        entry = self.cache.get(self.batch.key)
        return None if entry is None else entry[1]

    def _store(self, key, fwd=None, adj=None):
        """Keep a batch's latest states: the solver's buffers themselves in a full-batch
        run (they stay valid until the next solve), else compact copies."""
        if self.copy:
            fwd, adj = self._compact(self.lp.fwd, fwd), self._compact(self.lp.adj, adj)
        old = self.cache.pop(key, (None, None))
        self.cache[key] = (fwd if fwd is not None else old[0],
                           adj if adj is not None else old[1])
        while len(self.cache) > self.capacity:
            self.cache.popitem(last=False)
