"""A warm solve's first cycle without the coarse down-relaxation (`mgrit.warm_down=false`):
still sound — the exact solution is a fixed point and perturbed starts converge —
the same iterates with the reference and the fused level operations, and the steps it
leaves out are the coarse relaxations."""
import itertools

import pytest
import torch

from helpers import batch, count_solves, dense_net
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.layer_parallel import LayerParallel

PATHS = [dict(levels=lv, cycle=cyc, nrelax0=nr0, nrelax=nr, coarse_weights=cw, cfactor0=2,
              cfactor=2, min_coarse=1)
         for lv, cyc, (nr0, nr), cw in itertools.product(
             (3, 4), ("V", "F"), ((0, 1), (1, 1)), ("inject", "average"))]


def _light(net, warm_down: bool = False, **opts) -> LayerParallel:
    """A LayerParallel with mgrit.warm_down as given (the variant: False)."""
    lp = LayerParallel(net, MGRITOptions(warm_down=warm_down, **opts), SerialExchange())
    assert lp.fwd.options.warm_down is lp.adj.options.warm_down is warm_down
    return lp


def _solves(lp, theta, x, y, fwd, adj, iters):
    res = lp.forward(theta, x, warm=fwd, max_iter=iters, tol=0.0)
    ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
    grad, ares = lp.backward(theta, x, res.states, ev, warm=adj, max_iter=iters, tol=0.0)
    return res.states.clone(), ares.states.clone(), grad.clone()


def _exact(lp, theta, x, y):
    res = lp.forward(theta, x, max_iter=80, tol=1e-14)
    ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
    grad, ares = lp.backward(theta, x, res.states, ev, max_iter=80, tol=1e-14)
    return res.states.clone(), ares.states.clone(), grad.clone()


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("opts", PATHS)
def test_the_exact_solution_stays_and_perturbed_starts_converge(opts):
    net, theta = dense_net(layers=32, width=4, T=4.0, scale=0.6)
    x, y = batch(net, n=12)
    lp = _light(net, **opts)
    exact = _exact(lp, theta, x, y)
    _exact(lp, 1.3 * theta, x, y)          # the buffers hold another solution
    for iters in (1, 2):
        for got, ref in zip(_solves(lp, theta, x, y, exact[0].clone(), exact[1].clone(),
                                    iters), exact):
            assert _rel(got, ref) <= 1e-12
    noise = torch.randn(exact[0].shape, generator=torch.Generator().manual_seed(3),
                        dtype=torch.float64)
    fwd0 = exact[0] + 1e-3 * noise
    adj0 = exact[1] + 1e-3 * float(exact[1].abs().max()) * noise
    errors = []
    for iters in (1, 2, 4):
        u, lam, _ = _solves(lp, theta, x, y, fwd0.clone(), adj0.clone(), iters)
        errors.append((_rel(u, exact[0]) / _rel(fwd0, exact[0]),
                       _rel(lam, exact[1]) / _rel(adj0, exact[1])))
    for before, after in zip(errors, errors[1:]):
        assert after[0] < before[0] and after[1] < before[1]
    assert errors[-1][0] < 0.1 and errors[-1][1] < 0.1


@pytest.mark.parametrize("opts", PATHS[::5])
def test_reference_and_fused_operations_agree(opts):
    net, theta = dense_net(layers=29, T=3.0, activation="tanh")
    x, y = batch(net)
    out = []
    for ops in ("plain", "fused"):
        lp = _light(net, level_ops=ops, **opts)
        start = _solves(lp, theta, x, y, None, None, 1)
        out.append(_solves(lp, 1.1 * theta, x, y, start[0], start[1], 2))
    for a, b in zip(*out):
        assert _rel(a, b) <= 1e-12


def test_only_the_coarse_down_relaxation_is_left_out():
    # N = 64, 3 levels, cf 4, FCF on level 1 (17 points: C-points 0, 4, .., 16, 12
    # F-points): a warm 2-iteration solve leaves out one FCF on level 1, 8 + 4 + 12 steps
    # of 4 layers (the first F-relaxation takes no step from its 4 C-points anyway: the
    # forward's reuses the restriction's Φ^Δ, the adjoint's starts from zero)
    net, theta = dense_net(layers=64, T=3.0, activation="tanh")
    x, y = batch(net)
    steps = []
    for warm_down in (True, False):
        lp = _light(net, warm_down, levels=3)
        counts = {}
        for name, solver in (("fwd", lp.fwd), ("adj", lp.adj)):
            count_solves(solver, counts, name)
        start = _solves(lp, theta, x, y, None, None, 1)
        _solves(lp, 1.1 * theta, x, y, start[0], start[1], 2)
        steps.append({k: c.steps for k, c in counts.items()})
    full, light = steps
    assert full["fwd"][4] - light["fwd"][4] == 24
    assert full["adj"][4] - light["adj"][4] == 24
    for kind in ("fwd", "adj"):
        assert full[kind][1] == light[kind][1] and full[kind][16] == light[kind][16]
