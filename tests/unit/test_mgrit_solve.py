"""MGRIT on one rank: exactness properties and agreement with serial propagation."""
import pytest
import torch

from helpers import MGRIT_CONFIGS, batch, conv_net, dense_net, serial_objective_and_grad
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.layer_parallel import LayerParallel
from lptrain.parallel.propagators import ForwardPropagator


def solve(net, theta, x, y, **opts):
    lp = LayerParallel(net, MGRITOptions(**opts), SerialExchange())
    res = lp.forward(theta, x)
    ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
    grad, ares = lp.backward(theta, x, res.states, ev)
    net.regulariser(theta, grad)
    return res, ares, grad, lp


def test_one_level_is_serial_stepping_exactly():
    net, theta = dense_net(layers=13)
    x, y = batch(net)
    _, ref, states = serial_objective_and_grad(net, theta, x, y)
    res, ares, grad, _ = solve(net, theta, x, y, levels=1)
    assert torch.equal(res.states, states)
    assert res.iterations == 1 and ares.iterations == 1
    assert torch.allclose(grad, ref, rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize("N,cf", [(16, 4), (12, 2), (15, 4)])
def test_two_level_f_relaxation_is_exact_after_n_over_c_iterations(N, cf):
    net, theta = dense_net(layers=N, T=3.0, scale=0.8)
    x, y = batch(net)
    _, _, states = serial_objective_and_grad(net, theta, x, y)
    intervals = -(-N // cf)
    lp = LayerParallel(net, MGRITOptions(levels=2, cfactor0=cf, nrelax0=0, tol=0.0,
                                         skip_first_down=False), SerialExchange())
    before = lp.forward(theta, x, max_iter=intervals - 1, tol=0.0).states.clone()
    exact = lp.forward(theta, x, max_iter=intervals, tol=0.0).states
    assert float((before - states).abs().max()) > 1e-8      # not yet exact one step before
    assert torch.allclose(exact, states, rtol=0, atol=1e-14)


@pytest.mark.parametrize("opts", MGRIT_CONFIGS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
@pytest.mark.parametrize("N", [24, 29])
def test_converged_mgrit_gives_serial_states_and_gradients(opts, N):
    net, theta = dense_net(layers=N, T=3.0, activation="smoothrelu", gamma_ddt=1e-3)
    x, y = batch(net)
    _, ref, states = serial_objective_and_grad(net, theta, x, y)
    res, ares, grad, _ = solve(net, theta, x, y, tol=1e-12, max_iter=60, **opts)
    assert res.converged and ares.converged
    assert float((res.states - states).norm() / states.norm()) <= 1e-10
    assert float((grad - ref).norm() / ref.norm()) <= 1e-8


def test_converged_mgrit_conv_network():
    net, theta = conv_net(layers=10, T=2.0)
    x, y = batch(net, n=4)
    _, ref, states = serial_objective_and_grad(net, theta, x, y)
    res, ares, grad, _ = solve(net, theta, x, y, levels=2, cfactor0=2, tol=1e-12,
                               max_iter=20)
    assert float((res.states - states).norm() / states.norm()) <= 1e-10
    assert float((grad - ref).norm() / ref.norm()) <= 1e-8


@pytest.mark.parametrize("skip", [False, True])
def test_warm_start_from_the_solution(skip):
    """A warm start relaxes before its first residual (skip_first_down is for cold
    starts): from the solution it has converged before the first cycle."""
    net, theta = dense_net(layers=16)
    x, y = batch(net)
    lp = LayerParallel(net, MGRITOptions(levels=3, cfactor0=2, cfactor=2, tol=1e-11,
                                         skip_first_down=skip), SerialExchange())
    first = lp.forward(theta, x).states.clone()
    again = lp.forward(theta, x, warm=first)
    assert again.iterations == 0 and again.residual <= 1e-11
    assert torch.allclose(again.states, first, rtol=0, atol=1e-12)


def test_residual_history_decreases_and_rtol_stops_early():
    net, theta = dense_net(layers=32, T=2.0, scale=0.3)
    x, y = batch(net)
    lp = LayerParallel(net, MGRITOptions(levels=3, cfactor0=4, cfactor=2, tol=0.0,
                                         rtol=1e-6, max_iter=40), SerialExchange())
    res = lp.forward(theta, x)
    h = res.history
    assert res.converged and h[-1] <= 1e-6 * h[0] and h[-2] > 1e-6 * h[0]
    assert all(b < a for a, b in zip(h, h[1:]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_tolerance_below_round_off_stops_at_the_round_off_floor(dtype):
    """tol = 1e-300 cannot be met; the solves stop where the residual is round-off of the
    C-point states (float32: at 3.7e-6 after 8 of 50 iterations) with serial's states."""
    net, theta = dense_net(layers=32, T=2.0)
    x, y = batch(net, n=64)
    theta, x, eps = theta.to(dtype), x.to(dtype), torch.finfo(dtype).eps
    _, ref, states = serial_objective_and_grad(net, theta, x, y)
    res, ares, grad, _ = solve(net, theta, x, y, levels=3, cfactor0=4, cfactor=2, tol=1e-300,
                               max_iter=50)
    assert res.converged and ares.converged
    assert res.iterations < 10 and ares.iterations < 10
    assert res.history[-2] > res.history[-1] > 0.0
    assert float((res.states - states).norm() / states.norm()) <= 10 * eps
    assert float((grad - ref).norm() / ref.norm()) <= 1e3 * eps


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_round_off_floor_scales_with_the_states(dtype):
    """The residual's round-off grows with ‖u_C‖, which grows with the batch: the floor
    is ROUNDOFF·eps·‖u_C‖, so a batch of 4000 stops as early as one of 64 (a floor of
    ROUNDOFF·eps alone ran such solves to max_iter: mode=mgrit dtype=float32 did 6× the
    work and warned of stagnation)."""
    net, theta = dense_net(layers=32, T=2.0)
    runs = []
    for n in (64, 4000):
        x, y = batch(net, n=n)
        runs.append(solve(net, theta.to(dtype), x.to(dtype), y, levels=3, cfactor0=4,
                          cfactor=2, tol=1e-300, max_iter=50)[0])
    assert runs[1].state_norm > 5 * runs[0].state_norm
    assert all(r.converged and r.iterations < 12 for r in runs), \
        [(r.converged, r.iterations) for r in runs]


def test_the_state_norm_is_the_two_norm_over_the_c_points():
    """‖u_C‖ = sqrt(Σ_c ‖u_c‖²) over the finest C-points 0, c, 2c, …, N of the returned
    states: the gradient-error estimate and the round-off floor scale with it."""
    net, theta = dense_net(layers=32, T=2.0)
    x, y = batch(net, n=64)
    res, _, _, _ = solve(net, theta, x, y, levels=3, cfactor0=4, cfactor=2, tol=1e-12,
                         max_iter=50)
    c_points = res.states[0::4]
    assert c_points.shape[0] == 9
    assert res.state_norm == pytest.approx(float(c_points.norm()), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_solve_iterates_to_its_round_off_not_to_the_bound(dtype):
    """The round-off bound 10·eps·‖u_C‖ is 8 % of the states in bfloat16: a solve ended
    there after one iteration, 8x less accurate than a plain sweep in that dtype."""
    net, theta = dense_net(layers=32, T=2.0)
    x, y = batch(net, n=64)
    _, _, truth = serial_objective_and_grad(net, theta, x, y)           # float64
    _, _, plain = serial_objective_and_grad(net, theta.to(dtype), x.to(dtype), y)
    res, _, _, _ = solve(net, theta.to(dtype), x.to(dtype), y, levels=3, cfactor0=4,
                         cfactor=2, tol=1e-300, max_iter=50)

    def error(states):
        return float((states.double() - truth).norm() / truth.norm())
    assert res.converged and res.iterations < 15
    assert res.history[-1] > 0.5 * res.history[-2]       # it stopped where it stagnated
    assert error(res.states) <= 2 * error(plain), (error(res.states), error(plain))


@pytest.mark.parametrize("make", [dense_net, conv_net])
def test_stacked_steps_equal_one_at_a_time(make):
    net, theta = make(layers=6)
    x, _ = batch(net, n=3)
    u = net.opening(theta, x)
    prop = ForwardPropagator(net.stepper(theta), net.h, "average")
    U = torch.stack([u, 2 * u, -u])
    starts, stops = [0, 2, 3], [2, 3, 6]
    many = prop.step_many(U, starts, stops)
    for i, (a, b) in enumerate(zip(starts, stops)):
        assert torch.allclose(many[i], prop.step(U[i], a, b), rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("opts", MGRIT_CONFIGS[:3],
                         ids=lambda o: "-".join(f"{v}" for v in o.values()))
@pytest.mark.parametrize("warm", [False, True])
def test_fixed_iterations_save_the_activations_of_the_returned_states(opts, warm):
    # Without a tolerance only the last sweep saves activations for the adjoint; an
    # unreachable tolerance (same iterations) saves on every sweep: same gradient.
    net, theta = dense_net(layers=29, T=3.0, activation="tanh")
    x, y = batch(net)
    grads = []
    for tol in (0.0, 1e-300):
        lp = LayerParallel(net, MGRITOptions(**opts), SerialExchange())
        start = lp.forward(theta, x, max_iter=1, tol=0.0).states.clone() if warm else None
        res = lp.forward(theta * 1.1, x, warm=start, max_iter=2, tol=tol)
        assert res.iterations == 2 and not res.converged
        ev = lp.evaluate(theta * 1.1, res.states, y, x.shape[0], True)
        grads.append(lp.backward(theta * 1.1, x, res.states, ev, max_iter=1)[0])
    assert torch.equal(grads[0], grads[1])
