"""The one-shot controller's arithmetic: the gradient error formula, convergence factors,
the iterations it plans per batch, its calibration, and when an evaluation is taken again."""
import math

import pytest

from lptrain.mgrit.options import MGRITOptions
from lptrain.train.control import (ControlOptions, IterationController, Measured,
                                   convergence_factor, factor, gradient_error, next_iterations,
                                   refines)


def measured(r_u=1.0, u=10.0, r_l=1.0, lam=10.0, first=10.0, ratios=2):
    return Measured(fwd_first_sq=first ** 2, fwd_last_sq=r_u ** 2, fwd_state_sq=u ** 2,
                    fwd_ratios=ratios, adj_first_sq=first ** 2, adj_last_sq=r_l ** 2,
                    adj_state_sq=lam ** 2, adj_ratios=ratios)


# -- arithmetic -----------------------------------------------------------------------
def test_gradient_error_is_the_stated_formula():
    fwd, adj = gradient_error(measured(r_u=2.0, u=3.0, r_l=5.0, lam=7.0), T=4.0, n_c=8,
                              grad_norm=0.5)
    assert fwd == pytest.approx(4.0 * 2.0 * 7.0 / (8 * 0.5))
    assert adj == pytest.approx(4.0 * 5.0 * 3.0 / (8 * 0.5))
    assert gradient_error(measured(), 4.0, 0, 1.0) == (0.0, 0.0)       # one level: exact
    assert gradient_error(measured(), 4.0, 8, 0.0) == (math.inf, math.inf)


def test_factor_is_the_geometric_mean_and_clipped():
    assert factor(100.0, 1.0, 2) == pytest.approx(0.1 ** 0.5)   # (1/10)^(1/2)
    assert factor(1.0, 1.0, 1) == 0.9                      # stagnation: clipped to RHO_MAX
    assert factor(1.0, 1e-40, 1) == 0.01
    assert factor(1.0, 0.5, 0) == 0.9                       # nothing measured


@pytest.mark.parametrize("k, eps, rho, want", [
    (2, 1.0, 0.1, 4),      # 100× too large at ρ = 0.1: two more
    (2, 0.011, 0.1, 3),    # a little too large: one more
    (2, 0.0011, 0.1, 2),   # one fewer would miss (0.011 > 0.01): keep
    (2, 0.0009, 0.1, 1),   # one fewer still meets it: one fewer
    (1, 1e-9, 0.1, 1),     # never below lo
    (5, 1e9, 0.5, 6),      # never above hi
    (2, math.nan, 0.1, 6),  # no estimate: the most
    (2, 0.03, 0.5, 4),     # log(3)/log(2) = 1.58 more iterations: two, not one
])
def test_next_iterations(k, eps, rho, want):
    assert next_iterations(k, eps, rho, 0.01, 1, 6) == want


@pytest.mark.parametrize("last, want", [(None, 1), (0.05, 1), (1e-15, 2), (0.0, 2)])
def test_no_iteration_fewer_after_one_that_made_the_solve_exact(last, want):
    """A two-level hierarchy (N = 8, c = 4) is exact after 2 iterations: the estimate fell
    to 1e-16, one fewer was planned, then one fewer again, and the gradient errors went
    up to 99 % (the plan swung 3 2 1 2 1 3 ...). One fewer only where the residual before
    the last met the target (1e-16 / 1e-15 = 0.1 does not)."""
    assert next_iterations(2, 1e-16, 0.01, 0.01, 1, 6, last_ratio=last) == want


def test_one_fewer_is_judged_by_the_residual_before_the_last():
    """A warm solve whose last iteration was faster than its mean (residuals 0.19, 4.5e-2,
    4.0e-4, 5.7e-6: mean factor 0.032, last 0.014) met half of grad_tol = 0.005 with
    three iterations; ε/ρ said two would too, but two had given ε/0.014 = 3.2e-3 > 2.5e-3,
    and the next gradient (two iterations) was 8× above that prediction."""
    eps = 4.5e-5
    assert next_iterations(3, eps, 0.032, 2.5e-3, 1, 6) == 2            # ε/ρ = 1.4e-3
    assert next_iterations(3, eps, 0.032, 2.5e-3, 1, 6, last_ratio=0.014) == 3
    assert next_iterations(3, eps, 0.032, 2.5e-3, 1, 6, last_ratio=0.05) == 2   # 9e-4


