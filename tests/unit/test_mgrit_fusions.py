"""MGRIT's fused devices (mgrit/fused.py) on one rank: each, switched on, gives the states,
residuals and gradients of the plain solve."""
import pytest
import torch

from helpers import MGRIT_CONFIGS, batch, conv_net, dense_net
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.fused import Fusions
from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.layer_parallel import LayerParallel


def off_and_on(opts, option, warm, layers=29, iters=3, adjoint=False, prepare=None):
    """Solves with a fused device (`Fusions`) off, then on, from the same start: per run
    (states, history, gradient, adjoint history, LayerParallel); a warm start is one
    iteration at θ, the solve itself at 1.1 θ; `prepare(lp)` runs before the solves."""
    net, theta = dense_net(layers=layers, T=3.0, activation="tanh")
    x, y = batch(net)
    runs = []
    for value in (False, True):
        lp = LayerParallel(net, MGRITOptions(**opts), SerialExchange())
        for solver in (lp.fwd, lp.adj):
            solver.ops.fusions = Fusions(**{option: value})
        if prepare:
            prepare(lp)
        start = lp.forward(theta, x, max_iter=1, tol=0.0).states.clone() if warm else None
        res = lp.forward(theta * 1.1, x, warm=start, max_iter=iters, tol=0.0)
        grad = ahist = None
        if adjoint:
            ev = lp.evaluate(theta * 1.1, res.states, y, x.shape[0], True)
            grad, ares = lp.backward(theta * 1.1, x, res.states, ev, max_iter=2, tol=0.0)
            grad, ahist = grad.clone(), ares.history
        runs.append((res.states.clone(), res.history, grad, ahist, lp))
    return runs


@pytest.mark.parametrize("opts", [MGRIT_CONFIGS[0], MGRIT_CONFIGS[2],
                                  dict(levels=3, cfactor0=4, cfactor=4),
                                  dict(levels=3, cfactor0=3, cfactor=2, nrelax=2)],
                         ids=lambda o: "-".join(f"{v}" for v in o.values()))
@pytest.mark.parametrize("warm", [False, True])
def test_reused_coarse_rhs_equals_a_fresh_fas_restriction(opts, warm):
    # after a full cycle g_j ← g_j + r_j at the coarse F-points (FusedLevelOps._rhs_update): the
    # same iterates as injecting and stepping Φ^Δ everywhere, up to rounding
    (a, ha, *_), (b, hb, *_) = off_and_on(opts, "reuse_rhs", warm, iters=4)
    assert float((a - b).abs().max()) <= 1e-13 and float((a - b).abs().max()) > 0.0
    assert ha == pytest.approx(hb, rel=1e-10)


