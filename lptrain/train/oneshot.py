"""The one-shot (simultaneous) oracle: a few warm-started MGRIT iterations per evaluation."""
from __future__ import annotations

import math

from lptrain.train.control import ControlOptions, IterationController, Measured, refines
from lptrain.train.mgrit_oracle import MGRITOracle
from lptrain.train.oracles import SolveStats
from lptrain.train.warm import WarmCache


class Rungs:
    """The accuracy of one-shot evaluations, in rungs (an MGRITOracle's accuracy policy).

    Rung 0 runs the iterations the controller plans (`plan_key`: for the batch,
    or with mini-batches for all warm or all cold ones; train/control.py:
    mgrit.fwd_iters / adj_iters to begin with, then what keeps the estimated
    gradient error below mgrit.grad_tol), each `tighten()` multiplies both by
    RUNG_FACTOR, and the top rung solves to mgrit.tol / adj_tol like mode=mgrit;
    `relax()` returns to rung 0.  On the fixed-iteration rungs the adaptive guard
    (`more`) adds single iterations while the residual exceeds mgrit.adaptive_ratio ×
    the gradient norm.
    """

    RUNG_FACTOR = 4
    exact = False        # inexact by design: a solve that stops short is no shortfall
    # plan keys of mini-batch runs: every batch with kept states shares one plan, every
    # batch without one (cold) another; a full-batch run plans for its one batch (key 0)
    WARM_PLAN, COLD_PLAN = -1, -2

    def __init__(self, mgrit_opts, mini_batches: bool = False):
        self.mgrit, self.shared_plans = mgrit_opts, mini_batches
        self.rung, self.plan_key = 0, 0
        self.last_gnorm = math.inf      # the latest gradient's norm (the forward guard's)
        mgrit, f, r = mgrit_opts, self.RUNG_FACTOR, 0
        while (mgrit.fwd_iters * f ** r < mgrit.max_iter
               or mgrit.adj_iters * f ** r < mgrit.adjoint_max_iter):
            r += 1
        self.top = r
        self.controller = IterationController(ControlOptions.of(mgrit_opts))
        self._raw_error = math.nan       # the latest estimate before calibration's scale
        self._observed: SolveStats | None = None
        self._refine = False             # the latest evaluation is to be repeated
        self._again = False              # the evaluation under way repeats one
        self._repeats = 0                # repeats of the gradient under way

    def begin(self, key: int, warm: bool) -> None:
        """Which plan an evaluation of batch `key` follows.  With mini-batches each
        batch comes back an epoch later, and all warm starts are about equally old:
        one shared plan re-planned every step follows the error faster than a plan per
        batch re-planned once an epoch."""
        if not self.shared_plans:
            self.plan_key = key
        else:
            self.plan_key = self.WARM_PLAN if warm else self.COLD_PLAN

    def budget(self) -> tuple[int, float, int, float]:
        """(forward iterations, tol, adjoint iterations, tol) at the current rung.  Rung 0
        runs the plan; no rung above it runs more than the top rung may (max_iter,
        adj_max_iter), and one whose scaled plan reaches both is the top rung."""
        mgrit = self.mgrit
        if self._at_top():
            return mgrit.max_iter, mgrit.tol, mgrit.adjoint_max_iter, mgrit.adjoint_tol
        fwd, adj = self._scaled()
        if self.rung == 0:
            return fwd, 0.0, adj, 0.0
        return min(fwd, mgrit.max_iter), 0.0, min(adj, mgrit.adjoint_max_iter), 0.0

    def _scaled(self) -> tuple[int, int]:
        """The plan times RUNG_FACTOR^rung."""
        scale = self.RUNG_FACTOR ** self.rung
        fwd, adj = self.controller.plan(self.plan_key)
        return fwd * scale, adj * scale

    def _at_top(self) -> bool:
        """Whether this rung solves to tolerance: the top one, or one above rung 0 whose
        scaled plan asks for both limits already (the plan has grown since `top` was
        counted). Rung 0 runs the plan, whatever the limits."""
        if self.rung >= self.top:
            return True
        if self.rung == 0:
            return False
        fwd, adj = self._scaled()
        return fwd >= self.mgrit.max_iter and adj >= self.mgrit.adjoint_max_iter

    def more(self, history: list, grad_norm: float, extra: int) -> bool:
        """The adaptive guard: one more iteration while the residual exceeds
        mgrit.adaptive_ratio × the gradient norm (fixed-iteration rungs only)."""
        mgrit = self.mgrit
        return mgrit.adaptive and not self._at_top() and extra < mgrit.adaptive_max_extra \
            and bool(history) and history[-1] > mgrit.adaptive_ratio * grad_norm

    def tighten(self) -> bool:
        if self._at_top():
            return False
        self.rung += 1
        return True

    def relax(self) -> None:
        self.rung = 0

    def observe(self, stats: SolveStats, m: Measured, grad_norm: float) -> None:
        """Scale the gradient error estimate in `stats` by the controller's calibration
        and plan the batch's next iterations; only rung-0 evaluations re-plan (higher
        rungs multiply the plan)."""
        scale = self.controller.scale
        self._raw_error, self._observed = stats.fwd_error + stats.adj_error, stats
        stats.fwd_error, stats.adj_error = stats.fwd_error * scale, stats.adj_error * scale
        stats.error_scale = scale
        again, self._again = self._again, False
        # the most iterations a solve of it ran in any data group, as every rank knows
        # it: the plan, and the adaptive guard's extras (each group adds its own)
        used = self.controller.plan(self.plan_key)
        extra = self.mgrit.adaptive_max_extra if self.mgrit.adaptive else 0
        ran = (used[0] + extra, used[1] + extra)
        if self.rung == 0:
            # a repeat started from its own first try's states at the same θ, which the
            # next evaluation (another θ, or another batch) does not have: it may grow
            # the plan, not shrink it (shrunk, the next one was far off and repeated)
            self.controller.update(self.plan_key, m, (stats.fwd_error, stats.adj_error),
                                   again=again, grow_only=again)
        stats.fwd_plan, stats.adj_plan = self.controller.plan(self.plan_key)
        self.last_gnorm = grad_norm
        # decided from what every rank and data group shares (the summed record, the plans);
        # a solve to tolerance (no rung below the top) or a gradient that is not finite is
        # not taken again, and never more often than control_max_iters
        self._repeats = self._repeats + 1 if again else 0
        o = self.controller.o
        self._refine = self.rung == 0 < self.top and o.control == "error" and \
            math.isfinite(grad_norm) and self._repeats < o.control_max_iters and refines(
                (stats.fwd_error, stats.adj_error), o.grad_tol, ran,
                (stats.fwd_plan, stats.adj_plan))

    def refine(self) -> bool:
        """Whether the evaluation just observed is to be repeated at its θ with the
        grown plan: its estimated gradient error is far above mgrit.grad_tol
        (train/control.py refines), e.g. a cold first evaluation. Asked once per
        observed evaluation."""
        again, self._refine = self._refine, False
        self._again = again
        return again

    def calibration_due(self) -> bool:
        """Whether the gradient just computed is to be compared with the exact one
        (train/calibrate.py): a rung-0 evaluation the controller calibrates at."""
        return self.rung == 0 and self.controller.calibration_due()

    def calibrate(self, true_error: float) -> None:
        """The true relative error of the gradient just computed."""
        self.controller.calibrate(true_error, self._raw_error)
        if self._observed is not None:
            self._observed.true_error = true_error

    def state_dict(self) -> dict:
        return {"last_gnorm": self.last_gnorm, "rung": self.rung,
                "controller": self.controller.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.last_gnorm, self.rung = state["last_gnorm"], state["rung"]
        if "controller" in state:        # checkpoints written before the controller
            self.controller.load_state_dict(state["controller"])


class SimultaneousOracle(MGRITOracle):
    """One-shot: a few warm-started MGRIT iterations per evaluation (inexact gradient).

    An MGRITOracle with the `Rungs` accuracy and a `WarmCache` of up to
    `warm_batches` batches' warm starts (least recently used dropped); a batch
    without one starts cold, which with skip_first_down is a coarse-grid
    propagation of u_0.  The kept warm starts of mini-batches are compact (only
    the C-point rows of the rank's blocks); a full-batch run keeps the solvers'
    buffers.
    """

    WARM = WarmCache

    def __init__(self, net, exchange, mgrit_opts, warm_batches: int = 1,
                 mini_batches: bool = False, observer=None):
        super().__init__(net, exchange, mgrit_opts, Rungs(mgrit_opts, mini_batches),
                         observer=observer)
        self.warm = WarmCache(warm_batches, self.lp, keep_compact=mini_batches)
