"""Optimizers on a tiny problem: descent, Armijo, robustness safeguards."""
import math
import sys

import pytest
import torch

from helpers import batch, dense_net
from lptrain.config.schema import AdamOptions, LBFGSOptions, SGDOptions
from lptrain.errors import DivergedError
from lptrain.mgrit.exchange import SerialExchange
from lptrain.train.optimizers import LBFGS, OPTIMIZERS, Adam, SGD
from lptrain.train.objective import Objective
from lptrain.train.oracles import Batch, ExactOracle, Point, SerialOracle
from lptrain.train.protocol import (DataTerms, Evaluated, Oracle, StaleEvaluation,
                                    TrainingOracle, WarmStarts)


def oracle_for(n=40):
    net, theta = dense_net(layers=6, width=4, scale=0.3)
    x, _ = batch(net, n=n)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()       # a learnable 3-class rule
    oracle = Objective(SerialOracle(net, SerialExchange()), net)
    oracle.begin(Batch(x, y))
    return oracle, theta


@pytest.mark.parametrize("opt", [LBFGS(LBFGSOptions()), SGD(SGDOptions(lr=0.1)),
                                 SGD(SGDOptions(lr=0.1, nesterov=True)),
                                 Adam(AdamOptions(lr=0.02))], ids=["lbfgs", "sgd", "nesterov",
                                                                  "adam"])
def test_optimizers_decrease_the_objective(opt):
    oracle, theta = oracle_for()
    start = oracle.value(theta).point.objective
    for _ in range(25):
        theta, info = opt.step(theta, oracle)
    assert oracle.value(theta).point.objective < 0.7 * start


class Recording(ExactOracle):
    """Wraps an oracle and records every valued objective."""

    def __init__(self, inner):
        self.inner, self.values = inner, []

    def value(self, theta):
        ev = self.inner.value(theta)
        self.values.append((theta.clone(), ev.point.objective))
        return ev

    def gradient(self, ev):
        return self.inner.gradient(ev)

    def accept(self, ev):
        self.inner.accept(ev)


def test_lbfgs_steps_satisfy_armijo():
    oracle, theta = oracle_for()
    opt = LBFGS(LBFGSOptions(c1=1e-4))
    rec = Recording(oracle)
    theta, _ = opt.step(theta, rec)
    for _ in range(10):
        J0, g = opt.current[0].objective, opt.current[1]
        d = opt.direction(g)
        new, info = opt.step(theta, rec)
        if info.step_size > 0:
            assert info.objective <= J0 + 1e-4 * info.step_size * float(g @ d) + 1e-15
            assert torch.allclose(new, theta + info.step_size * d)
        theta = new


def test_a_trial_that_decreases_too_little_is_rejected():
    """½θ² from θ = 1 along −g: the full step reaches the minimum, a decrease of 0.5,
    less than c1·α·|slope| = 0.9; backtracking by halves, α = 1/8 is the first to give
    c1 = 0.9's sufficient decrease."""
    opt = LBFGS(LBFGSOptions(c1=0.9))
    new, info = opt.step(torch.ones(1, dtype=torch.float64), Quadratic())
    assert info.ls_trials == 4 and info.step_size == 0.125
    assert float(new) == 0.875


def test_a_pair_of_too_little_curvature_is_skipped():
    """g = Aθ with A a rotation by 90° plus 1e-12 of the identity: sᵀy = 1e-12·‖s‖² > 0,
    below CURVATURE_EPS·‖s‖‖y‖, so the pair is left out of the memory."""
    a = torch.tensor([[1e-12, -1.0], [1.0, 1e-12]], dtype=torch.float64)

    class Rotating(Quadratic):
        falls = 0.0

        def gradient(self, ev):
            return a @ ev.theta

        def value(self, theta):          # every trial decreases the objective enough
            self.falls -= 1e9
            return Evaluated(Point(objective=self.falls, loss=0.0, accuracy=0.0), theta)
    opt = LBFGS(LBFGSOptions())
    _, info = opt.step(torch.tensor([1.0, 0.0], dtype=torch.float64), Rotating())
    assert info.step_size == 1.0 and info.lbfgs_skipped == 1 and len(opt.mem) == 0