def test_a_solve_exact_in_its_last_iteration_keeps_its_plan():
    c = IterationController(ControlOptions(fwd_iters=2, adj_iters=2, grad_tol=0.01))
    m = measured(r_u=1e-16, u=1.0, r_l=1e-16, lam=1.0, first=1.0, ratios=2)
    m.fwd_prev_sq = m.adj_prev_sq = 0.3 ** 2        # the residual before the last
    c.update(0, m, (1e-16, 1e-16))
    assert c.plan(0) == (2, 2)
    m.fwd_prev_sq = m.adj_prev_sq = 0.0              # nothing before the last: as ever
    c.update(0, m, (1e-16, 1e-16))
    assert c.plan(0) == (1, 1)


def test_a_two_level_hierarchy_that_solves_exactly_keeps_its_gradients_exact():
    """network.layers=8 (8/2): the estimate had reached 23 (true error 0.99)."""
    from lptrain.app import build
    from lptrain.config import compose
    from lptrain.metrics.console import Console
    from helpers import MemoryWriter
    from lptrain.train.loop import train
    opts, _ = compose(["mode=simultaneous", "network.layers=8", "train.iterations=15"])
    ex, data, net, theta, oracle, opt = build(opts, None)
    rows = MemoryWriter()
    train(theta, opt, oracle, data, opts, rows, Console(False, 1), ex)
    errors = [r["grad_error"] for r in rows.mgrit]
    assert max(errors) < opts.mgrit.grad_tol, errors


def test_plans_are_per_batch_and_survive_a_checkpoint():
    c = IterationController(ControlOptions(fwd_iters=2, adj_iters=2, grad_tol=0.02))
    assert c.plan(3) == (2, 2)
    m = measured(r_u=0.05, u=1.0, r_l=1e-6, lam=1.0, first=1.0, ratios=2)
    c.update(3, m, gradient_error(m, 5.0, 8, 1.0))
    assert c.plan(3) == (3, 1) and c.plan(4) == (2, 2)
    again = IterationController(ControlOptions())
    again.load_state_dict(c.state_dict())
    assert again.plan(3) == (3, 1)


def test_fixed_control_estimates_but_never_replans():
    c = IterationController(ControlOptions(control="fixed"))
    m = measured(r_u=1.0)
    eps = gradient_error(m, 5.0, 8, 1e-3)
    c.update(0, m, eps)
    assert eps[0] > 1 and c.plan(0) == (2, 2)


def test_calibration_scales_by_the_largest_recent_ratio_and_is_checkpointed():
    c = IterationController(ControlOptions(calibrate_every=3))
    due = []
    for k in range(1, 8):
        c.update(0, measured(), (0.1, 0.1))
        due.append(c.calibration_due())
    assert due == [True, False, False, True, False, False, True]   # evaluations 1, 4, 7
    assert c.scale == 1.0
    for true, raw in [(0.02, 1.0), (0.5, 10.0), (0.01, 1.0), (0.1, 0.0), (0.04, 2.0),
                      (0.03, 1.0)]:     # raw 0: nothing to calibrate against (ignored)
        c.calibrate(true, raw)
    assert c.scale == pytest.approx(0.025)            # median(0.05, 0.01, 0.02, 0.03)
    c.calibrate(0.001, 1.0)
    assert c.scale == pytest.approx(0.015)            # 0.05 dropped: the last four kept
    again = IterationController(ControlOptions(calibrate_every=3))
    again.load_state_dict(c.state_dict())
    assert again.scale == c.scale and again.evaluations == 7
    assert not IterationController(ControlOptions()).calibration_due()   # 0: off


def test_sums_over_data_groups_average_the_counts():
    a, b = measured(r_u=1.0, ratios=2), measured(r_u=2.0, ratios=2)
    m = Measured.from_sums([x + y for x, y in zip(a.as_list(), b.as_list())], 2.0)
    assert m.fwd_last_sq == 5.0 and m.fwd_ratios == 2


