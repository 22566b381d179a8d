"""Warm starts on every solver path: the exact solution is a fixed point of every
warm-started iteration, forward and adjoint, and a perturbed warm start converges."""
import functools

import pytest
import torch

from covering import params, product
from helpers import batch, dense_net
from lptrain.mgrit.exchange import SerialExchange
from lptrain.train.control import convergence_factor
from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.layer_parallel import LayerParallel

# the solver paths: 96 cases, 12 of them pairwise by default (tests/covering.py)
FACTORS = dict(levels=(2, 3, 4, 5), cycle=("V", "F"), skip_first_down=(True, False),
               relax=((0, 0), (0, 1), (1, 1)), coarse_weights=("inject", "average"))


def _opts(case):
    o = {k: v for k, v in case.items() if k != "relax"}
    return (dict(o, nrelax0=case["relax"][0], nrelax=case["relax"][1], cfactor0=2, cfactor=2,
                 min_coarse=1),)


def _id(c):
    return (f"L{c['levels']}{c['cycle']}-skip{int(c['skip_first_down'])}-"
            f"r{c['relax'][0]}{c['relax'][1]}-{c['coarse_weights']}")


PATHS = params(product(FACTORS), _opts, _id)


def exact(lp, theta, x, y):
    """Converged forward and adjoint solves: (states, adjoint states, gradient)."""
    res = lp.forward(theta, x, max_iter=80, tol=1e-14)
    ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
    grad, ares = lp.backward(theta, x, res.states, ev, max_iter=80, tol=1e-14)
    assert res.converged and ares.converged
    return res.states.clone(), ares.states.clone(), grad.clone()


def problem():
    """The network, θ, a batch, and copies of the exact (layer-serial) states, adjoint
    states and gradient at θ: every solver path's fixed point."""
    net, theta, x, y, (states, lam, grad) = _problem()
    return net, theta, x, y, states.clone(), lam.clone(), grad.clone()


@functools.cache
def _problem():
    net, theta = dense_net(layers=32, width=4, T=4.0, scale=0.6)
    x, y = batch(net, n=12)
    serial = LayerParallel(net, MGRITOptions(levels=1), SerialExchange())
    return net, theta, x, y, exact(serial, theta, x, y)


def warm_solves(lp, theta, x, y, fwd, adj, iters):
    """`iters` warm iterations forward from `fwd`, then adjoint from `adj`."""
    res = lp.forward(theta, x, warm=fwd, max_iter=iters, tol=0.0)
    ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
    grad, ares = lp.backward(theta, x, res.states, ev, warm=adj, max_iter=iters, tol=0.0)
    return res, ares, grad


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("opts", PATHS)
def test_the_exact_solution_is_a_fixed_point_of_warm_iterations(opts):
    net, theta, x, y, states, lam, grad = problem()
    lp = LayerParallel(net, MGRITOptions(**opts), SerialExchange())
    warm_solves(lp, 1.3 * theta, x, y, None, None, 2)   # the buffers: other states
    for iters in (1, 2):
        res, ares, g = warm_solves(lp, theta, x, y, states.clone(), lam.clone(), iters)
        assert _rel(res.states, states) <= 1e-12
        assert _rel(ares.states, lam) <= 1e-12
        assert _rel(g, grad) <= 1e-12


@pytest.mark.parametrize("opts", PATHS)
def test_perturbed_warm_starts_converge_at_the_measured_rate(opts):
    # ‖e_k‖/‖e_0‖ after k warm iterations (same θ, perturbed start) ≈ ρ^k (to a factor 10:
    # early iterations of F-relaxed coarse levels are slower; 9.3 with FCF-relaxation and
    # injection on 3 levels or more, 7.1 at most elsewhere), with ρ the
    # convergence factor metrics.h5 reports for a 6-iteration warm solve (geometric
    # mean of its residual ratios), forward and adjoint alike
    net, theta, x, y, states, lam, _ = problem()
    lp = LayerParallel(net, MGRITOptions(**opts), SerialExchange())
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
            assert rho ** k / 10 <= ratio <= 10 * rho ** k, (k, ratio, rho)
