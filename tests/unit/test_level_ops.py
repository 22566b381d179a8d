"""The fused level operations against the reference ones (mgrit/levels.py, fused.py):
the same iterates, residual histories and gradients on every solver path."""
import pytest

from covering import params, product
from helpers import batch, dense_net, serial_objective_and_grad
from lptrain.errors import ConfigError
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.fused import FusedLevelOps
from lptrain.mgrit.levels import LevelOps
from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.layer_parallel import LayerParallel

# the solver paths x cold/warm: 288 cases, 10 of them pairwise by default (tests/covering.py)
FACTORS = dict(levels=(2, 3, 4), cycle=("V", "F"), skip_first_down=(True, False),
               relax=((0, 0), (0, 1), (1, 1)), coarse_weights=("inject", "average"),
               cfactor0=(2, 3), warm=(False, True))


def _opts(case):
    o = {k: v for k, v in case.items() if k not in ("relax", "warm")}
    return dict(o, nrelax0=case["relax"][0], nrelax=case["relax"][1], cfactor=2, min_coarse=1)


def _id(c):
    return (f"{c['warm']}-L{c['levels']}{c['cycle']}-skip{int(c['skip_first_down'])}-"
            f"r{c['relax'][0]}{c['relax'][1]}-{c['coarse_weights']}-c{c['cfactor0']}")


PATHS = params(product(FACTORS), lambda c: (_opts(c), c["warm"]), _id)


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


def iterates(level_ops, opts, net, theta, x, y, warm):
    """Fixed-iteration forward and adjoint solves (warm: from one iteration at θ, the
    solves at 1.1 θ), then 2 more forward iterations in place (`resume`)."""
    lp = LayerParallel(net, MGRITOptions(level_ops=level_ops, **opts), SerialExchange())
    start = lp.forward(theta, x, max_iter=1, tol=0.0).states.clone() if warm else None
    res = lp.forward(1.1 * theta, x, warm=start, max_iter=3, tol=0.0)
    states, history = res.states.clone(), res.history
    ev = lp.evaluate(1.1 * theta, res.states, y, x.shape[0], True)
    grad, ares = lp.backward(1.1 * theta, x, res.states, ev, max_iter=2, tol=0.0)
    more = lp.fwd.resume(2)
    return states, history, grad.clone(), ares.history, more.states.clone(), more.history


@pytest.mark.parametrize("opts, warm", PATHS)
def test_fused_operations_give_the_reference_iterates(opts, warm):
    # N = 29: a short last interval on every level; tanh, so the states move a lot
    net, theta = dense_net(layers=29, T=3.0, activation="tanh")
    x, y = batch(net)
    ref = iterates("plain", opts, net, theta, x, y, warm)
    got = iterates("fused", opts, net, theta, x, y, warm)
    for a, b in ((got[0], ref[0]), (got[2], ref[2]), (got[4], ref[4])):
        assert _rel(a, b) <= 1e-12
    for a, b in ((got[1], ref[1]), (got[3], ref[3]), (got[5], ref[5])):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-14)


def test_the_reference_converges_to_serial_propagation():
    net, theta = dense_net(layers=24, T=3.0, activation="smoothrelu", gamma_ddt=1e-3)
    x, y = batch(net)
    _, ref, states = serial_objective_and_grad(net, theta, x, y)
    lp = LayerParallel(net, MGRITOptions(levels=3, cfactor0=2, cfactor=2, tol=1e-12,
                                         max_iter=60, level_ops="plain"), SerialExchange())
    assert isinstance(lp.fwd.ops, LevelOps) and not isinstance(lp.fwd.ops, FusedLevelOps)
    res = lp.forward(theta, x)
    ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
    grad, ares = lp.backward(theta, x, res.states, ev)
    net.regulariser(theta, grad)
    assert res.converged and ares.converged and res.iterations > 2
    assert _rel(res.states, states) <= 1e-10 and _rel(grad, ref) <= 1e-8


def test_every_operation_is_timed_by_level():
    net, theta = dense_net(layers=16)
    x, _ = batch(net)
    for level_ops in ("plain", "fused"):
        lp = LayerParallel(net, MGRITOptions(levels=3, cfactor0=2, cfactor=2,
                                             level_ops=level_ops), SerialExchange())
        lp.forward(theta, x, max_iter=2, tol=0.0)
        kinds = {key for key, seconds in lp.fwd.timers.items() if seconds > 0}
        assert {(0, "relax"), (0, "residual"), (1, "relax"), (2, "coarse")} <= kinds


def test_unknown_solver_choices_are_refused_by_name():
    # the solver's registry names the choices; the options check them, once
    with pytest.raises(ConfigError, match=r"^mgrit.level_ops='fast': choose one of fused, plain$"):
        MGRITOptions(level_ops="fast")
    with pytest.raises(ConfigError, match=r"^mgrit.cycle='W': choose one of V, F$"):
        MGRITOptions(cycle="W")
