"""User-supplied coarse steps of LayerParallel: which steps they replace, that the solver
uses them (exact coarse steps converge in one cycle), which parameters follow the fine
layers, and that converged solves equal serial whatever the coarse steps."""
import copy
import functools
import io
import pickle

import pytest
import torch
from torch import nn

from lptrain import CoarseStep, LayerParallel, MGRITOptions
from lptrain.errors import ConfigError
from lptrain.model.coarse_steps import CoarseSteps
from lptrain.parallel.coarse import UserCoarse, coarse_steps_of

N, T = 8, 2.0
OPTS = dict(levels=3, cfactor0=2, cfactor=2)


def dense(n, width=3, scale=0.6):
    gen = torch.Generator().manual_seed(n)
    m = nn.Sequential(nn.Linear(width, width), nn.Tanh()).double()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return m


def inputs(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


class Exact(nn.Module):
    """g with u + H·g(u) = the covered fine steps one after another (no parameters of its
    own: the fine layers are held outside the module tree)."""

    def __init__(self, fine, step: CoarseStep, h: float):
        super().__init__()
        self.fine, self.step, self.h = fine, step, h

    def forward(self, u):
        v = u
        for n in self.step.layers:
            v = v + self.h * self.fine[n](v)
        return (v - u) / self.step.h


def exact_factory(layers):
    return lambda c: Exact(layers, c, T / N)


def grads(mod, u0, serial=False):
    out = mod.serial(u0) if serial else mod(u0)
    loss = (out * inputs(*out.shape, seed=5)).sum()
    return (out, *torch.autograd.grad(loss, [u0, *mod.parameters()]))


def close(a, b, rel=1e-10):
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max()) <= rel * max(float(b.abs().max()), 1e-30)


# -- index arithmetic --------------------------------------------------------------------
def test_coarse_steps_are_named_by_level_and_index():
    hier = MGRITOptions(**OPTS).hierarchy(8, 1)      # levels 0..8, (0 2 4 6 8), (0 4 8)
    got = {key: (c.level, c.index, c.layers, c.h) for key, c in
           coarse_steps_of(hier, 0.5).items()}
    assert got == {(1, 0): (1, 0, range(0, 2), 1.0), (1, 2): (1, 1, range(2, 4), 1.0),
                   (1, 4): (1, 2, range(4, 6), 1.0), (1, 6): (1, 3, range(6, 8), 1.0),
                   (2, 0): (2, 0, range(0, 4), 2.0), (2, 4): (2, 1, range(4, 8), 2.0)}


def test_every_coarse_level_has_its_own_steps_and_the_finest_none():
    # N = 9, cfactor0 4, cfactor 2: level 1 (0 4 8 9), level 2 (0 8 9): 8 → 9 is a
    # one-layer step of both, each level's own
    hier = MGRITOptions(levels=3, cfactor0=4, cfactor=2, min_coarse=1).hierarchy(9, 1)
    assert hier.levels[2].points == (0, 8, 9)
    coarse = UserCoarse(None, hier, 0.1)
    assert coarse.of(0, 8, 9) is None
    assert coarse.of(1, 8, 9) == CoarseStep(1, 2, range(8, 9), 0.1)
    assert coarse.of(2, 8, 9) == CoarseStep(2, 1, range(8, 9), 0.1)
    with pytest.raises(IndexError, match="no step 4 → 9 on level 1"):
        coarse.of(1, 4, 9)