def test_lbfgs_two_loop_matches_dense_bfgs_inverse():
    opt = LBFGS(LBFGSOptions(memory=5))
    gen = torch.Generator().manual_seed(0)
    A = torch.randn(6, 6, generator=gen, dtype=torch.float64)
    A = A @ A.t() + 6 * torch.eye(6, dtype=torch.float64)     # SPD model Hessian
    pairs = []
    for _ in range(3):
        s = torch.randn(6, generator=gen, dtype=torch.float64)
        y = A @ s
        pairs.append((s, y))
        opt.mem.append((s, y, 1.0 / float(s @ y)))
    s, y = pairs[-1]
    H = float(s @ y) / float(y @ y) * torch.eye(6, dtype=torch.float64)
    for s, y in pairs:                              # explicit BFGS inverse updates
        rho = 1.0 / float(s @ y)
        V = torch.eye(6, dtype=torch.float64) - rho * torch.outer(y, s)
        H = V.t() @ H @ V + rho * torch.outer(s, s)
    g = torch.randn(6, generator=gen, dtype=torch.float64)
    assert torch.allclose(opt.direction(g), -H @ g, rtol=1e-12, atol=1e-12)


class Quadratic(ExactOracle):
    """J(θ) = ½‖θ‖² with a hook to corrupt values."""

    def __init__(self, bad=lambda t: False, worse=float("inf")):
        self.bad, self.worse = bad, worse

    def value(self, theta):
        j = self.worse if self.bad(theta) else 0.5 * float(theta @ theta)
        return Evaluated(Point(objective=j, loss=j, accuracy=0.0), theta)

    def gradient(self, ev):
        return ev.theta.clone()

    def accept(self, ev):
        pass


def test_failed_line_search_resets_memory_and_keeps_theta():
    opt = LBFGS(LBFGSOptions(max_ls=3))
    theta = torch.ones(3, dtype=torch.float64)
    theta, info = opt.step(theta, Quadratic())           # a good first step fills memory
    assert len(opt.mem) in (0, 1)
    opt.current = (Point(objective=1.0, loss=1.0, accuracy=0.0),
                   torch.ones(3, dtype=torch.float64))
    opt.mem.append((torch.ones(3, dtype=torch.float64),) * 2 + (1 / 3,))
    kept = theta.clone()
    theta, info = opt.step(theta, Quadratic(bad=lambda t: True, worse=1e9))
    assert info.lbfgs_reset == 1 and info.step_size == 0.0 and len(opt.mem) == 0
    # the L-BFGS direction failed, then −g: no step, and nothing left to try
    assert torch.equal(theta, kept) and info.ls_trials == 6 and info.ls_failed == 2
    assert info.exhausted


class Inexact(Quadratic):
    """½‖θ‖² whose gradient points uphill until the oracle is tightened twice."""

    def __init__(self):
        super().__init__()
        self.rung, self.relaxed, self.valued = 0, 0, []

    def tighten(self):
        self.rung += 1
        return self.rung <= 3

    def relax(self):
        self.rung, self.relaxed = 0, self.relaxed + 1

    def value(self, theta):
        self.valued.append(self.rung)
        return super().value(theta)

    def gradient(self, ev):
        return ev.theta.clone() * (1.0 if self.rung >= 2 else -1.0)


def test_failed_line_search_tightens_the_solves_until_a_step_is_found():
    opt, oracle = LBFGS(LBFGSOptions(max_ls=4)), Inexact()
    theta = torch.ones(3, dtype=torch.float64)
    new, info = opt.step(theta, oracle)
    # rung 0 and 1 give −∇J: two failed searches, θ re-evaluated at rungs 1 and 2; the
    # exact gradient at rung 2 gives the minimiser in one step, then back to rung 0
    assert info.ls_failed == 2 and info.lbfgs_reset == 1 and not info.exhausted
    assert info.step_size == 1.0 and float(new.abs().max()) == 0.0
    assert oracle.valued == [0] + [0] * 4 + [1] + [1] * 4 + [2, 2]
    assert oracle.rung == 0 and oracle.relaxed == 1


