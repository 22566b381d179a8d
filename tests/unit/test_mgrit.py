"""MGRIT on one rank: exactness properties and agreement with serial propagation."""
from collections import Counter

import pytest
import torch

from helpers import Counting, batch, conv_net, dense_net, serial_objective_and_grad
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.fused import Fusions
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


CONFIGS = [dict(levels=2, cfactor0=4, nrelax0=0),
           dict(levels=3, cfactor0=4, cfactor=2, nrelax0=1, nrelax=1),
           dict(levels=4, cfactor0=2, cfactor=2, cycle="F"),
           dict(levels=3, cfactor0=3, cfactor=3, coarse_weights="average"),
           dict(levels=5, cfactor0=2, cfactor=2, skip_first_down=False, min_coarse=1)]


@pytest.mark.parametrize("opts", CONFIGS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
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


@pytest.mark.parametrize("opts", CONFIGS[:3], ids=lambda o: "-".join(f"{v}" for v in o.values()))
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


@pytest.mark.parametrize("opts", [CONFIGS[0], CONFIGS[2], dict(levels=3, cfactor0=4, cfactor=4),
                                  dict(levels=3, cfactor0=3, cfactor=2, nrelax=2)],
                         ids=lambda o: "-".join(f"{v}" for v in o.values()))
@pytest.mark.parametrize("warm", [False, True])
def test_reused_coarse_rhs_equals_a_fresh_fas_restriction(opts, warm):
    # after a full cycle g_j ← g_j + r_j at the coarse F-points (FusedLevelOps._rhs_update): the
    # same iterates as injecting and stepping Φ^Δ everywhere, up to rounding
    (a, ha, *_), (b, hb, *_) = off_and_on(opts, "reuse_rhs", warm, iters=4)
    assert float((a - b).abs().max()) <= 1e-13 and float((a - b).abs().max()) > 0.0
    assert ha == pytest.approx(hb, rel=1e-10)


@pytest.mark.parametrize("opts", CONFIGS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
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


@pytest.mark.parametrize("opts", CONFIGS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
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


@pytest.mark.parametrize("opts", CONFIGS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
@pytest.mark.parametrize("warm", [False, True])
def test_residuals_in_one_reused_buffer_equal_new_tensors(opts, warm):
    # residuals not kept go into one contiguous buffer of the solver's instead of a new
    # tensor each: the same states, gradients and residual histories, bitwise
    (a, ha, ga, aa, la), (b, hb, gb, ab, lb) = off_and_on(opts, "residual_rows", warm,
                                                          adjoint=True)
    assert la.fwd.ops._residuals is None and lb.fwd.ops._residuals is not None
    assert torch.equal(a, b) and torch.equal(ga, gb) and ha == hb and aa == ab


@pytest.mark.parametrize("opts", CONFIGS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
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


@pytest.mark.parametrize("opts", CONFIGS, ids=lambda o: "-".join(f"{v}" for v in o.values()))
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


class Seen:
    """An Observer (mgrit.protocols) that logs what it is told."""

    def __init__(self):
        self.steps, self.messages, self.sums = Counter(), [], []
        self.last = Counter()      # states stepped in a last sweep, by level
        self.kernels = []

    def step(self, level, states, last):
        self.steps[level] += states
        self.last[level] += states if last else 0

    def message(self, level, peer, sent):
        self.messages.append((level, peer, sent))

    def sum(self, level, values, itemsize=8):
        assert level == 0
        self.sums.append((values, itemsize))

    def kernel(self, name, states, seconds):
        self.kernels.append((name, states))


class ZeroExchange:
    """Rank `rank` of `size` alone: receives give zeros, sums never converge; logs
    every message (peer, sent)."""

    def __init__(self, rank, size, log=None):
        self.rank, self.size, self.log = rank, size, [] if log is None else log

    def send(self, tensor, dest):
        self.log.append((dest, True))

    def recv(self, template, source):
        self.log.append((source, False))
        return torch.zeros_like(template)

    def wait(self):
        pass

    def allreduce_sums(self, values):
        return [1.0] * len(values)

    def reversed(self):
        return ZeroExchange(self.size - 1 - self.rank, self.size, self.log)


@pytest.mark.parametrize("iters", [1, 3])
@pytest.mark.parametrize("opts", [dict(levels=3, cfactor0=2, cfactor=2),
                                  dict(levels=3, cfactor0=2, cfactor=2, nrelax0=1, cycle="F")],
                         ids=["V", "F-nrelax0"])
def test_the_observer_sees_every_step_sum_and_the_last_sweep_once_per_layer(opts, iters):
    # steps by level = the propagator's calls by step length (1, 2, 4 fine steps); sums =
    # the residual measurements; a fixed solve's last sweep steps each layer once (what the
    # propagator keeps for the adjoint), a solve to a tolerance every level-0 step
    net, theta = dense_net(layers=32, T=3.0, activation="tanh")
    x, y = batch(net)
    for tol in (0.0, 1e-300):
        seen, counted = Seen(), []
        lp = LayerParallel(net, MGRITOptions(**opts), SerialExchange(), observer=seen)
        for solver in (lp.fwd, lp.adj):
            solver.ops.begin = (lambda prop, *a, _b=solver.ops.begin:
                                counted.append(Counting(prop)) or _b(counted[-1], *a))
        res = lp.forward(theta, x, max_iter=iters, tol=tol)
        ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
        _, ares = lp.backward(theta, x, res.states, ev, max_iter=iters, tol=tol)
        by_length = sum((c.steps for c in counted), Counter())
        assert dict(seen.steps) == {l: by_length[2 ** l] for l in range(3)}
        # the residual measurements (2 floats), then LayerParallel's own: loss and hits
        # after the forward, the gradient after the adjoint
        assert res.history and ares.history
        assert seen.sums == [(2, 8)] * len(res.history) + [(1, 8)] * 2 + \
            [(2, 8)] * len(ares.history) + [(theta.numel(), 8)]
        assert not seen.messages and not seen.kernels
        assert seen.last[0] == (2 * 32 if tol == 0 else seen.steps[0])
        assert seen.last[1] == seen.last[2] == 0


def test_the_observer_sees_every_message_with_its_level():
    # rank 1 of 3 alone (zeros received): each message the exchange carries, in order,
    # with the level whose neighbour it goes to or comes from
    net, theta = dense_net(layers=32, T=3.0, activation="tanh")
    x, _ = batch(net)
    seen, ex = Seen(), ZeroExchange(1, 3)
    lp = LayerParallel(net, MGRITOptions(levels=3, cfactor0=2, cfactor=2), ex, observer=seen)
    lp.forward(theta, x, max_iter=2, tol=0.0)
    assert [(peer, sent) for _, peer, sent in seen.messages] == ex.log and ex.log
    hier, levels = lp.hier, {level for level, _, _ in seen.messages}
    assert levels == {0, 1, 2}
    for level, peer, sent in seen.messages:
        assert peer == (hier.right(level, 1) if sent else hier.left(level, 1))


def test_the_observer_sees_the_adjoint_s_messages_in_the_group_s_numbering():
    # the adjoint solver's exchange numbers rank r as 2 − r (mirrored); its observer is
    # told the layer group's ranks: adjoints go left (to 0), come from the right (2), as
    # does u_hi, the next rank's first state, at level 0
    net, theta = dense_net(layers=32, T=3.0, activation="tanh")
    x, y = batch(net)
    seen, ex = Seen(), SummingZeroExchange(1, 3)
    lp = LayerParallel(net, MGRITOptions(levels=3, cfactor0=2, cfactor=2), ex, observer=seen)
    res = lp.forward(theta, x, max_iter=2, tol=0.0)
    ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
    seen.messages.clear()
    lp.backward(theta, x, res.states, ev, max_iter=2, tol=0.0)
    assert seen.messages[:2] == [(0, 0, True), (0, 2, False)]      # u_lo out, u_hi in
    assert {level for level, _, _ in seen.messages[2:]} == {0, 1, 2}
    assert all(peer == (0 if sent else 2) for _, peer, sent in seen.messages)


class SummingZeroExchange(ZeroExchange):
    """ZeroExchange with the sums of loss, hits and the gradient (this rank's own)."""

    def allreduce_sum(self, value):
        return value

    def allreduce_tensor(self, tensor):
        return tensor

    def reversed(self):
        return SummingZeroExchange(self.size - 1 - self.rank, self.size, self.log)


def test_the_solver_s_callers_meet_its_protocols():
    # what the solver is given: the exchanges and propagators of parallel/ (both modules'
    # and the network's), the counting wrapper of the tests and bench/, and this file's
    # stand-ins
    from lptrain.mgrit.protocols import Exchange, Observer, Propagator
    from lptrain.parallel.module_propagators import ModuleAdjoint, ModuleForward
    from lptrain.parallel.propagators import AdjointPropagator
    net, theta = dense_net(layers=4)
    fwd = ForwardPropagator(net.stepper(theta), net.h)
    adj = AdjointPropagator(net.stepper(theta), net.h, 4, lin=None)
    for prop in (fwd, adj, Counting(fwd), ModuleForward(None, 1.0, False),
                 ModuleAdjoint(None, 1.0, 4, None, False, ())):
        assert isinstance(prop, Propagator)
    assert isinstance(SerialExchange(), Exchange) and isinstance(Seen(), Observer)
    from lptrain.model_perf.record import Recorder
    from lptrain.model_perf.scripted import ScriptedExchange
    from lptrain.parallel.layer_parallel import Mirrored
    assert isinstance(ScriptedExchange(0, 2), Exchange)
    assert all(isinstance(o, Observer) for o in (Recorder(), Mirrored(Seen(), 2)))
    assert not isinstance(ZeroExchange(0, 2), Exchange)    # no sums of tensors