@pytest.mark.parametrize("eps, ran, planned, want", [
    ((0.03, 0.03), (2, 2), (4, 3), True),     # far above, the plan grew: taken again
    ((0.02, 0.02), (2, 2), (4, 3), False),    # above, not far: the next evaluation's plan
    ((0.03, 0.03), (6, 6), (6, 6), False),    # at control_max_iters: it stands
    ((math.inf, 0.0), (2, 2), (6, 6), True),  # no estimate (a zero gradient): the cap's
    ((0.0, 0.06), (2, 2), (2, 3), True),      # the far solve's plan grew
    # the adjoint is far off and at its cap; only the forward could grow: it stands
    # (mgrit.adaptive: repeats at fewer iterations than the first try had run)
    ((0.003, 0.5), (4, 6), (5, 6), False),
    ((0.06, 0.0), (7, 2), (5, 2), False)])    # ran 7 with adaptive extras, planned 5
def test_an_evaluation_is_taken_again_only_far_above_the_target_with_a_grown_plan(
        eps, ran, planned, want):
    assert refines(eps, 0.005, ran, planned) is want


def test_a_repeat_is_not_another_evaluation_and_a_shared_plan_only_grows_by_it():
    """Repeats counted as evaluations moved the calibrations (with calibrate_every even
    and every gradient repeated, none was ever due); a mini-batch cold plan re-planned
    from a repeat, warm from its own first try, shrank, and the next cold batch was
    repeated again (every cold evaluation done twice)."""
    c = IterationController(ControlOptions(fwd_iters=2, adj_iters=2, grad_tol=0.005,
                                           calibrate_every=2))
    far, met = measured(r_u=1.0, r_l=1.0), measured(r_u=1e-9, r_l=1e-9)
    c.update(-2, far, (1.0, 1.0))
    assert c.evaluations == 1 and c.calibration_due() and c.plan(-2) == (6, 6)
    c.update(-2, met, (1e-9, 1e-9), again=True, grow_only=True)
    assert c.evaluations == 1 and c.calibration_due() and c.plan(-2) == (6, 6)
    c.update(-2, met, (1e-9, 1e-9), again=True)       # a batch's own plan: as usual
    assert c.plan(-2) == (5, 5)


@pytest.mark.parametrize("mini_batches", [False, True])
def test_a_repeat_grows_the_plan_and_never_shrinks_it(mini_batches):
    """A repeat, warm from its own first try at the same θ, was nearly exact, and the
    plan shrank from it; the next evaluation (another θ) was far off and repeated again
    (network.T=40: iterations 1 to 4 in a row; uniform init_hidden=1.0: 30 repeats)."""
    from lptrain.train.oneshot import Rungs
    from lptrain.train.oracles import SolveStats
    rungs = Rungs(MGRITOptions(fwd_iters=2, adj_iters=2, grad_tol=0.005), mini_batches)
    rungs.begin(0, warm=False)
    rungs.observe(SolveStats(fwd_error=0.4, adj_error=0.4), measured(ratios=2), 1.0)
    assert rungs.refine() and rungs.controller.plan(rungs.plan_key) == (6, 6)
    rungs.observe(SolveStats(fwd_error=1e-9, adj_error=1e-9), measured(1e-9, r_l=1e-9,
                                                                        ratios=6), 1.0)
    assert not rungs.refine() and rungs.controller.plan(rungs.plan_key) == (6, 6)
    rungs.observe(SolveStats(fwd_error=1e-9, adj_error=1e-9), measured(1e-9, r_l=1e-9,
                                                                        ratios=6), 1.0)
    assert rungs.controller.plan(rungs.plan_key) == (5, 5)     # a new evaluation: as usual


def test_with_adaptive_extras_a_repeat_needs_more_than_any_group_can_have_run():
    """Data groups add their own adaptive extras; the summed record averages their
    iterations, so a group that ran 6 was compared as 4 and repeated at 5 or 6."""
    from lptrain.train.oneshot import Rungs
    from lptrain.train.oracles import SolveStats
    rungs = Rungs(MGRITOptions(fwd_iters=2, adj_iters=2, grad_tol=0.005, adaptive=True,
                               adaptive_max_extra=4), False)
    rungs.begin(0, warm=True)
    rungs.observe(SolveStats(fwd_error=0.03, adj_error=0.03), measured(ratios=4), 1.0)
    assert rungs.controller.plan(0) == (6, 6) and not rungs.refine()   # 6 <= 2 + 4