def test_curvature_update_skipped_when_not_positive():
    opt = LBFGS(LBFGSOptions())

    class Flat(Quadratic):
        def gradient(self, ev):        # gradient that ignores θ: sᵀy = 0
            return torch.ones(2, dtype=torch.float64)

        def value(self, theta):
            j = float(theta.sum())
            return Evaluated(Point(objective=j, loss=j, accuracy=0.0), theta)
    theta, info = opt.step(torch.zeros(2, dtype=torch.float64), Flat())
    assert info.lbfgs_skipped == 1 and len(opt.mem) == 0


def test_divergence_is_reported():
    # a first evaluation that is not finite: no step, the objective for the loop's
    # divergence rule, which ends the run with the iteration's row written (SGD's
    # evaluation is always of the parameters it started from; L-BFGS's first)
    theta = torch.ones(2, dtype=torch.float64)
    for opt in (LBFGS(LBFGSOptions()), SGD(SGDOptions())):
        same, info = opt.step(theta, Quadratic(bad=lambda t: True))
        assert same is theta and info.at_start and info.objective == math.inf
    # every trial step along −g overflows (a NaN in the network): not 'stalled, the
    # optimum may be reached' but diverged
    opt = LBFGS(LBFGSOptions(max_ls=3))
    opt.current = (Point(objective=1.0, loss=1.0, accuracy=0.0), theta.clone())
    with pytest.raises(DivergedError, match=r"^diverged: objective nan at every trial "
                                            r"step along -g down to 0\.25: lower "):
        opt.step(theta, Quadratic(bad=lambda t: True, worse=math.nan))


def test_registry_names_match_config_groups():
    assert set(OPTIMIZERS) == {"lbfgs", "sgd", "adam"}


def test_serial_oracle_holds_one_trial_at_a_time():
    # a line search re-evaluates: the rejected trial's states are freed before the next
    # propagation, so the peak is one forward record, not two
    net, theta = dense_net(layers=6)
    x, y = batch(net)
    oracle = SerialOracle(net, SerialExchange())
    oracle.begin(Batch(x, y))
    first = oracle.value(theta)
    seen = []
    forward = oracle._forward
    oracle._forward = lambda *a: (seen.append(first.tape), forward(*a))[1]
    second = oracle.value(theta * 0.5)
    assert seen == [None] and second.tape is not None


def test_a_gradient_belongs_to_its_evaluation():
    """gradient(ev) is ∇ at ev's θ, whatever was evaluated before; an evaluation whose
    states a later value() reused is refused, not differentiated at the wrong point."""
    net, theta = dense_net(layers=6)
    x, y = batch(net)
    oracle = Objective(SerialOracle(net, SerialExchange()), net)
    oracle.begin(Batch(x, y))
    first = oracle.value(theta)
    expected = oracle.gradient(first)
    second = oracle.value(theta * 0.5)
    with pytest.raises(StaleEvaluation):
        oracle.gradient(first)
    assert not torch.equal(oracle.gradient(second), expected)
    again = oracle.value(theta)
    assert torch.equal(oracle.gradient(again), expected)
    # the serial adjoint consumed the evaluation's activations: a second gradient is refused
    with pytest.raises(StaleEvaluation, match="taken twice"):
        oracle.gradient(again)


def _reference_sgd(theta, grads, lr, momentum, nesterov):
    """SGD with momentum written out: buf ← μ·buf + g; d = g + μ·buf (Nesterov) or buf."""
    buf = None
    for g in grads:
        buf = g.clone() if buf is None else momentum * buf + g
        theta = theta - lr * (g + momentum * buf if nesterov else buf)
    return theta


def _reference_adam(theta, grads, lr, b1, b2, eps):
    """Adam written out with bias correction (Kingma & Ba, Algorithm 1)."""
    m = v = torch.zeros_like(theta)
    for t, g in enumerate(grads, 1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        theta = theta - lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)
    return theta


