"""What the console says once in a run about its MGRIT solves (train/loop.py): mode=mgrit's
solves cut short at max_iter, one-shot errors out of the controller's reach, calibrations
above the target, evaluations taken again."""
from __future__ import annotations

import math

from lptrain.errors import counted
from lptrain.train.control import FAR, grew, stagnated


class SolveNotes:
    """What the console says once in a run about its solves: mode=mgrit's solves cut
    short at max_iter; one-shot solves run at their most whose estimated error stays
    far above mgrit.grad_tol; a calibration that finds the true error above it."""

    def __init__(self, console, mgrit, dtype: str = "float64", custom: bool = False):
        self.console, self.mgrit, self.said = console, mgrit, set()
        self.stalled = _stall_advice(dtype, custom)   # what a stagnated solve is told
        self.dtype = dtype
        self.beyond = 0      # iterations in a row out of the controller's reach

    def state_dict(self) -> dict:
        """What a resumed run needs so as not to say them again."""
        return {"said": sorted(self.said), "beyond": self.beyond}

    def load_state_dict(self, state: dict) -> None:
        self.said, self.beyond = set(state["said"]), state["beyond"]

    def after(self, k: int, stats: dict | None) -> None:
        if stats is None:
            return
        for name, say in (("short", self._shortfall), ("reach", self._out_of_reach),
                          ("calibrated", _calibrated_above), ("repeated", _repeated)):
            if name not in self.said and say(k, stats, self.console, self.mgrit):
                self.said.add(name)

    def _shortfall(self, k: int, stats: dict, console, mgrit) -> bool:
        return _shortfall(k, stats, console, self.stalled)

    def _out_of_reach(self, k: int, stats: dict, console, mgrit) -> bool:
        """Say, once, that the estimated gradient error stayed above what the solves can
        reach REACH_ITERATIONS iterations in a row (the plans are for the next
        evaluation: a spike of one is planned away). Whether it did. Under the error
        control: solves run at control_max_iters left it FAR times mgrit.grad_tol;
        under mgrit.control=fixed, which plans nothing and has no grad_tol: the fixed
        iterations left it above FIXED_ERROR."""
        error = stats.get("grad_error", math.nan)
        if mgrit.control == "fixed":
            far = error > FIXED_ERROR
        else:
            ran = min(stats.get("fwd_iterations", 0), stats.get("adj_iterations", 0))
            far = stats.get("fwd_plan", -1) >= 0 and ran >= mgrit.control_max_iters and \
                error > FAR * mgrit.grad_tol
        self.beyond = self.beyond + 1 if far else 0
        if self.beyond < REACH_ITERATIONS:
            return False
        if mgrit.control == "fixed":
            return _said(console, f"iteration {k}: the estimated one-shot gradient error "
                         f"{error:.1e} stays above {FIXED_ERROR:.0e}", f"  at the fixed "
                         f"{mgrit.fwd_iters} + {mgrit.adj_iters} iterations a solve "
                         f"(mgrit.control=fixed); mgrit.control=error", "  plans more "
                         "where they are needed, mode=mgrit solves exactly")
        most = mgrit.control_max_iters
        return _said(console, f"iteration {k}: with {counted(most, 'iteration')} a solve "
                     f"(mgrit.control_max_iters) the", f"  estimated gradient error "
                     f"{error:.1e} stays far above mgrit.grad_tol {mgrit.grad_tol:g};",
                     *self._beyond_advice(stats))

    def _beyond_advice(self, stats: dict) -> tuple[str, ...]:
        """What to do about an error out of the controller's reach: below float64, solves
        that converged fast and then `slowed` to a crawl met the dtype's round-off, which
        more iterations do not lower; else more iterations or easier solves."""
        if self.dtype != "float64" and any(slowed(stats.get(h) or []) for h in (
                "fwd_history", "adj_history")):
            return (f"  the solves slowed at {self.dtype}'s round-off: a larger "
                    f"mgrit.grad_tol", "  or dtype=float64")
        return ("  try mode=mgrit, a larger control_max_iters, or smaller layer steps",
                "  (network.T) or weights (network.init_hidden)")


# estimated gradient errors FAR times mgrit.grad_tol (train/control.py), with both solves
# run at control_max_iters for this many iterations in a row, are out of the controller's
# reach
REACH_ITERATIONS = 3
# under mgrit.control=fixed: relative gradient errors estimated above this, REACH_ITERATIONS
# in a row (the runs behind it: BENCHMARKS.md "Held-out configurations (stop 63)")
FIXED_ERROR = 1e-2
# a calibration (mgrit.calibrate_every) that measures the true gradient error this many
# times mgrit.grad_tol is said once
CALIBRATED_ABOVE = 2.0


