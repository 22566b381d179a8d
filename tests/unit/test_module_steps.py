"""ModuleSteps: user modules as residual steps, their VJPs and stacked steps; the adjoint
propagator's parameter products."""
import pytest
import torch
from torch import nn

from helpers import PairLayer, WiderLayer
from lptrain.errors import ConfigError
from lptrain.model.module_steps import ModuleSteps
from lptrain.parallel.module_propagators import ModuleAdjoint


def conv_gn(n: int) -> nn.Module:
    torch.manual_seed(100 + n)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.Tanh(),
                         nn.Conv2d(4, 3, 3, padding=1)).double()


def state(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


def test_a_factory_builds_only_the_layers_asked_for():
    built = []
    steps = ModuleSteps(lambda n: built.append(n) or nn.Linear(2, 2), n_layers=6, build=[2, 3])
    assert built == [2, 3] and steps.built == [2, 3]
    with pytest.raises(IndexError, match="layer 4 is not built"):
        steps.params(4)
    steps.ensure(4)
    assert steps.built == [2, 3, 4]
    # kept while a layer is left to build (here: 0, 1, 5, a halo too), then let go
    for n in (0, 1):
        steps.ensure(n)
    assert steps._factory is not None
    steps.ensure(5, halo=True)
    assert steps._factory is None and steps.ensure(5) is steps.halo[5]


def test_bad_layers_are_refused():
    with pytest.raises(ConfigError, match="n_layers"):
        ModuleSteps(lambda n: nn.Linear(2, 2))
    with pytest.raises(ConfigError, match="nn.Module"):
        ModuleSteps([nn.Linear(2, 2), "no"])
    with pytest.raises(ValueError, match="keep the shape"):
        ModuleSteps([nn.Linear(2, 3)]).step(torch.zeros(1, 2), 0, 0.1)


@pytest.mark.parametrize("stack", [False, True])
def test_a_branch_that_returns_no_state_update_is_refused_in_one_line(stack):
    """A tuple was torch's AttributeError ('tuple' object has no attribute 'shape'),
    which on several ranks ended every rank; a branch that returned another dtype was
    cast back into the state silently, where serial() failed."""
    u = torch.zeros(2, 1, 2)
    for module, message in ((PairLayer, "layer 0 maps a state to a tuple, not a tensor"),
                            (WiderLayer, "layer 0 maps a torch.float32 state to torch.float64")):
        steps = ModuleSteps([module(2, 2), module(2, 2)], stack=stack)
        with pytest.raises(ValueError, match=message):
            steps.step_many(u, [0, 1], [0.1, 0.1], [None, None])
    with torch.autocast("cpu", dtype=torch.bfloat16):       # autocast's casts: allowed
        ModuleSteps([nn.Linear(2, 2)]).step(torch.zeros(1, 2), 0, 0.1)


def test_step_and_vjps_equal_autograd():
    steps = ModuleSteps(conv_gn, n_layers=3)
    u, lam = state(2, 3, 5, 5), state(2, 3, 5, 5, seed=1)
    x = u.clone().requires_grad_()
    y = x + 0.3 * steps.modules["1"](x)
    assert torch.allclose(steps.step(u, 1, 0.3), y, rtol=1e-14, atol=1e-15)
    params = list(steps.modules["1"].parameters())
    want = torch.autograd.grad(steps.modules["1"](x), [x, *params], lam)
    lin = steps.linearize(u, 1, params=True)
    assert torch.allclose(lin.vjp_state(lam), want[0], rtol=1e-13, atol=1e-14)
    got = list(lin.vjp_params(lam).values())
    for a, b in zip(got, want[1:]):
        assert torch.allclose(a, b, rtol=1e-13, atol=1e-14)



def test_one_backward_pass_gives_both_products_exactly():
    steps = ModuleSteps(conv_gn, n_layers=2)
    u, lam = state(2, 3, 5, 5), state(2, 3, 5, 5, seed=1)
    lin = steps.linearize(u, 0, params=True)
    g, grads = lin.vjp_both(lam)
    assert torch.equal(g, lin.vjp_state(lam))
    want = lin.vjp_params(lam)
    assert grads.keys() == want.keys() and all(torch.equal(grads[k], want[k]) for k in want)


@pytest.mark.parametrize("same", [True, False])
def test_the_last_sweeps_parameter_products_are_used_only_at_their_lambda(same):
    # a fixed solve's last sweep takes an owned layer's parameter product with its state
    # product; param_grads uses it only where its λ is the one the step saw
    steps = ModuleSteps(conv_gn, n_layers=3)
    us = [state(2, 3, 5, 5, seed=n) for n in range(4)]
    lam, other = state(2, 3, 5, 5, seed=7), state(2, 3, 5, 5, seed=8)
    adj = ModuleAdjoint(steps, 0.5, 3, lambda n: us[n], False, owned=[1], fixed=True)
    calls = []
    plain = adj.linear(1).vjp_params
    adj.linear(1).vjp_params = lambda lam_: calls.append(1) or plain(lam_)
    stepped = adj.step(lam, 1, 2, last=True)            # mirrored 1 → 2: layer 3 − 2 = 1
    assert torch.equal(stepped, torch.add(lam, adj.linear(1).vjp_state(lam), alpha=0.5))
    at = lam if same else other
    got = adj.param_grads(1, at)
    want = {k: 0.5 * g for k, g in plain(at).items()}
    assert len(calls) == (0 if same else 1)
    assert all(torch.equal(got[k], want[k]) for k in want)

def test_averaged_parameters_and_flat_round_trip():
    steps = ModuleSteps([nn.Linear(2, 2).double() for _ in range(3)])
    mean = steps.mean_params([0, 2])
    assert torch.allclose(mean["weight"], (steps.params(0)["weight"]
                                           + steps.params(2)["weight"]) / 2)
    vec = steps.flat(0)
    steps.load_flat(1, vec)
    assert torch.equal(steps.flat(1), vec)


def test_flat_carries_buffers_and_training_flags():
    # a borrowed layer computes as its owner's: running statistics and eval mode too
    steps = ModuleSteps([nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)).double()
                         for _ in range(2)])
    owner, copy = steps.module(0), steps.module(1)
    with torch.no_grad():
        owner[1].running_mean.fill_(0.5)
    owner[1].eval()
    steps.load_flat(1, steps.flat(0))
    assert torch.equal(copy[1].running_mean, owner[1].running_mean)
    assert [m.training for m in copy.modules()] == [True, True, False]
    u = state(3, 2)
    assert torch.equal(copy(u), owner(u))
    with pytest.raises(ValueError, match="layer 1: 3 values for 18 parameters, buffers"):
        steps.load_flat(1, torch.zeros(3))