@pytest.mark.parametrize("name", ["sgd", "nesterov", "adam"])
def test_sgd_and_adam_follow_their_update_rules(name):
    gen = torch.Generator().manual_seed(4)
    theta0 = torch.randn(7, generator=gen, dtype=torch.float64)
    before = theta0.clone()
    grads = [torch.randn(7, generator=gen, dtype=torch.float64) for _ in range(6)]
    if name == "adam":
        opt = Adam(AdamOptions(lr=0.05, beta1=0.8, beta2=0.9, eps=1e-6))
        want = _reference_adam(theta0, grads, 0.05, 0.8, 0.9, 1e-6)
    else:
        opt = SGD(SGDOptions(lr=0.1, momentum=0.7, nesterov=name == "nesterov"))
        want = _reference_sgd(theta0, grads, 0.1, 0.7, name == "nesterov")
    theta = theta0
    for g in grads[:3]:
        theta, _ = opt.update(theta, g)
    state = opt.state_dict()          # a checkpoint in the middle
    again = type(opt)(opt.o)
    again.load_state_dict(state)
    for g in grads[3:]:
        theta, _ = again.update(theta, g)
    torch.testing.assert_close(theta, want, rtol=1e-13, atol=1e-15)
    assert theta0.equal(before)       # the caller's θ is never written into


def test_sgd_and_adam_never_import_torch_dynamo(monkeypatch):
    """torch.optim's optimizer objects import torch._dynamo when built and at each step
    (start-up time of every run); the functional rules lptrain calls do not."""
    monkeypatch.setitem(sys.modules, "torch._dynamo", None)       # importing it now fails
    theta, g = torch.ones(3, dtype=torch.float64), torch.full((3,), 0.5, dtype=torch.float64)
    for opt in (SGD(SGDOptions(lr=0.1, nesterov=True)), Adam(AdamOptions(lr=0.1))):
        theta, _ = opt.update(theta, g)
        again = type(opt)(opt.o)
        again.load_state_dict(opt.state_dict())
        theta, _ = again.update(theta, g)
    assert not theta.equal(torch.ones(3, dtype=torch.float64))


def test_every_oracle_has_the_protocol_its_users_rely_on():
    """Each layer of the stack app.build makes has every method its protocol declares
    (train/protocol.py); the state readers work on the classes too (train/regrid.py)."""
    from lptrain.mgrit.options import MGRITOptions
    from lptrain.train.calibrate import CalibratedOracle
    from lptrain.train.data_parallel import DataParallelOracle
    from lptrain.train.oneshot import SimultaneousOracle
    from lptrain.train.mgrit_oracle import MGRITOracle
    net, _ = dense_net(layers=4)
    ex, opts = SerialExchange(), MGRITOptions(levels=2, cfactor0=2)
    terms = [SerialOracle(net, ex), MGRITOracle(net, ex, opts),
             SimultaneousOracle(net, ex, opts)]
    for t in terms:
        assert isinstance(t, DataTerms) and isinstance(DataParallelOracle(t, ex), DataTerms)
        assert isinstance(type(t), WarmStarts)
        whole = Objective(DataParallelOracle(t, ex), net)
        assert isinstance(whole, TrainingOracle)
    assert isinstance(CalibratedOracle(Objective(terms[2], net), terms[2],
                                       Objective(terms[0], net)), TrainingOracle)
    assert not isinstance(Quadratic(), TrainingOracle) and isinstance(Quadratic(), Oracle)


@pytest.mark.parametrize("one_shot", [False, True])
def test_a_solve_that_overflows_has_no_finite_objective_and_keeps_the_warm_start(one_shot):
    """A non-finite residual (a NaN on one rank) stops a solve at once with the states
    of the iterate before: the one-shot run took their finite objective and gradient,
    kept training on them (J fell while validation collapsed) and ended `completed`."""
    from lptrain.mgrit.options import MGRITOptions
    from lptrain.train.oneshot import SimultaneousOracle
    from lptrain.train.mgrit_oracle import MGRITOracle
    net, theta = dense_net(layers=8, width=4, T=2.0)
    x, y = batch(net, n=16)
    kind = SimultaneousOracle if one_shot else MGRITOracle

    def evaluated(*thetas):
        oracle = kind(net, SerialExchange(), MGRITOptions(levels=2, cfactor0=2))
        oracle.begin(Batch(x, y))
        evs = []
        for t in thetas:
            evs.append(oracle.value(t))
            if math.isfinite(evs[-1].point.objective):
                oracle.gradient(evs[-1])
        return oracle, evs

    bad = theta.clone()
    bad[net.layout.views(bad)["K"].storage_offset() + 5] = math.nan
    oracle, (good, nan, again) = evaluated(theta, bad, theta)
    assert math.isfinite(good.point.objective)
    assert math.isnan(nan.point.objective) and math.isnan(nan.point.loss)
    # the overflowed solve left the warm start as it was: as if it had not been tried
    _, (_, twin) = evaluated(theta, theta)
    assert again.point.objective == twin.point.objective
    # an adjoint solve that overflows: a NaN gradient, which a data split's sum carries to
    # every rank (one group raising left the others waiting in that sum: a hang), and
    # which the optimizers refuse
    oracle, (_, nan) = evaluated(theta, bad)
    kept = oracle.warm.get(oracle.batch.key)[1]
    assert torch.isnan(oracle.gradient(nan)).all()
    assert oracle.warm.get(oracle.batch.key)[1] is kept
    from lptrain.train.optimizers import finite_gradient
    with pytest.raises(DivergedError, match=r"^diverged: the gradient is not finite: lower "
                                            r"the step size"):
        finite_gradient(torch.tensor([1.0, math.nan]))


