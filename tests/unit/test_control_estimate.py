"""The one-shot controller's estimate against the true gradient error: a bound on it,
calibration against exact gradients, a far gradient taken again before a step, and the
exact modes' round-off."""
import math
import statistics

import pytest
import torch

from helpers import batch, dense_net, serial_objective_and_grad
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.options import MGRITOptions
from lptrain.train.control import FAR
from lptrain.train.objective import Objective
from lptrain.train.oneshot import SimultaneousOracle
from lptrain.train.oracles import Batch, SerialOracle


def test_a_calibrated_run_records_the_true_error_and_scales_its_estimate():
    """calibrate_every=1: every evaluation is compared with the exact gradient; the
    recorded true error is ‖g̃ − g‖/‖g‖ computed here, and the next estimate is the raw
    one times the largest recent true/raw ratio."""
    from lptrain.app import build
    from lptrain.config import compose
    from lptrain.metrics.console import Console
    from helpers import MemoryWriter
    from lptrain.train.calibrate import CalibratedOracle
    from lptrain.train.loop import train
    opts, _ = compose(["mode=simultaneous", "mgrit.calibrate_every=1", "train.iterations=6",
                       "network.T=10", "dataset.n_train=500", "mgrit.control=fixed"])
    ex, data, net, theta, oracle, opt = build(opts, None)
    assert isinstance(oracle, CalibratedOracle)
    exact, seen, rungs = Objective(SerialOracle(net, ex), net), [], oracle.oneshot.accuracy
    gradient = oracle.oracle.gradient

    def checked(ev):
        g = gradient(ev)
        exact.begin(ev.batch)
        true = exact.gradient(exact.value(ev.theta))
        seen.append((float((g - true).norm() / true.norm()), rungs._raw_error,
                     ev.tape.stats.error_scale))
        return g
    oracle.oracle.gradient = checked
    rows = MemoryWriter()
    train(theta, opt, oracle, data, opts, rows, Console(False, 1), ex)
    ratios = []
    for true, raw, scale in seen:      # every evaluation, the line search's first included
        assert true > 1e-8 and scale == pytest.approx(statistics.median(ratios[-4:])
                                                      if ratios else 1.0)
        ratios.append(true / raw)
    assert len(rows.mgrit) == 6
    for r in rows.mgrit:               # each accepted point: its own true error
        assert any(r["true_error"] == pytest.approx(t, rel=1e-12) and
                   r["grad_error"] == pytest.approx(raw * scale, rel=1e-12)
                   for t, raw, scale in seen)


# -- the estimate against the true error ---------------------------------------------------
@pytest.mark.parametrize("weights", ["inject", "average"])
@pytest.mark.parametrize("iters", [1, 2, 3])
def test_the_estimate_bounds_the_true_gradient_error(weights, iters):
    """Rough weights and a large step (h = 0.5): the estimate is above the true
    relative error of the one-shot gradient, by less than a factor 100."""
    torch.manual_seed(0)
    net, theta = dense_net(layers=16, width=4, T=8.0, scale=0.6, seed=3)
    x, y = batch(net, n=32)
    opts = MGRITOptions(levels=3, cfactor0=2, cfactor=2, fwd_iters=iters, adj_iters=iters,
                        coarse_weights=weights, control="fixed")
    oracle = Objective(SimultaneousOracle(net, SerialExchange(), opts), net)
    oracle.begin(Batch(x, y))
    ev = oracle.value(theta)
    g = oracle.gradient(ev)
    _, exact, _ = serial_objective_and_grad(net, theta, x, y)   # ∇J, penalties included
    true = float((g - exact).norm() / exact.norm())
    est = ev.tape.stats.fwd_error + ev.tape.stats.adj_error
    assert true < est < 100 * true


