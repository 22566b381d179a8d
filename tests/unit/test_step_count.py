"""The steps a fixed-iteration solve takes: what the fused operations leave out
(`Fusions.skip_zero`) is left out, and the iterates stay the same."""
import pytest
import torch

from helpers import Counting, batch, dense_net
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
    solve = lp.adj.solve

    def counted(prop, *args, **kw):
        counts["adj"] = c = Counting(prop)
        return solve(c, *args, **kw)
    lp.adj.solve = counted
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