@pytest.mark.parametrize("make", [conv_gn, lambda n: nn.Linear(75, 75).double()])
def test_stacked_steps_equal_one_layer_at_a_time(make):
    shape = (2, 3, 5, 5) if make is conv_gn else (2, 75)
    one = ModuleSteps(make, n_layers=4)
    many = ModuleSteps(list(one.modules.values()), stack=True)
    U = state(3, *shape)
    ns, hs = [0, 2, 3], [0.1, 0.2, 0.1]
    Ps = [one.params(n) for n in ns]
    ref = one.step_many(U, ns, hs, Ps)
    for i, n in enumerate(ns):
        assert torch.equal(ref[i], one.step(U[i], n, hs[i]))
    assert torch.allclose(many.step_many(U, ns, hs, Ps), ref, rtol=1e-12, atol=1e-13)


def test_a_factory_layer_starts_the_same_whichever_layers_were_built_before():
    torch.manual_seed(3)
    all_layers = ModuleSteps(lambda n: nn.Linear(2, 2), n_layers=4)
    after_all = torch.rand(1)
    torch.manual_seed(3)
    some = ModuleSteps(lambda n: nn.Linear(2, 2), n_layers=4, build=[3])
    assert torch.equal(torch.rand(1), after_all)        # one draw, whatever was built
    assert torch.equal(some.flat(3), all_layers.flat(3))
    assert not torch.equal(all_layers.flat(2), all_layers.flat(3))


class Checkpointed(nn.Module):
    """f_n with activation checkpointing: its backward recomputes f."""

    def __init__(self, n: int):
        super().__init__()
        self.f = conv_gn(n)

    def forward(self, u):       # (use_reentrant=True: torch refuses autograd.grad)
        return torch.utils.checkpoint.checkpoint(self.f, u, use_reentrant=False)


def test_checkpointed_layers_linearise_at_averaged_parameters():
    # a coarse step's mean parameters go in by functional_call; the products, where f's
    # backward recomputes it, must see them again (not the layer's own)
    plain = ModuleSteps([conv_gn(n) for n in range(2)])
    ckpt = ModuleSteps([Checkpointed(n) for n in range(2)])
    u, lam = state(2, 3, 5, 5), state(2, 3, 5, 5, seed=1)
    P = plain.mean_params([0, 1])
    Q = {"f." + k: v for k, v in P.items()}
    want, got = plain.linearize(u, 0, P, params=True), ckpt.linearize(u, 0, Q, params=True)
    assert torch.equal(got.y, want.y)
    assert torch.allclose(got.vjp_state(lam), want.vjp_state(lam), rtol=0, atol=1e-14)
    g_want, g_got = want.vjp_params(lam), got.vjp_params(lam)
    assert all(torch.allclose(g_got["f." + k], g, rtol=0, atol=1e-14)
               for k, g in g_want.items())


class _Wire:
    """Two ranks' point-to-point messages in one process; a receive whose buffer differs
    in dtype or size from what was sent fails, as MPI's unpacking did (an MPICH
    assertion and an abort)."""

    def __init__(self, rank):
        self.rank, self.sent = rank, {}

    def send(self, t, dest):
        self.sent.setdefault(dest, []).append(t.clone())

    def recv(self, template, source):
        sent = self.peer.sent[self.rank].pop(0)
        assert (sent.dtype, sent.numel()) == (template.dtype, template.numel())
        return sent

    def wait(self):
        pass


def test_a_layer_without_parameters_crosses_ranks_in_its_owners_dtype():
    """float64 layers around an nn.Identity(): its owner sent its training flags in the
    default dtype (float32), the receiver sized the buffer in float64."""
    from lptrain.parallel.halo import share_params

    def layers():
        torch.manual_seed(0)
        return [nn.Linear(2, 2).double(), nn.Identity(), nn.Linear(2, 2).double()]
    owner, receiver = ModuleSteps(layers()), ModuleSteps(layers())
    a, b = _Wire(0), _Wire(1)
    a.peer, b.peer = b, a
    plan = [(1, 0, 1), (2, 0, 1)]
    share_params(owner, plan, a)
    share_params(receiver, plan, b)
    assert torch.equal(receiver.flat(2), owner.flat(2))
    assert torch.equal(receiver.flat(1), owner.flat(1))