def test_a_gradient_far_from_the_target_is_taken_again_before_a_step():
    """A cold first evaluation (1 + 1 iterations, h = 0.5) had a true relative error of
    1.02 and the optimizer stepped with it (the plan grew for the next evaluation only):
    a step into the wrong direction that L-BFGS paths never made up for (1.16 x serial's
    objective on network.init_hidden=1.0). Now θ is evaluated again with the grown plan,
    the evaluation handle's point with it."""
    net, theta = dense_net(layers=16, width=4, T=8.0, scale=0.6, seed=3)
    x, y = batch(net, n=32)
    value, exact, _ = serial_objective_and_grad(net, theta, x, y)
    errors, records = {}, {}
    for control in ("fixed", "error"):
        opts = MGRITOptions(levels=3, cfactor0=2, cfactor=2, fwd_iters=1, adj_iters=1,
                            control=control, grad_tol=0.005)
        oracle = Objective(SimultaneousOracle(net, SerialExchange(), opts), net)
        oracle.begin(Batch(x, y))
        ev = oracle.value(theta)
        g = oracle.gradient(ev)
        oracle.accept(ev)
        errors[control] = float((g - exact).norm() / exact.norm())
        records[control] = oracle.record()
        point = ev.point.objective
    assert errors["fixed"] > 0.5 and errors["error"] < 1e-3, errors
    assert point == pytest.approx(value, rel=1e-4)            # the handle's point: refined
    assert records["fixed"]["refined"] == 0
    rec = records["error"]
    assert rec["refined"] == 1 and rec["grad_error"] < FAR * 0.005
    assert (rec["fwd_total"], rec["adj_total"]) == (1 + rec["fwd_iterations"],
                                                    1 + rec["adj_iterations"])   # both counted


def test_a_repeated_gradient_is_the_one_calibrated():
    """The first calibration fell on the evaluation that was then repeated: lost."""
    from lptrain.train.calibrate import CalibratedOracle
    net, theta = dense_net(layers=16, width=4, T=8.0, scale=0.6, seed=3)
    x, y = batch(net, n=32)
    opts = MGRITOptions(levels=3, cfactor0=2, cfactor=2, fwd_iters=1, adj_iters=1,
                        grad_tol=0.005, calibrate_every=5)
    terms = SimultaneousOracle(net, SerialExchange(), opts)
    oracle = CalibratedOracle(Objective(terms, net), terms,
                              Objective(SerialOracle(net, SerialExchange()), net))
    oracle.begin(Batch(x, y))
    ev = oracle.value(theta)
    g = oracle.gradient(ev)
    oracle.accept(ev)
    rec = oracle.record()
    _, exact, _ = serial_objective_and_grad(net, theta, x, y)
    assert rec["refined"] == 1
    assert rec["true_error"] == pytest.approx(float((g - exact).norm() / exact.norm()),
                                              rel=1e-6)
    assert terms.accuracy.controller.evaluations == 1


def test_a_repeat_whose_objective_overflows_gives_no_gradient():
    """More iterations can overflow where fewer did not: the repeat's point is not
    finite, and a finite gradient beside it would have been stepped with."""
    from types import SimpleNamespace

    from lptrain.train.protocol import Evaluated, Point

    class Terms:
        measures, calls = True, 0

        def value(self, theta):
            self.calls += 1
            j = 1.0 if self.calls == 1 else math.inf
            return Evaluated(Point(objective=j, loss=j, accuracy=0.0), theta)

        def gradient(self, ev):
            return torch.ones_like(ev.theta)

        def measure(self, ev):
            return None

        def observe(self, ev, m, norm):
            pass

        def refine(self):
            return self.calls == 1
    net = SimpleNamespace(regulariser=lambda theta, grad=None: 0.0)
    oracle = Objective(Terms(), net)
    ev = oracle.value(torch.zeros(3))
    g = oracle.gradient(ev)
    assert ev.point.objective == math.inf and torch.isnan(g).all()


def test_the_exact_modes_estimate_round_off():
    net, theta = dense_net(layers=16, width=4, T=8.0, scale=0.6, seed=3)
    x, y = batch(net, n=32)
    from lptrain.train.mgrit_oracle import MGRITOracle
    oracle = Objective(MGRITOracle(net, SerialExchange(),
                                   MGRITOptions(levels=3, cfactor0=2, cfactor=2)), net)
    oracle.begin(Batch(x, y))
    ev = oracle.value(theta)
    oracle.gradient(ev)
    assert ev.tape.stats.fwd_error + ev.tape.stats.adj_error < 1e-8
