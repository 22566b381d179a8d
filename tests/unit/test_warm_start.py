"""Warm starts on every solver path: the exact solution is a fixed point of every
warm-started iteration, forward and adjoint, and a perturbed warm start converges."""
import itertools

import pytest
import torch

from helpers import batch, dense_net
from lptrain.mgrit.exchange import SerialExchange
from lptrain.train.control import convergence_factor
from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.layer_parallel import LayerParallel

PATHS = [dict(levels=lv, cycle=cyc, skip_first_down=skip, nrelax0=nr0, nrelax=nr,
              coarse_weights=cw, cfactor0=2, cfactor=2, min_coarse=1)
         for lv, cyc, skip, (nr0, nr), cw in itertools.product(
             (2, 3, 4, 5), ("V", "F"), (True, False), ((0, 0), (0, 1), (1, 1)),
             ("inject", "average"))]


def _id(o):
    return (f"L{o['levels']}{o['cycle']}-skip{int(o['skip_first_down'])}-"
            f"r{o['nrelax0']}{o['nrelax']}-{o['coarse_weights']}")


def exact(lp, theta, x, y):
    """Converged forward and adjoint solves: (states, adjoint states, gradient)."""
    res = lp.forward(theta, x, max_iter=80, tol=1e-14)
    ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
    grad, ares = lp.backward(theta, x, res.states, ev, max_iter=80, tol=1e-14)
    assert res.converged and ares.converged
    return res.states.clone(), ares.states.clone(), grad.clone()


def warm_solves(lp, theta, x, y, fwd, adj, iters):
    """`iters` warm iterations forward from `fwd`, then adjoint from `adj`."""
    res = lp.forward(theta, x, warm=fwd, max_iter=iters, tol=0.0)
    ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
    grad, ares = lp.backward(theta, x, res.states, ev, warm=adj, max_iter=iters, tol=0.0)
    return res, ares, grad


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("opts", PATHS, ids=_id)
def test_the_exact_solution_is_a_fixed_point_of_warm_iterations(opts):
    net, theta = dense_net(layers=32, width=4, T=4.0, scale=0.6)
    x, y = batch(net, n=12)
    lp = LayerParallel(net, MGRITOptions(**opts), SerialExchange())
    states, lam, grad = exact(lp, theta, x, y)
    exact(lp, 1.3 * theta, x, y)     # the solvers' buffers now hold another solution
    for iters in (1, 2):
        res, ares, g = warm_solves(lp, theta, x, y, states.clone(), lam.clone(), iters)
        assert _rel(res.states, states) <= 1e-12
        assert _rel(ares.states, lam) <= 1e-12
        assert _rel(g, grad) <= 1e-12


@pytest.mark.parametrize("opts", PATHS[::3], ids=_id)
def test_perturbed_warm_starts_converge_at_the_measured_rate(opts):
    # ‖e_k‖/‖e_0‖ after k warm iterations (same θ, perturbed start) ≈ ρ^k (to a factor 8:
    # early iterations of F-relaxed coarse levels are slower), with ρ the
    # convergence factor metrics.h5 reports for a 6-iteration warm solve (geometric
    # mean of its residual ratios), forward and adjoint alike
    net, theta = dense_net(layers=32, width=4, T=4.0, scale=0.6)
    x, y = batch(net, n=12)
    lp = LayerParallel(net, MGRITOptions(**opts), SerialExchange())
    states, lam, _ = exact(lp, theta, x, y)
    gen = torch.Generator().manual_seed(3)
    noise = torch.randn(states.shape, generator=gen, dtype=torch.float64)
    fwd0, adj0 = states + 1e-3 * noise, lam + 1e-3 * float(lam.abs().max()) * noise
    res, ares, _ = warm_solves(lp, theta, x, y, fwd0.clone(), adj0.clone(), 6)
    rho_f, rho_a = convergence_factor(res.history), convergence_factor(ares.history)
    assert rho_f < 0.5 and rho_a < 0.5
    for k in (1, 2, 4):
        res, ares, _ = warm_solves(lp, theta, x, y, fwd0.clone(), adj0.clone(), k)
        for got, ref, start, rho in ((res.states, states, fwd0, rho_f),
                                     (ares.states, lam, adj0, rho_a)):
            ratio = float((got - ref).norm() / (start - ref).norm())
            assert rho ** k / 8 <= ratio <= 8 * rho ** k, (k, ratio, rho)
