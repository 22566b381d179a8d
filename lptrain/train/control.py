"""The one-shot controller: how many MGRIT iterations an evaluation gets (docs/method.md §6).

A one-shot gradient is computed from states u and adjoints λ that are not
converged.  Its error is estimated from what the solves measure anyway:
their final residual norms r_u, r_λ at the C-points and the C-point norms
‖u_C‖, ‖λ_C‖.  The weight gradient is h Σ_n (σ′ ⊙ λ_{n+1}) u_nᵀ; an error of
r/√n_C per C-point in u or λ changes it by about T·r·‖other‖/n_C, so

    ε_u = T · r_u · ‖λ_C‖ / (n_C ‖g‖),   ε_λ = T · r_λ · ‖u_C‖ / (n_C ‖g‖)

estimate the gradient error relative to the gradient (ε = ε_u + ε_λ).  The
estimate lies above the true error at the median, 2–7× on the dense tanh networks
(below it in 3–23 % of evaluations; with ReLU, whose σ′ jumps where an error in u
moves the activation pattern, in 23–64 %), but about 100× on the pooled convolutional
network of the image
datasets, where it follows the true error only loosely (BENCHMARKS.md).
Calibration corrects it where it is that loose: every `mgrit.calibrate_every`
evaluations the caller computes the exact gradient and reports the true
error; the controller scales every estimate by the median true/estimated
ratio of the last CALIBRATIONS_KEPT calibrations (`scale`): one ratio varies by
an order of magnitude from one evaluation to the next where the estimate follows
the error loosely, and the largest would over-solve by that spread.  The controller keeps ε_u and ε_λ each below half of
`mgrit.grad_tol` by planning the next evaluation's iterations from the
measured convergence factor ρ: too large by a factor q → ⌈log q / log(1/ρ)⌉
more; met already one iteration before the solve's last (its residual there) → one
fewer.  With mini-batches the
batches with kept warm starts (all about an epoch old) share one plan and those
without share another (train/oneshot.py).  Everything here is arithmetic on a few
numbers: pure.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, fields
from typing import Sequence

RHO_MIN, RHO_MAX = 0.01, 0.9     # measured factors are clipped to this range
# an estimated gradient error this many times mgrit.grad_tol is far above it: the
# gradient is not worth a step while more iterations can be planned (`refines`)
FAR = 10.0
CALIBRATIONS_KEPT = 4            # the scale is the median ratio of this many calibrations


@dataclass(kw_only=True)
class Measured:
    """One evaluation's solve record, summed over every rank (and data group).

    *_first_sq / *_last_sq: squared first and last residual norms of the solve;
    *_ratios: residual ratios between them (len(history) − 1); *_state_sq: ‖·_C‖².
    """

    fwd_first_sq: float
    fwd_last_sq: float
    fwd_state_sq: float
    fwd_ratios: int
    adj_first_sq: float
    adj_last_sq: float
    adj_state_sq: float
    adj_ratios: int
    fwd_prev_sq: float = 0.0      # the residual before the last, squared (0: none)
    adj_prev_sq: float = 0.0

    def as_list(self) -> list[float]:
        """The fields in declaration order (what data groups sum in one allreduce)."""
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_sums(cls, sums, groups: float) -> "Measured":
        """From the elementwise sum of as_list() over `groups` contributing groups: the
        squared norms summed, the ratio counts (the same in every group) averaged."""
        n = max(groups, 1.0)
        values = dict(zip((f.name for f in fields(cls)), sums, strict=True))
        return cls(**{name: round(v / n) if name.endswith("_ratios") else v
                      for name, v in values.items()})


def gradient_error(m: Measured, T: float, n_c: int, grad_norm: float) -> tuple[float, float]:
    """(ε_u, ε_λ): the forward and the adjoint share of the relative gradient error."""
    if n_c <= 0:
        return 0.0, 0.0
    if not grad_norm > 0:
        return math.inf, math.inf
    scale = T / (n_c * grad_norm)
    return (scale * math.sqrt(m.fwd_last_sq * m.adj_state_sq),
            scale * math.sqrt(m.adj_last_sq * m.fwd_state_sq))


def stagnated(residuals: Sequence[float], last: int = 3, above: float = 0.9) -> bool:
    """Whether a solve's residuals stopped falling but do not grow: each of its `last`
    ratios r[k+1]/r[k] within (above, 1/above) (round-off, not too few iterations:
    more would not help)."""
    r = [float(x) for x in residuals][-(last + 1):]
    return len(r) == last + 1 and all(above * a < b < a / above for a, b in zip(r, r[1:]))


def grew(residuals: Sequence[float]) -> bool:
    """Whether a solve ended with a larger residual than it started with (diverged)."""
    r = [float(x) for x in residuals]
    return len(r) >= 2 and r[-1] > r[0]


def convergence_factor(residuals: Sequence[float]) -> float:
    """Geometric mean of the ratios r[k+1]/r[k] of one solve's residuals; NaN with fewer
    than 2 residuals or a non-positive or non-finite first one.

    The product of the ratios telescopes to r[-1]/r[0], so the mean is
    (r[-1]/r[0]) ** (1/(m-1)); `factor` is the same rule on summed squares, clipped.
    """
    r = [float(x) for x in residuals]
    if len(r) < 2 or not (math.isfinite(r[0]) and r[0] > 0) or not r[-1] >= 0:
        return float("nan")
    return (r[-1] / r[0]) ** (1.0 / (len(r) - 1))


def factor(first_sq: float, last_sq: float, ratios: int) -> float:
    """Measured convergence factor per iteration, clipped to [RHO_MIN, RHO_MAX]."""
    if ratios < 1 or not first_sq > 0 or not math.isfinite(last_sq):
        return RHO_MAX
    rho = math.sqrt(last_sq / first_sq) ** (1.0 / ratios)
    return min(max(rho, RHO_MIN), RHO_MAX)


def next_iterations(k: int, eps: float, rho: float, target: float, lo: int, hi: int,
                    last_ratio: float | None = None) -> int:
    """Iterations for the next solve: enough that ε falls below `target` at factor ρ,
    one fewer where this solve had met it one iteration earlier, within [lo, hi].

    The estimate is proportional to the last residual, so one iteration earlier it was
    ε / `last_ratio` (r_last / r_before): measured, where the mean factor ρ predicts.
    ρ predicts too little where a warm solve speeds up in its last iterations, and
    nothing where the last iteration made the solve exact (a two-level hierarchy after
    N/c iterations). Without the residual before the last: ε/ρ."""
    if not math.isfinite(eps):
        return hi
    if eps > target:
        k += max(1, math.ceil(math.log(eps / target) / -math.log(rho) - 1e-9))
    else:
        earlier = rho if last_ratio is None else last_ratio
        if earlier > 0 and eps <= target * earlier:
            k -= 1
    return min(max(k, lo), hi)


def refines(eps: tuple[float, float], target: float, ran: tuple[int, int],
            planned: tuple[int, int]) -> bool:
    """Whether an evaluation whose estimate ε_u + ε_λ (`eps`) is FAR times the `target` or
    more is taken again at its θ: only where a solve that makes it so (its share at least
    half of that) has a plan above the iterations it `ran` (adaptive extras included). At
    control_max_iters, or where only the other solve could grow, it stands."""
    bound = FAR * target
    if sum(eps) < bound:
        return False
    return any(not e < bound / 2 and p > r for e, r, p in zip(eps, ran, planned))


def last_ratio(prev_sq: float, last_sq: float) -> float | None:
    """r_last / r_before (None without the residual before the last)."""
    return math.sqrt(last_sq / prev_sq) if prev_sq > 0 else None


@dataclass
class ControlOptions:
    """What the controller needs of MGRITOptions (which validates it: mgrit.control is
    one of mgrit/options.py CONTROLS)."""

    control: str = "error"
    fwd_iters: int = 2
    adj_iters: int = 2
    grad_tol: float = 0.005
    control_min_iters: int = 1
    control_max_iters: int = 6
    calibrate_every: int = 0     # evaluations between exact-gradient calibrations (0 = none)

    @classmethod
    def of(cls, mgrit) -> "ControlOptions":
        """The controller's fields of an MGRITOptions."""
        return cls(mgrit.control, mgrit.fwd_iters, mgrit.adj_iters, mgrit.grad_tol,
                   mgrit.control_min_iters, mgrit.control_max_iters, mgrit.calibrate_every)


