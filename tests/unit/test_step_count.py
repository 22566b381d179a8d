"""The steps a fixed-iteration solve takes: what the fused operations leave out
(`Fusions.skip_zero`) is left out, and the iterates stay the same."""
import pytest
import torch

from helpers import batch, count_solves, dense_net
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.fused import Fusions
from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.layer_parallel import LayerParallel


def _adjoint(skip_zero: bool, iters: int):
    """A warm forward + adjoint evaluation of a 3-level, cf-4 hierarchy (N = 64):
    the adjoint's states, gradient and counted steps."""
    net, theta = dense_net(layers=64, T=3.0, activation="tanh")
    x, y = batch(net)
    lp = LayerParallel(net, MGRITOptions(levels=3), SerialExchange())
    lp.adj.ops.fusions = Fusions(skip_zero=skip_zero)
    counts = {}
    count_solves(lp.adj, counts, "adj")
    warm = None
    for scale in (1.0, 1.1):          # the second evaluation warm-starts from the first
        res = lp.forward(scale * theta, x, max_iter=2, tol=0.0)
        ev = lp.evaluate(scale * theta, res.states, y, x.shape[0], True)
        grad, ares = lp.backward(scale * theta, x, res.states, ev, warm=warm,
                                 max_iter=iters, tol=0.0)
        warm = ares.states.clone()
    return warm, grad.clone(), counts["adj"].steps


@pytest.mark.parametrize("iters", [1, 2])
def test_a_linear_coarse_level_takes_no_step_from_its_zero_start(iters):
    lam, grad, steps = _adjoint(True, iters)
    lam_ref, grad_ref, steps_ref = _adjoint(False, iters)
    assert torch.equal(lam, lam_ref) and torch.equal(grad, grad_ref)   # Φ(0) + g = g exactly
    # level 1 (steps of 4 layers) has 64/16 = 4 C-points, each the start of an interval
    assert steps_ref[4] - steps[4] == 4 * iters
    assert steps[1] == steps_ref[1] and steps[16] == steps_ref[16]


def _forward(reuse_phi: bool, layers: int, levels: int, iters: int):
    """A cold and a warm forward solve of a cf-4 hierarchy: the warm solve's states
    and counted steps."""
    net, theta = dense_net(layers=layers, T=3.0, activation="tanh")
    x, _ = batch(net)
    lp = LayerParallel(net, MGRITOptions(levels=levels), SerialExchange())
    lp.fwd.ops.fusions = Fusions(reuse_phi=reuse_phi)
    start = lp.forward(theta, x, max_iter=2, tol=0.0).states.clone()
    counts = {}
    count_solves(lp.fwd, counts, "fwd")
    res = lp.forward(1.1 * theta, x, warm=start, max_iter=iters, tol=0.0)
    return res.states.clone(), counts["fwd"].steps


# N = 64, 3 levels: level 1 has 17 points, 4 intervals; N = 128, 4 levels: level 1
# 33 points, 8 intervals, level 2 (steps of 16 layers) 9 points, 2 intervals
@pytest.mark.parametrize("layers, levels, once, per_cycle",
                         [(64, 3, {4: 4, 16: 0}, {4: 0, 16: 0}),
                          (128, 4, {4: 8, 16: 0}, {4: 0, 16: 2})])
@pytest.mark.parametrize("iters", [1, 2])
def test_a_restriction_hands_its_coarse_steps_to_the_next_f_relaxation(
        layers, levels, once, per_cycle, iters):
    # the first F-relaxation of a FAS level after a full restriction repeats the steps
    # from its C-points that the restriction took for the rhs; reuse_phi keeps those
    # values.  Level 1 is restricted in full once per warm solve (later restrictions
    # update its rhs), level 2 of 4 levels in every cycle.
    states, steps = _forward(True, layers, levels, iters)
    ref, steps_ref = _forward(False, layers, levels, iters)
    assert torch.equal(states, ref)
    for length in (4, 16):
        assert steps_ref.get(length, 0) - steps.get(length, 0) == \
            once[length] + iters * per_cycle[length]
    assert steps[1] == steps_ref[1]


def _cycle_steps(cycle: str, iters: int = 2) -> dict:
    """The counted steps of a warm 4-level forward solve (N = 128, cf 4) per step length."""
    net, theta = dense_net(layers=128, T=3.0, activation="tanh")
    x, _ = batch(net)
    lp = LayerParallel(net, MGRITOptions(levels=4, cycle=cycle), SerialExchange())
    start = lp.forward(theta, x, max_iter=2, tol=0.0).states.clone()
    counts = {}
    count_solves(lp.fwd, counts, "fwd")
    lp.forward(1.1 * theta, x, warm=start, max_iter=iters, tol=0.0)
    return counts["fwd"].steps


def test_an_f_cycle_visits_each_coarse_level_again_on_its_way_up():
    """From level 1 an F-cycle runs an F-cycle on level 2 and then a V-cycle on it: the
    coarsest level (steps of 64 layers) is solved twice per cycle, once in a V-cycle;
    the finest level's work is the same."""
    v, f = _cycle_steps("V"), _cycle_steps("F")
    assert f[64] == 2 * v[64] and f[1] == v[1]
    assert f[16] > v[16]