def _calibrated_above(k: int, stats: dict, console, mgrit) -> bool:
    """Say, once, that a calibration measured the true gradient error well above
    mgrit.grad_tol (the scaled estimates lag behind it). Whether it did. Where the plans
    are at control_max_iters already, a smaller grad_tol adds no iteration (the
    fashion_mnist recipe caps them at 2): the advice names the cap instead. Under
    mgrit.control=fixed grad_tol is no target (the calibration is recorded in
    mgrit/true_error only)."""
    true = stats.get("true_error", math.nan)
    if mgrit.control != "error" or not true > CALIBRATED_ABOVE * mgrit.grad_tol:
        return False
    most = mgrit.control_max_iters
    capped = min(stats.get("fwd_plan", -1), stats.get("adj_plan", -1)) >= most
    remedy = (f"  the plans are at mgrit.control_max_iters ({most}): a larger one or",
              "  mode=mgrit keeps nearer serial training") if capped else \
        ("  a smaller mgrit.grad_tol or mode=mgrit keeps nearer serial training",)
    return _said(console, f"iteration {k}: a calibration (mgrit.calibrate_every) "
                 f"measured the one-shot", f"  gradient {true:.1e} off, above "
                 f"mgrit.grad_tol {mgrit.grad_tol:g} (mgrit/true_error);", *remedy)


def _repeated(k: int, stats: dict, console, mgrit) -> bool:
    """Say, once, that an evaluation after the first iteration was taken again (its
    estimate far above mgrit.grad_tol: the steps there cost more). Whether it did; the
    first iteration's repeat (a cold start) is the expected one and not said."""
    if k <= 1 or not stats.get("refined", 0) > 0:
        return False
    return _said(console, f"iteration {k}: a one-shot gradient far above mgrit.grad_tol "
                 f"was taken again", "  with more iterations before the step "
                 "(mgrit/refined counts these, fwd_total", "  and adj_total their cost)")


def slowed(residuals, crawl: float = 0.5, slower: float = 5.0) -> bool:
    """Whether a solve's last residual ratio is above `crawl` and `slower` times its
    first: it converged, then stopped converging (round-off), unlike a solve whose
    factor is uniformly poor (a large layer step, which more iterations do lower)."""
    r = [float(x) for x in residuals]
    return len(r) >= 3 and r[0] > 0 and r[-2] > 0 and \
        r[-1] / r[-2] > max(crawl, slower * r[1] / r[0])


def _said(console, *lines: str) -> bool:
    """The console says `lines`, each a line of its own; True (it was said)."""
    for line in lines:
        console.message(line)
    return True


def _stall_advice(dtype: str, custom: bool) -> list[str]:
    """What a mode=mgrit solve whose residuals stopped falling is told: below float64 the
    dtype's round-off, which float64 lowers; in float64 round-off only where mgrit.tol is
    near it, and a step of the user's whose output varies between calls (noise below
    the build check's) stalls MGRIT far above it."""
    if custom:      # noise in the step stalls them in any dtype (held-out: float32 too)
        return ["  they stopped falling: a step whose output varies from call to call",
                "  stalls MGRIT (make network.step deterministic), as does the round-off",
                f"  of {dtype} where mgrit.tol is near it (raise mgrit.tol"
                + (")" if dtype == "float64" else " or use dtype=float64)")]
    if dtype != "float64":
        return [f"  they stagnated at {dtype}'s round-off: raise mgrit.tol or use "
                f"dtype=float64"]
    return ["  they stopped falling at float64's round-off: raise mgrit.tol"]


def _shortfall(k: int, stats: dict, console, stalled: list[str]) -> bool:
    """Say, once, that a mode=mgrit solve stopped at max_iter above its tolerance: the
    run goes on with inexact gradients (`stalled`: the advice where the residuals stopped
    falling, _stall_advice). Whether it said so."""
    short = stats.get("unconverged", 0)
    if short > 0:
        counted = "(mgrit/unconverged in metrics.h5 counts them)"
        histories = [stats.get(h) or [] for h in ("fwd_history", "adj_history")]
        if any(grew(h) for h in histories):        # MGRIT diverges at this layer step
            advice = ["  they diverged: MGRIT does not converge at this step network.T / N;",
                      f"  use more layers or mode=serial {counted}"]
        elif any(stagnated(h) for h in histories):  # flat: more iterations do not help
            advice = [*stalled, f"  {counted}"]
        else:
            advice = [f"  raise mgrit.max_iter {counted}"]
        for line in (f"iteration {k}: {short} MGRIT solve(s) stopped at mgrit.max_iter "
                     f"above tolerance",
                     f"  (residuals {stats['fwd_residual']:.1e} forward, "
                     f"{stats['adj_residual']:.1e} adjoint): the gradient is not exact;",
                     *advice):
            console.message(line)
    return short > 0