class IterationController:
    """Plans (forward, adjoint) iterations per batch key from the last estimate."""

    def __init__(self, options: ControlOptions):
        self.o = options
        self.plans: dict[int, list[int]] = {}
        self.evaluations = 0                 # rung-0 evaluations estimated so far
        self.ratios: list[float] = []        # true / raw estimate, latest calibrations

    @property
    def scale(self) -> float:
        """The factor every raw estimate is multiplied by (1 before any calibration)."""
        return statistics.median(self.ratios) if self.ratios else 1.0

    def calibration_due(self) -> bool:
        """Whether the evaluation just planned from (update) is one to calibrate: the
        first and then every calibrate_every-th."""
        every = self.o.calibrate_every
        return every > 0 and self.evaluations > 0 and (self.evaluations - 1) % every == 0

    def calibrate(self, true_error: float, raw_error: float) -> None:
        """Record a calibration: the true relative error of an evaluation whose raw
        estimate (ε_u + ε_λ, unscaled) was raw_error."""
        if not (raw_error > 0 and math.isfinite(raw_error) and math.isfinite(true_error)):
            return
        self.ratios = [*self.ratios, true_error / raw_error][-CALIBRATIONS_KEPT:]

    def plan(self, key: int) -> tuple[int, int]:
        k = self.plans.get(key)
        return (self.o.fwd_iters, self.o.adj_iters) if k is None else (k[0], k[1])

    def update(self, key: int, m: Measured, eps: tuple[float, float],
               again: bool = False, grow_only: bool = False) -> None:
        """Re-plan `key` from an evaluation done with plan(key): its record m and its
        estimate eps = (ε_u, ε_λ) (gradient_error, times `scale`). `again`: the
        evaluation repeated one (oneshot.Rungs.refine), not counted as another (the
        calibrations count the gradients the optimizer gets); `grow_only`: the plan may
        grow, not shrink."""
        self.evaluations += not again
        if self.o.control != "error":
            return
        kf, ka = self.plan(key)
        half = self.o.grad_tol / 2
        lo, hi = self.o.control_min_iters, self.o.control_max_iters
        self.plans[key] = [
            next_iterations(kf, eps[0], factor(m.fwd_first_sq, m.fwd_last_sq, m.fwd_ratios),
                            half, lo, hi, last_ratio(m.fwd_prev_sq, m.fwd_last_sq)),
            next_iterations(ka, eps[1], factor(m.adj_first_sq, m.adj_last_sq, m.adj_ratios),
                            half, lo, hi, last_ratio(m.adj_prev_sq, m.adj_last_sq))]
        if grow_only:
            self.plans[key] = [max(kf, self.plans[key][0]), max(ka, self.plans[key][1])]

    def state_dict(self) -> dict:
        return {"plans": [[key, *k] for key, k in self.plans.items()],
                "evaluations": self.evaluations, "ratios": list(self.ratios)}

    def load_state_dict(self, state: dict) -> None:
        self.plans = {int(key): [int(kf), int(ka)] for key, kf, ka in state["plans"]}
        self.evaluations = int(state.get("evaluations", 0))   # absent before calibration
        self.ratios = [float(r) for r in state.get("ratios", [])]
