"""Optimizers on the flat parameter vector: L-BFGS with Armijo backtracking, SGD, Adam.

An optimizer talks to an oracle (train/protocol.py Oracle): `value(θ)` evaluates
the objective and returns a handle, `gradient(handle)` returns ∇J at its θ, and
`accept(handle)` tells the oracle that θ is the new iterate.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import torch
from torch.optim.adam import adam
from torch.optim.sgd import sgd

from lptrain.errors import DIVERGED_REMEDY, DivergedError, require
from lptrain.mgrit.exchange import SerialExchange
from lptrain.train.protocol import Oracle, Point
from lptrain.train.shards import Shards
from lptrain.train.schedules import SCHEDULES


@dataclass(kw_only=True)
class StepInfo:
    """What one optimizer iteration did: objective, loss and accuracy at the new iterate,
    or `at_start` at the iterate the step started from (where its gradient was taken)."""

    objective: float
    loss: float
    accuracy: float
    grad_norm: float
    step_size: float
    ls_trials: int = 0
    lbfgs_skipped: int = 0
    lbfgs_reset: int = 0
    converged: bool = False
    ls_failed: int = 0        # failed line searches (each followed by tighter solves)
    exhausted: bool = False   # no step found even with exact solves and steepest descent
    at_start: bool = False


def finite_gradient(g: torch.Tensor) -> torch.Tensor:
    """`g`, or DivergedError where it is not finite (an adjoint solve that overflowed:
    the oracles give NaN, alike on every rank)."""
    if not bool(torch.isfinite(g).all()):
        raise DivergedError(f"diverged: the gradient is not finite: {DIVERGED_REMEDY}")
    return g


def _unstepped(theta, ev, oracle: Oracle):
    """(θ, StepInfo) of a first evaluation whose objective is not finite: no step from
    there; the loop's divergence rule ends the run with the iteration's row, and the
    oracle's record is this evaluation's (the solve that failed)."""
    oracle.accept(ev)
    p = ev.point
    return theta, StepInfo(objective=p.objective, loss=p.loss, accuracy=p.accuracy,
                           grad_norm=math.nan, step_size=0.0, at_start=True)


def _finite(point) -> None:
    """DivergedError unless the objective is finite (the first evaluation's is the
    loop's to judge: LBFGS.step)."""
    if not math.isfinite(point.objective):
        raise DivergedError(f"diverged: objective {point.objective} at the current "
                            f"parameters: {DIVERGED_REMEDY}")


class LBFGS:
    """Limited-memory BFGS, H0 = sᵀy/yᵀy, Armijo backtracking (docs/method.md §5).

    Robust where the authors' code is not: an update with sᵀy ≤ eps·‖s‖‖y‖ is
    skipped; a failed line search forgets the curvature pairs and, while the
    oracle can make its gradient more accurate (`oracle.tighten()`: the
    one-shot mode's inexact solves), re-evaluates θ more accurately and
    searches again along −g.  Only a failed search along −g at the most
    accurate solves ends the iteration without a step (`exhausted`).

    With `shards` (train/shards.py: the ranks' parts of θ) each rank keeps and
    recurses over its part of the curvature pairs; default: the whole vectors.
    """

    CURVATURE_EPS = 1e-10

    def __init__(self, opts, total: int = 1, shards=None):
        self.o = opts         # `total` (train.iterations) is unused: no rate schedule
        self.shards = shards
        self.mem: deque = deque(maxlen=opts.memory)   # (s, y, 1/sᵀy): this rank's parts
        self.current = None   # (point, gradient) at θ

    def _parts(self, n: int):
        """The split of θ's n entries (one part: the whole vector, unless given)."""
        if self.shards is None:
            self.shards = Shards(SerialExchange(), n)
        return self.shards

    def _start(self, theta, oracle: Oracle, ev=None):
        ev = oracle.value(theta) if ev is None else ev
        _finite(ev.point)
        grad = finite_gradient(oracle.gradient(ev))
        oracle.accept(ev)
        self.current = (ev.point, grad)

    # checkpoints: plain values and tensors only (torch.load(weights_only=True) reads them)
    def state_dict(self) -> dict | None:
        """The whole pairs on rank 0, None on the other ranks (collective when sharded)."""
        flat = self._vectors()
        whole = flat if self.shards is None else self.shards.gather(flat)
        if whole is None:
            return None
        state, _ = self.state_and_vectors()
        each = iter(whole)
        state["mem"] = [[next(each), next(each), rho] for _, _, rho in state["mem"]]
        return state

    def _vectors(self) -> list[torch.Tensor]:
        """This rank's parts of the pairs' vectors: s₁, y₁, s₂, …"""
        return [v for s, y, _ in self.mem for v in (s, y)]

    def state_and_vectors(self):
        """(state_dict with None for the pairs' vectors, a function whose generator
        yields those vectors whole, s₁, y₁, s₂, …, one at a time on rank 0 and None on
        the other ranks): a checkpoint streams them to the file (train/stored_pairs.py).
        The generator is collective when sharded: every rank runs it through."""
        cur = self.current
        state = {"mem": [[None, None, rho] for _, _, rho in self.mem],
                 "current": None if cur is None else {"point": vars(cur[0]), "grad": cur[1]}}
        flat = self._vectors()

        def vectors():
            return iter(flat) if self.shards is None else self.shards.each_whole(flat)
        return state, vectors

    def load_state_dict(self, state: dict) -> None:
        """Take this rank's parts of a checkpoint's whole pairs."""
        pairs = state["mem"]
        parts = self._parts(len(pairs[0][0])) if pairs else None
        self.mem = deque(((parts.part(s).clone(), parts.part(y).clone(), rho)
                          for s, y, rho in pairs), maxlen=self.o.memory)
        cur = state["current"]
        self.current = None if cur is None else (Point(**cur["point"]), cur["grad"])

    def direction(self, g: torch.Tensor) -> torch.Tensor:
        """−H g by the two-loop recursion, on this rank's part of g."""
        dot = self._parts(len(g)).dot
        q, alphas = self.shards.part(g).clone(), []
        for s, y, rho in reversed(self.mem):
            a = rho * dot(s, q)
            q.sub_(y, alpha=a)
            alphas.append(a)
        if self.mem:
            s, y, _ = self.mem[-1]
            q.mul_(dot(s, y) / dot(y, y))
        for (s, y, rho), a in zip(self.mem, reversed(alphas)):
            b = rho * dot(y, q)
            q.add_(s, alpha=a - b)
        return q.neg_()

    def _descent(self, g: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The L-BFGS direction and its slope gᵀd, or −g where that is no descent."""
        d = self.direction(g)
        parts = self.shards
        slope = parts.dot(parts.part(g), d)
        if slope >= 0:
            self.mem.clear()
            return -g, -parts.dot(parts.part(g), parts.part(g))
        return parts.join(d), slope

    def _search(self, theta, d, slope, point, oracle: Oracle):
        """Armijo backtracking along d: (step, trials, accepted evaluation or None, the
        objective of the last trial where none was finite, else None)."""
        alpha, finite = self.o.step0, False
        for trials in range(1, self.o.max_ls + 1):
            trial = oracle.value(theta + alpha * d)
            j, tried = trial.point.objective, alpha
            finite = finite or math.isfinite(j)
            if math.isfinite(j) and j <= point.objective + self.o.c1 * alpha * slope:
                return alpha, trials, trial, None
            alpha *= self.o.backtrack
        return 0.0, self.o.max_ls, None, None if finite else (j, tried)

    def step(self, theta: torch.Tensor, oracle: Oracle):
        if self.current is None:
            ev = oracle.value(theta)
            if not math.isfinite(ev.point.objective):
                return _unstepped(theta, ev, oracle)
            self._start(theta, oracle, ev)
        trials = failed = 0
        while True:
            point, g = self.current
            d, slope = self._descent(g)
            alpha, used, trial, overflow = self._search(theta, d, slope, point, oracle)
            trials += used
            if trial is not None:
                break
            failed += 1
            steepest = not self.mem
            self.mem.clear()
            if oracle.tighten():
                self._start(theta, oracle)      # the same θ, more accurate solves
            elif not steepest:
                continue                        # once more along −g
            elif overflow is not None:          # no finite objective near θ along −g
                raise DivergedError(f"diverged: objective {overflow[0]} at every trial step "
                                    f"along -g down to {overflow[1]:.3g}: "
                                    f"{DIVERGED_REMEDY}")
            else:
                return theta, StepInfo(
                    objective=point.objective, loss=point.loss, accuracy=point.accuracy,
                    grad_norm=float(g.norm()), step_size=0.0, ls_trials=trials,
                    lbfgs_reset=1, ls_failed=failed, exhausted=True)
        new = theta + alpha * d
        g_new = finite_gradient(oracle.gradient(trial))
        oracle.accept(trial)
        oracle.relax()
        reached = trial.point
        parts = self.shards
        s, y = parts.part(new) - parts.part(theta), parts.part(g_new) - parts.part(g)
        sy = parts.dot(s, y)
        skipped = int(sy <= self.CURVATURE_EPS * parts.norm(s) * parts.norm(y))
        if not skipped:
            self.mem.append((s, y, 1.0 / sy))
        self.current = (reached, g_new)
        gn = float(g_new.norm())
        return new, StepInfo(objective=reached.objective, loss=reached.loss,
                             accuracy=reached.accuracy, grad_norm=gn, step_size=alpha,
                             ls_trials=trials, lbfgs_skipped=skipped,
                             lbfgs_reset=int(failed > 0), converged=gn <= self.o.gtol,
                             ls_failed=failed)


class _TorchOptimizer:
    """A torch.optim update rule on the flat θ: one step per oracle evaluation.

    The step is torch's functional form of the rule (`torch.optim.adam.adam`,
    `torch.optim.sgd.sgd`), the computation `torch.optim.Adam.step` makes, on a state kept
    here in the layout of that optimizer's state_dict (checkpoints hold it as before).
    Why not the optimizer object: constructing one imports torch._dynamo, which lengthens
    every run's start-up (BENCHMARKS.md "The test suite's time").
    The learning rate of step k follows opts.schedule over `total` steps
    (train.iterations); the step count is part of the state, so a resumed run
    continues the schedule where it stopped. `shards` is not used: every rank takes the
    whole elementwise update, a few passes over θ.
    """

    def __init__(self, opts, total: int = 1, shards=None):
        require(total >= 1, "train.iterations", total, "must be positive")
        self.o, self.total = opts, total
        self.rate = SCHEDULES[opts.schedule]
        self.steps = 0                              # updates taken so far
        self.state: dict = {}                       # torch's per-parameter state of θ
        self.last_lr: float | None = None           # the rate of the latest step

    def group(self, lr: float) -> dict:
        """The hyperparameters as torch's optimizer lists them in a param group."""
        raise NotImplementedError

    def apply(self, param: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
        """One step of the rule on `param` in place, advancing self.state."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        lr = self.lr() if self.last_lr is None else self.last_lr
        inner = {"state": {0: self.state} if self.state else {},
                 "param_groups": [{**self.group(lr), "params": [0]}]}
        return {"torch": inner, "steps": self.steps}

    def state_and_vectors(self):
        """(state_dict, no vectors streamed apart): as LBFGS's."""
        return self.state_dict(), lambda: iter(())

    def load_state_dict(self, state: dict) -> None:
        inner = state["torch"]
        self.state = dict(inner["state"].get(0, {})) if inner else {}
        self.steps = int(state["steps"])

    def lr(self) -> float:
        """The learning rate of the next step."""
        return self.rate(self.o.lr, self.o.lr_min, self.steps, self.total)

    def update(self, theta, g):
        """θ after one optimizer step with gradient g, and the learning rate used."""
        lr = self.lr()
        param = theta.detach().clone()
        # as torch.optim.Optimizer.load_state_dict: state tensors take θ's dtype (not a
        # step count)
        self.state = {k: v if k == "step" else v.to(param) for k, v in self.state.items()}
        with torch.no_grad():
            self.apply(param, g, lr)
        self.steps, self.last_lr = self.steps + 1, lr
        return param, lr

    def step(self, theta, oracle: Oracle):
        ev = oracle.value(theta)
        if not math.isfinite(ev.point.objective):
            return _unstepped(theta, ev, oracle)
        g = finite_gradient(oracle.gradient(ev))
        oracle.accept(ev)
        point = ev.point            # the gradient's own (an evaluation taken again: its)
        new, lr = self.update(theta, g)
        return new, StepInfo(objective=point.objective, loss=point.loss,
                             accuracy=point.accuracy, grad_norm=float(g.norm()), step_size=lr,
                             at_start=True)


class SGD(_TorchOptimizer):
    """Stochastic gradient descent with (Nesterov) momentum on mini-batches (torch.optim)."""

    def group(self, lr):
        o = self.o
        return {"lr": lr, "momentum": o.momentum, "dampening": 0, "weight_decay": 0,
                "nesterov": o.nesterov, "maximize": False, "foreach": False,
                "differentiable": False, "fused": None}

    def apply(self, param, grad, lr):
        o = self.o
        buffers = [self.state.get("momentum_buffer")]
        sgd([param], [grad], buffers, foreach=False, weight_decay=0, momentum=o.momentum,
            lr=lr, dampening=0, nesterov=o.nesterov, maximize=False)
        if o.momentum != 0:         # torch keeps no state without momentum
            self.state["momentum_buffer"] = buffers[0]


class Adam(_TorchOptimizer):
    """Adam with bias correction (torch.optim)."""

    def group(self, lr):
        o = self.o
        return {"lr": lr, "betas": (o.beta1, o.beta2), "eps": o.eps, "weight_decay": 0,
                "amsgrad": False, "maximize": False, "foreach": False, "capturable": False,
                "differentiable": False, "fused": None, "decoupled_weight_decay": False}

    def apply(self, param, grad, lr):
        o, s = self.o, self.state
        if not s:        # as torch.optim.Adam's first step (its scalar dtype for the count)
            count = torch.float64 if torch.get_default_dtype() == torch.float64 else \
                torch.float32
            s.update(step=torch.tensor(0.0, dtype=count), exp_avg=torch.zeros_like(param),
                     exp_avg_sq=torch.zeros_like(param))
        adam([param], [grad], [s["exp_avg"]], [s["exp_avg_sq"]], [], [s["step"]],
             foreach=False, capturable=False, differentiable=False, fused=None,
             has_complex=param.is_complex(), amsgrad=False, beta1=o.beta1, beta2=o.beta2,
             lr=lr, weight_decay=0, eps=o.eps, maximize=False)


OPTIMIZERS = {"lbfgs": LBFGS, "sgd": SGD, "adam": Adam}