@pytest.mark.parametrize("residuals, factor", [
    ([1.0, 0.5, 0.25], 0.5), ([2.0, 1.0, 0.125], 0.25), ([1.0, 0.1], 0.1),
    ([1.0, 1.0], 1.0), ([1.0, 0.0], 0.0), ([3.0], math.nan), ([], math.nan),
    ([0.0, 0.0], math.nan)])
def test_convergence_factor_is_geometric_mean_of_ratios(residuals, factor):
    got = convergence_factor(residuals)
    assert (math.isnan(got) and math.isnan(factor)) or got == pytest.approx(factor)


def test_convergence_factor_of_uneven_ratios():
    # ratios 0.5 and 0.02: geometric mean sqrt(0.01) = 0.1
    assert convergence_factor([4.0, 2.0, 0.04]) == pytest.approx(0.1)


def test_each_share_of_the_estimate_is_held_below_half_the_target():
    """ε_u + ε_λ ≤ grad_tol: each share is planned against grad_tol / 2, so a forward
    share of 0.6·grad_tol (below grad_tol, above half of it) asks for more iterations."""
    c = IterationController(ControlOptions(fwd_iters=2, adj_iters=2, grad_tol=0.01))
    c.update(0, measured(first=1.0, r_u=0.25, r_l=0.25, ratios=2), (0.006, 0.0001))
    assert c.plan(0) == (3, 1)       # the adjoint share: one fewer still meets it


def test_each_rung_scales_the_forward_and_the_adjoint_plan_apart():
    """Rung 0 runs the plan (3 forward, 1 adjoint: different on purpose), rung r that
    times RUNG_FACTOR^r, the top rung mode=mgrit's limits and tolerances."""
    from lptrain.train.oneshot import Rungs
    rungs = Rungs(MGRITOptions(fwd_iters=3, adj_iters=1, max_iter=100, adj_max_iter=90,
                               tol=1e-9, adj_tol=1e-8))
    assert rungs.budget() == (3, 0.0, 1, 0.0)
    assert rungs.tighten() and rungs.budget() == (12, 0.0, 4, 0.0)
    while rungs.tighten():
        pass
    assert rungs.budget() == (100, 1e-9, 90, 1e-8)


def test_no_rung_runs_more_than_the_top_rung_may():
    """The top was counted from the first plan (2 × 4³ ≥ 50); once the plan had grown to
    6, rung 2 ran 96 fixed iterations and the top rung above it at most max_iter = 50.
    A rung whose scaled plan reaches both limits is the top one now, and a rung above
    0 is capped at the limits."""
    from lptrain.train.oneshot import Rungs
    from lptrain.train.oracles import SolveStats
    rungs = Rungs(MGRITOptions(fwd_iters=2, adj_iters=2, grad_tol=0.005, max_iter=50,
                               adj_max_iter=20, tol=1e-9, adj_tol=1e-8))
    rungs.observe(SolveStats(fwd_error=0.4, adj_error=0.4), measured(ratios=2), 1.0)
    assert rungs.controller.plan(0) == (6, 6)
    ladder = [rungs.budget()]
    while rungs.tighten():
        ladder.append(rungs.budget())
    assert ladder == [(6, 0.0, 6, 0.0), (24, 0.0, 20, 0.0), (50, 1e-9, 20, 1e-8)]
    assert not rungs.more([1.0], 1e-3, 0)          # the top solves to tolerance


def test_rung_0_runs_the_plan_whatever_the_limits():
    """mgrit.max_iter=4 with a plan grown to 6: rung 0 became the top rung (4 iterations
    to tolerance), so a far-off evaluation was never taken again and a failed line
    search could not climb (re-check, stop 68)."""
    from lptrain.train.oneshot import Rungs
    from lptrain.train.oracles import SolveStats
    rungs = Rungs(MGRITOptions(fwd_iters=2, adj_iters=2, grad_tol=0.005, max_iter=4,
                               tol=1e-9, adj_tol=1e-8))
    rungs.observe(SolveStats(fwd_error=0.4, adj_error=0.4), measured(ratios=2), 1.0)
    assert rungs.refine() and rungs.controller.plan(0) == (6, 6)
    assert rungs.budget() == (6, 0.0, 6, 0.0)
    assert rungs.tighten() and rungs.budget() == (4, 1e-9, 4, 1e-8) and not rungs.tighten()