class NaNGradient(Quadratic):
    """A finite objective whose gradient is not (an adjoint solve that overflowed)."""

    def gradient(self, ev):
        return torch.full_like(ev.theta, math.nan)


@pytest.mark.parametrize("make", [lambda: LBFGS(LBFGSOptions()), lambda: SGD(SGDOptions()),
                                  lambda: Adam(AdamOptions())])
def test_every_optimizer_refuses_a_gradient_that_is_not_finite(make):
    with pytest.raises(DivergedError, match=r"^diverged: the gradient is not finite"):
        make().step(torch.ones(2, dtype=torch.float64), NaNGradient())


def test_lbfgs_refuses_a_gradient_that_is_not_finite_at_the_accepted_trial():
    """The start's gradient is finite, the accepted trial's is not (review: that path
    had no test)."""
    start = torch.ones(2, dtype=torch.float64)

    class AtTrials(Quadratic):
        def gradient(self, ev):
            return ev.theta.clone() if torch.equal(ev.theta, start) else \
                torch.full_like(ev.theta, math.nan)
    with pytest.raises(DivergedError, match=r"^diverged: the gradient is not finite"):
        LBFGS(LBFGSOptions()).step(start, AtTrials())


def test_theta_below_least_is_kept_whole_on_every_rank():
    """The split: rank 1 of 4 holds shard(n, 4, 1) from LEAST entries on, else everything
    (its sums and joins then never reach the other ranks)."""
    from types import SimpleNamespace

    from lptrain.parallel.grid import shard
    from lptrain.train.shards import LEAST, split
    four = SimpleNamespace(size=4, rank=1)
    whole = split(four, LEAST - 1)
    assert whole.whole and (whole.lo, whole.hi) == (0, LEAST - 1)
    parts = split(four, LEAST)
    assert not parts.whole and (parts.lo, parts.hi) == shard(LEAST, 4, 1)
    assert parts.counts == [LEAST // 4] * 4
    v = torch.arange(float(LEAST))
    assert torch.equal(parts.part(v), v[parts.lo:parts.hi])
    assert (split(four, 10, least=8).lo, split(four, 10, least=8).hi) == shard(10, 4, 1)


def test_one_rank_recursion_is_the_plain_two_loop():
    """With the whole vectors (one rank) the direction is the textbook two-loop recursion
    bitwise: the split changes nothing there."""
    o, theta = oracle_for()
    opt = LBFGS(LBFGSOptions(memory=3))
    for _ in range(5):
        theta, _ = opt.step(theta, o)
    g = opt.current[1]
    q, alphas = g.clone(), []
    for s, y, rho in reversed(opt.mem):
        alphas.append(rho * float(s @ q))
        q.sub_(y, alpha=alphas[-1])
    s, y, _ = opt.mem[-1]
    q.mul_(float(s @ y) / float(y @ y))
    for (s, y, rho), a in zip(opt.mem, reversed(alphas)):
        q.add_(s, alpha=a - rho * float(y @ q))
    assert len(opt.mem) == 3 and torch.equal(opt.direction(g), -q)