# -- the solver uses them ----------------------------------------------------------------
@pytest.mark.parametrize("weights", ["average", "inject"])
def test_exact_coarse_steps_converge_in_one_cycle_and_equal_serial(weights):
    layers = [dense(n) for n in range(N)]
    opts = MGRITOptions(**OPTS, coarse_weights=weights, tol=1e-12, max_iter=30)
    plain = LayerParallel(layers, T=T, mgrit=opts)
    exact = LayerParallel(layers, T=T, mgrit=opts, coarse_steps=exact_factory(layers))
    u0 = inputs(5, 3).requires_grad_()
    want = grads(plain, u0, serial=True)
    got_plain, got_exact = grads(plain, u0), grads(exact, u0)
    assert all(close(a, b) for a, b in zip(got_exact, want))
    assert all(close(a, b) for a, b in zip(got_plain, want))
    # one cycle, then a residual check; the fine f with step size H needs several
    assert exact.last_forward.iterations == 1 and exact.last_backward.iterations == 1
    assert plain.last_forward.iterations >= 4 and plain.last_backward.iterations >= 4


def test_one_fixed_iteration_differs_with_coarse_steps():
    layers = [dense(n) for n in range(N)]
    opts = MGRITOptions(**OPTS, tol=0.0, max_iter=1)
    u0 = inputs(5, 3)
    with torch.no_grad():
        exact = LayerParallel(layers, T=T, mgrit=opts, coarse_steps=exact_factory(layers))(u0)
        plain = LayerParallel(layers, T=T, mgrit=opts)(u0)
        serial = LayerParallel(layers, T=T).serial(u0)
    assert close(exact, serial, 1e-12) and not close(plain, serial, 1e-3)


