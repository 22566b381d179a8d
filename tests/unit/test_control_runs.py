"""The runs the one-shot controller exists for: it keeps up with serial on large layer
steps, where L-BFGS amplifies errors and from a poor first gradient, and its plans follow
the target and the mini-batches."""
import pytest

from lptrain.train.objective import Objective
from lptrain.train.oracles import Batch, SerialOracle

from test_simultaneous import run_default


# -- the runs it exists for ----------------------------------------------------------------
def _exact_objective(extra):
    from lptrain.app import build
    from lptrain.config import compose
    from lptrain.metrics.console import Console
    from helpers import MemoryWriter
    from lptrain.train.loop import train
    opts, _ = compose(extra)
    ex, data, net, theta, oracle, opt = build(opts, None)
    rows = MemoryWriter()
    theta, _ = train(theta, opt, oracle, data, opts, rows, Console(False, 1), ex)
    exact = Objective(SerialOracle(net, ex), net)
    exact.begin(Batch(data.x_train, data.y_train))
    return exact.value(theta).point.objective, rows


LARGE_STEP = ["network.T=10", "dataset.n_train=1000", "train.iterations=100"]   # h = 0.31
AMPLIFIED = ["seed=9", "train.iterations=100"]       # default network; L-BFGS path


@pytest.mark.slow
def test_one_shot_keeps_up_with_serial_on_large_layer_steps():
    """h = 0.31: injected coarse weights and fixed 2 + 2 iterations ended 1.235 × serial's
    objective; now within 10 %, at most 12 MGRIT iterations per optimizer iteration."""
    serial, _ = _exact_objective(["mode=serial", *LARGE_STEP])
    simult, rows = _exact_objective(["mode=simultaneous", *LARGE_STEP])
    before, _ = _exact_objective(["mode=simultaneous", *LARGE_STEP,
                                  "mgrit.coarse_weights=inject", "mgrit.control=fixed"])
    assert simult <= 1.10 * serial
    assert before > 1.15 * serial            # the defect this guards against is there
    _check_controlled(rows, most=12)


@pytest.mark.slow
def test_one_shot_keeps_up_with_serial_where_lbfgs_amplifies_errors():
    """Default network, seed 9: fixed 2 + 2 iterations ended 1.2 × serial's objective
    (the L-BFGS path drifts); the controller keeps it within the quality bound."""
    serial, _ = _exact_objective(["mode=serial", *AMPLIFIED])
    simult, rows = _exact_objective(["mode=simultaneous", *AMPLIFIED])
    assert simult <= 1.15 * serial
    _check_controlled(rows, most=8)


LARGE_WEIGHTS = ["network.init_hidden=1.0", "train.iterations=100"]


@pytest.mark.slow
def test_one_shot_keeps_up_with_serial_from_a_poor_first_gradient(monkeypatch):
    """Large initial weights: the cold first gradient had a true error of 0.55 and the
    first L-BFGS step along it left the run at 1.16 x serial's objective after 100
    iterations; taken again with the grown plan, within 2 %."""
    serial, _ = _exact_objective(["mode=serial", *LARGE_WEIGHTS])
    simult, rows = _exact_objective(["mode=simultaneous", *LARGE_WEIGHTS])
    assert simult <= 1.05 * serial and rows.mgrit[0]["refined"] == 1
    import lptrain.train.oneshot as oneshot
    monkeypatch.setattr(oneshot, "refines", lambda *a: False)     # the code before
    before, _ = _exact_objective(["mode=simultaneous", *LARGE_WEIGHTS])
    assert before > 1.15 * serial             # the defect this guards against is there
    its = [r["fwd_iterations"] + r["adj_iterations"] for r in rows.mgrit]
    assert sum(its) / len(its) <= 12          # still one-shot: at the plans' cap


def _check_controlled(rows, most: int):
    its = [r["fwd_iterations"] + r["adj_iterations"] for r in rows.mgrit]
    assert sum(its) / len(its) <= most        # still one-shot
    errors = sorted(r["grad_error"] for r in rows.mgrit)
    assert errors[len(errors) // 2] <= 0.005  # the median estimate meets grad_tol


def test_a_tighter_target_plans_more_iterations():
    _, loose = run_default("simultaneous", ["train.iterations=15", "mgrit.grad_tol=1.0"])
    _, tight = run_default("simultaneous", ["train.iterations=15", "mgrit.grad_tol=1e-4"])
    mean = (lambda rows: sum(r["fwd_plan"] + r["adj_plan"] for r in rows.mgrit)
            / len(rows.mgrit))
    assert mean(loose) < 4 < mean(tight)
    assert all(r["fwd_plan"] >= 1 and r["adj_plan"] <= 6 for r in tight.mgrit)


def test_mini_batches_share_a_warm_plan_and_a_cold_plan():
    """5 batches: the first epoch's evaluations are cold, later ones warm-started an
    epoch back; within each class every evaluation runs what the one before planned,
    so the plan follows the error every step, not once an epoch."""
    _, rows = run_default("simultaneous", ["train.iterations=15", "optimizer=adam",
                                           "train.batch_size=1000", "mgrit.grad_tol=1e-3"])
    its = [(r["fwd_iterations"], r["adj_iterations"]) for r in rows.mgrit]
    plans = [(r["fwd_plan"], r["adj_plan"]) for r in rows.mgrit]
    for k in range(1, 15):
        if k != 5:                     # iteration 6 is the first warm one
            assert its[k] == plans[k - 1], k
    assert its[5] == (2, 2)            # the warm plan starts at fwd_iters / adj_iters
    assert len(set(its)) > 1           # the plans did move
