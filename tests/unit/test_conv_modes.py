"""Convolutional networks through the training oracles: MGRIT to tolerance equals serial.

The oracles are what the optimizers see (`begin`, `value`, `gradient`, `accept`), so these
tests cover the conv opening, the conv steps under MGRIT and the classifier on image
states together, for both openings (`replicate`: no weights, `conv`: a 3×3 convolution).
"""
from __future__ import annotations

import pytest
import torch

from helpers import batch, conv_net, dense_net
from lptrain.config.schema import LBFGSOptions
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.options import MGRITOptions
from lptrain.train.objective import Objective
from lptrain.train.optimizers import LBFGS
from lptrain.data.base import chunks
from lptrain.train.mgrit_oracle import MGRITOracle
from lptrain.train.oracles import Batch, SerialOracle

OPENINGS = ["replicate", "conv"]
# N = 12 with c = 2 gives three levels (12 → 6 → 3 steps); V- and F-cycles, FCF on level 0
SOLVERS = {
    "V3": dict(levels=3, cfactor0=2, cfactor=2, nrelax0=0, nrelax=1),
    "F3-fcf": dict(levels=3, cfactor0=2, cfactor=2, nrelax0=1, nrelax=1, cycle="F"),
}
TOL = 1e-12
GRAD_RTOL = 1e-8


@pytest.fixture(autouse=True)
def _one_thread():
    # tensors of a few hundred numbers: a thread pool only adds waiting, a lot of it when
    # other jobs share the cores
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _problem(opening: str, bias: str = "vector"):
    # T = 2 over 12 layers: h = 1/6, strong enough coupling that MGRIT needs several
    # iterations; γ_ddt couples neighbouring layers so the regulariser gradient is non-trivial
    net, theta = conv_net(layers=12, channels=3, T=2.0, opening=opening, bias=bias,
                          scale=0.4, seed=7, gamma_ddt=1e-3)
    x, y = batch(net, n=6, seed=2)
    return net, theta, x, y


def _mgrit_oracle(net, solver: str) -> MGRITOracle:
    opts = MGRITOptions(tol=TOL, max_iter=60, **SOLVERS[solver])
    return Objective(MGRITOracle(net, SerialExchange(), opts), net)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("solver", list(SOLVERS))
@pytest.mark.parametrize("bias", ["vector", "scalar"])
@pytest.mark.parametrize("opening", OPENINGS)
def test_mgrit_oracle_gradient_equals_serial(opening, bias, solver):
    net, theta, x, y = _problem(opening, bias)
    serial = Objective(SerialOracle(net, SerialExchange()), net)
    serial.begin(Batch(x, y))
    ref_ev = serial.value(theta)
    ref, ref_point = serial.gradient(ref_ev), ref_ev.point

    mgrit = _mgrit_oracle(net, solver)
    mgrit.begin(Batch(x, y))
    ev = mgrit.value(theta)
    grad, point = mgrit.gradient(ev), ev.point

    # the comparison is not vacuous: a real hierarchy, iterated, converged, non-zero
    fwd, adj = ev.tape.tape.fwd, ev.tape.tape.adj
    assert mgrit.terms.lp.n_levels == 3
    assert fwd.iterations > 1 and adj.iterations > 1
    assert fwd.converged and adj.converged
    assert fwd.history[-1] <= TOL and adj.history[-1] <= TOL
    assert float(ref.norm()) > 1e-3
    assert point.objective == pytest.approx(ref_point.objective, rel=1e-12, abs=0)
    assert point.accuracy == ref_point.accuracy
    assert _rel(grad, ref) <= GRAD_RTOL
    # every parameter block agrees, the opening's included when it has weights
    gv, rv = net.layout.views(grad), net.layout.views(ref)
    assert ("open_K" in net.layout) == (opening == "conv")
    for name in net.layout.blocks:
        assert float((gv[name] - rv[name]).norm()) <= GRAD_RTOL * float(ref.norm()), name


@pytest.mark.parametrize("opening", OPENINGS)
def test_mgrit_oracle_matches_serial_over_lbfgs_steps(opening):
    # warm starts between optimizer iterations must not change the trajectory
    net, theta0, x, y = _problem(opening)
    objectives = {}
    for name, oracle in (("serial", Objective(SerialOracle(net, SerialExchange()), net)),
                         ("mgrit", _mgrit_oracle(net, "V3"))):
        opt, theta, history = LBFGS(LBFGSOptions(memory=5)), theta0.clone(), []
        for _ in range(4):
            oracle.begin(Batch(x, y))
            theta, info = opt.step(theta, oracle)
            history.append(info.objective)
        objectives[name] = torch.tensor(history, dtype=torch.float64)
    assert objectives["serial"][-1] < objectives["serial"][0]   # it trains
    torch.testing.assert_close(objectives["mgrit"], objectives["serial"], rtol=1e-9, atol=0)


@pytest.mark.parametrize("mode", ["serial", "mgrit"])
@pytest.mark.parametrize("make", ["conv", "dense"])
def test_validation_in_chunks_equals_one_pass(mode, make):
    """Validation goes through the network `chunk` samples at a time (memory of a training
    batch); the mean loss and the accuracy are those of one pass over every sample."""
    if make == "conv":
        net, theta, x, y = _problem("conv")
    else:
        net, theta = dense_net(layers=12, T=2.0, seed=3)
        x, y = batch(net, n=11, seed=4)
    oracle = SerialOracle(net, SerialExchange()) if mode == "serial" else \
        _mgrit_oracle(net, "V3")
    whole = oracle.validate(theta, x, y)
    assert chunks(x.shape[0], 4) != chunks(x.shape[0], None)
    for chunk in (1, 4, x.shape[0], 100):
        loss, acc = oracle.validate(theta, x, y, chunk)
        assert loss == pytest.approx(whole[0], rel=1e-13, abs=0)
        assert acc == whole[1]


@pytest.mark.parametrize("make", ["conv", "dense"])
def test_mgrit_validation_is_the_converged_solve_s_loss(make):
    """The MGRIT modes validate by serial sweeps: their loss and accuracy are those of a
    forward solve converged to tolerance at the same θ."""
    if make == "conv":
        net, theta, x, y = _problem("conv")
    else:
        net, theta = dense_net(layers=12, T=2.0, seed=3)
        x, y = batch(net, n=11, seed=4)
    oracle = _mgrit_oracle(net, "V3")
    oracle.begin(Batch(x, y))
    point = oracle.value(theta).point
    loss, acc = oracle.validate(theta, x, y, 4)
    assert loss == pytest.approx(point.loss, rel=1e-10, abs=0)
    assert acc == point.accuracy


def test_chunks_cover_every_sample_once():
    assert chunks(7, 3) == [slice(0, 3), slice(3, 6), slice(6, 7)]
    assert chunks(6, None) == [slice(0, 6)] and chunks(0, 5) == []
    with pytest.raises(ValueError, match="chunk size 0"):
        chunks(4, 0)