@pytest.mark.parametrize("opts", MGRIT_CONFIGS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
@pytest.mark.parametrize("N", [32, 29])
@pytest.mark.parametrize("warm", [False, True])
def test_coarse_states_in_the_fine_c_points_equal_own_buffers(opts, N, warm):
    # FAS coarse levels working in place in the finer C-points (no injection or
    # correction copies): bitwise the iterates of coarse levels with their own buffers;
    # a short last interval (N = 29, or c = 3) keeps level 1 in its own buffer
    (a, ha, *_, la), (b, hb, *_, lb) = off_and_on(opts, "share_coarse", warm, layers=N)
    assert torch.equal(a, b) and ha == hb
    assert not any(la.fwd.ops.shared) and lb.fwd.ops.shared[1] == (N % opts["cfactor0"] == 0)
    assert not lb.adj.ops.can_share(1)   # the linear adjoint's coarse levels hold corrections


@pytest.mark.parametrize("opts", MGRIT_CONFIGS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
@pytest.mark.parametrize("warm", [False, True])
def test_residual_taken_by_the_f_relaxation_equals_a_separate_pass(opts, warm):
    # the F-relaxation before a residual (restriction or the returned states') feeds it
    # each chunk's C-steps while their inputs are in cache: the same states bitwise, the
    # norms up to the order of their sums; forward and adjoint alike
    fed = {False: [], True: []}

    def spy(lp):
        for solver in (lp.fwd, lp.adj):
            def f_relax(lv, consumer, last, _orig=solver.ops._f_relax,
                        _log=fed[solver.ops.fusions.fuse_residual]):
                _log.append(consumer is not None)
                return _orig(lv, consumer, last)
            solver.ops._f_relax = f_relax
    (a, ha, ga, aa, _), (b, hb, gb, ab, _) = off_and_on(opts, "fuse_residual", warm,
                                                        adjoint=True, prepare=spy)
    assert not any(fed[False]) and any(fed[True])
    assert torch.equal(a, b) and torch.equal(ga, gb)
    assert ha == pytest.approx(hb, rel=1e-12) and aa == pytest.approx(ab, rel=1e-12)


@pytest.mark.parametrize("opts", MGRIT_CONFIGS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
@pytest.mark.parametrize("warm", [False, True])
def test_residuals_in_one_reused_buffer_equal_new_tensors(opts, warm):
    # residuals not kept go into one contiguous buffer of the solver's instead of a new
    # tensor each: the same states, gradients and residual histories, bitwise
    (a, ha, ga, aa, la), (b, hb, gb, ab, lb) = off_and_on(opts, "residual_rows", warm,
                                                          adjoint=True)
    assert la.fwd.ops._residuals is None and lb.fwd.ops._residuals is not None
    assert torch.equal(a, b) and torch.equal(ga, gb) and ha == hb and aa == ab


@pytest.mark.parametrize("opts", MGRIT_CONFIGS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
@pytest.mark.parametrize("warm", [False, True])
def test_stacked_steps_equal_one_interval_at_a_time(opts, warm):
    # the F-relaxation advancing a rank's intervals with one propagator call per step
    # index: bitwise the forward iterates of one call per interval, the adjoint's to
    # rounding (its stacked weight products sum in another order); fewer calls
    calls = {False: 0, True: 0}

    def spy(lp):
        for solver in (lp.fwd, lp.adj):
            def steps(*args, _orig=solver.ops._steps, _key=solver.ops.fusions.stack, **kw):
                calls[_key] += 1
                return _orig(*args, **kw)
            solver.ops._steps = steps
    (a, ha, ga, aa, _), (b, hb, gb, ab, _) = off_and_on(opts, "stack", warm, adjoint=True,
                                                        prepare=spy)
    assert calls[False] > calls[True] > 0
    assert torch.equal(a, b) and ha == hb
    assert float((ga - gb).norm() / gb.norm()) <= 1e-13
    assert aa == pytest.approx(ab, rel=1e-12)


@pytest.mark.parametrize("opts", MGRIT_CONFIGS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
@pytest.mark.parametrize("iters", [1, 2, 40])
def test_fixed_adjoint_sweep_leaves_the_weight_gradients(opts, iters):
    # without a tolerance the adjoint's last sweep writes each layer's weight products
    # while σ′ ⊙ λ is in cache; an unreachable tolerance takes the separate pass after the
    # solve: the same gradient (to rounding: the sweep steps its layers one at a time, a
    # solve with a tolerance stacks them), also when 40 iterations reach an exact zero
    # residual early (a fixed solve still runs its last sweep)
    net, theta = dense_net(layers=30, T=3.0, activation="tanh", gamma_ddt=1e-3)
    x, y = batch(net, n=12)
    lp = LayerParallel(net, MGRITOptions(**opts), SerialExchange())
    res = lp.forward(theta, x, max_iter=iters, tol=0.0)
    ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
    fixed, fixed_res = lp.backward(theta, x, res.states, ev, max_iter=iters, tol=0.0)
    fixed = fixed.clone()
    other, _ = lp.backward(theta, x, res.states, ev, max_iter=iters, tol=1e-300)
    assert fixed_res.iterations == iters
    assert torch.allclose(fixed, other, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("make", [dense_net, conv_net])
def test_fixed_adjoint_weight_gradients_dense_and_conv(make):
    net, theta = make(layers=9)
    x, y = batch(net, n=3)
    lp = LayerParallel(net, MGRITOptions(levels=2, cfactor0=2), SerialExchange())
    res = lp.forward(theta, x, max_iter=2, tol=0.0)
    ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
    fixed = lp.backward(theta, x, res.states, ev, max_iter=1, tol=0.0)[0].clone()
    other = lp.backward(theta, x, res.states, ev, max_iter=1, tol=1e-300)[0]
    assert torch.allclose(fixed, other, rtol=1e-12, atol=1e-15)
    assert float(fixed.abs().max()) > 0