# -- parameters that follow the fine layers ----------------------------------------------
class Renamed(nn.Module):
    """The fine layer's computation with its weight under another name: its own."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(3, 3, dtype=torch.float64))
        self.b = nn.Parameter(torch.zeros(3, dtype=torch.float64))

    def forward(self, u):
        return torch.tanh(u @ self.w.T + self.b)


@pytest.mark.parametrize("weights", ["average", "inject"])
def test_a_coarse_module_like_the_fine_one_takes_the_fine_parameters(weights):
    # fresh layers of the fine structure: every parameter follows the fine layers', so
    # the iterates equal the default coarse steps'; renamed ones keep their own (zero)
    # values and the iterates differ
    layers = [dense(n) for n in range(N)]
    opts = MGRITOptions(**OPTS, coarse_weights=weights, tol=0.0, max_iter=2)
    u0 = inputs(5, 3)
    with torch.no_grad():
        plain = LayerParallel(layers, T=T, mgrit=opts)(u0)
        same = LayerParallel(layers, T=T, mgrit=opts,
                             coarse_steps=lambda c: dense(100 + c.index))(u0)
        own = LayerParallel(layers, T=T, mgrit=opts, coarse_steps=lambda c: Renamed())(u0)
    assert close(same, plain, 1e-14)
    assert not close(own, plain, 1e-6)


def test_coarse_modules_follow_the_states_dtype():
    layers = [dense(n).float() for n in range(N)]
    mod = LayerParallel(layers, T=T, mgrit=MGRITOptions(**OPTS, tol=0.0, max_iter=2),
                        coarse_steps=lambda c: Renamed())
    assert mod(inputs(5, 3).float()).dtype == torch.float32


def test_bad_coarse_steps_are_refused_with_the_value():
    layers = [dense(n) for n in range(N)]
    with pytest.raises(ConfigError, match="coarse_steps=Linear"):
        LayerParallel(layers, T=T, mgrit=MGRITOptions(**OPTS), coarse_steps=nn.Linear(3, 3))
    wrong = LayerParallel(layers, T=T, mgrit=MGRITOptions(**OPTS),
                          coarse_steps=lambda c: nn.Sequential(nn.Linear(2, 3), nn.Tanh()))
    with pytest.raises(ConfigError, match=r"'0.weight' has shape \(3, 2\)"):
        wrong(inputs(5, 3))
    returns_none = LayerParallel(layers, T=T, mgrit=MGRITOptions(**OPTS),
                                 coarse_steps=lambda c: None)
    with pytest.raises(ConfigError, match="returned NoneType"):
        returns_none(inputs(5, 3))


def named_coarse(c: CoarseStep) -> nn.Module:
    return Renamed()


def test_a_named_coarse_factory_pickles_and_a_lambda_is_refused_in_one_line():
    """torch.save(module) of a LayerParallel built with coarse_steps=lambda failed with
    pickle's "Can't pickle <function <lambda> ...>: attribute lookup <lambda> on ...
    failed", naming neither the argument nor the remedy. A named function pickles
    (outputs bitwise); deepcopy takes a lambda as before."""
    layers = [dense(n) for n in range(N)]
    opts = MGRITOptions(**OPTS, tol=0.0, max_iter=2)
    u0 = inputs(5, 3)
    named = LayerParallel(layers, T=T, mgrit=opts, coarse_steps=named_coarse)
    buffer = io.BytesIO()
    torch.save(named, buffer)
    buffer.seek(0)
    with torch.no_grad():
        assert torch.equal(torch.load(buffer, weights_only=False)(u0), named(u0))
    anonymous = LayerParallel(layers, T=T, mgrit=opts, coarse_steps=lambda c: Renamed())
    with pytest.raises(pickle.PicklingError, match=r"^coarse_steps=<lambda> cannot be "
                       r"pickled \(torch.save\(module\), multiprocessing\): .*; give "
                       r"a named function") as caught:
        torch.save(anonymous, io.BytesIO())
    assert "\n" not in str(caught.value)
    with torch.no_grad():
        assert torch.equal(copy.deepcopy(anonymous)(u0), anonymous(u0))


class WithCoarse(nn.Module):
    """A user's network whose coarse factory refers to the network itself: a bound
    method, or a partial holding the network."""

    def __init__(self, partial: bool):
        super().__init__()
        factory = functools.partial(own_coarse, self) if partial else self.coarse
        self.lp = LayerParallel([dense(n) for n in range(N)], T=T, coarse_steps=factory,
                                mgrit=MGRITOptions(**OPTS, tol=0.0, max_iter=2))

    def coarse(self, c: CoarseStep) -> nn.Module:
        return own_coarse(self, c)

    def forward(self, u):
        return self.lp(u)


def own_coarse(net: nn.Module, c: CoarseStep) -> nn.Module:
    # parameters of its own (no fine layer's name), drawn by the seeded factory
    return nn.Sequential(nn.Tanh(), nn.Linear(3, 3)).double()


@pytest.mark.parametrize("partial", [False, True])
def test_a_factory_that_holds_the_module_pickles_with_it(partial):
    """The pickling check pickled the factory in a pickler of its own: a bound method
    (coarse_steps=self.coarse) or a partial holding the network pickled the network
    again, which checked again, until RecursionError. It saves and loads now, and the
    loaded network's output is bitwise the same."""
    net, u0 = WithCoarse(partial), inputs(5, 3)
    with torch.no_grad():
        before = net(u0)
    buffer = io.BytesIO()
    torch.save(net, buffer)
    buffer.seek(0)
    with torch.no_grad():
        assert torch.equal(torch.load(buffer, weights_only=False)(u0), before)


def test_copy_copy_takes_a_lambda_factory():
    """copy.copy went through __reduce_ex__, which refuses a lambda since pickling was
    checked: a shallow copy keeps the factory and the built modules instead."""
    steps = CoarseSteps(lambda c: Renamed())
    step = CoarseStep(level=1, index=0, layers=range(0, 2), h=0.5)
    built, _ = steps.module(step, inputs(5, 3), {})
    other = copy.copy(steps)
    assert other.factory is steps.factory
    assert other.module(step, inputs(5, 3), {})[0] is built


def test_stacked_fine_steps_and_coarse_steps_give_the_unstacked_iterates():
    layers = [dense(n) for n in range(N)]
    opts = MGRITOptions(**OPTS, tol=0.0, max_iter=2)
    u0 = inputs(5, 3)
    with torch.no_grad():
        got = [LayerParallel(layers, T=T, mgrit=opts, stack=stack,
                             coarse_steps=lambda c: Renamed())(u0) for stack in (True, False)]
    assert close(got[0], got[1], 1e-13)
