"""LayerParallel with layers that hold state or draw numbers: frozen parameters, batch
norm, spectral norm and dropout give serial's outputs, gradients and statistics."""
import pytest
import torch
from torch import nn

from helpers import CONVERGED, close, dense, drawn, grads, inputs
from lptrain import LayerParallel, MGRITOptions


def frozen(n):
    """dense with its bias frozen, and layer 2 frozen whole (as in fine-tuning)."""
    m = dense(n)
    m[0].bias.requires_grad_(False)
    return m.requires_grad_(False) if n == 2 else m


@pytest.mark.parametrize("opts", [CONVERGED, dict(CONVERGED, tol=0.0, max_iter=30)],
                         ids=["converged", "fixed"])
def test_frozen_parameters_get_no_gradient_and_stay_put(opts):
    # was: autograd's "One of the differentiated Tensors does not require grad"
    mod = LayerParallel(frozen, T=2.0, n_layers=8, mgrit=MGRITOptions(**opts))
    u0 = inputs(4, 3).requires_grad_()
    mod(u0).pow(2).sum().backward()
    got = [u0.grad, *(p.grad for p in mod.parameters())]
    mod.zero_grad(set_to_none=True)
    u0.grad = None
    mod.serial(u0).pow(2).sum().backward()
    want = [u0.grad, *(p.grad for p in mod.parameters())]
    assert [g is None for g in got] == [g is None for g in want] == \
        [False, *(not p.requires_grad for p in mod.parameters())]
    assert sum(g is None for g in got) == 7 + 2
    assert all(close(a, b) for a, b in zip(got, want) if b is not None)
    before = [p.detach().clone() for p in mod.parameters()]
    torch.optim.Adam(mod.parameters(), lr=0.1).step()
    assert [torch.equal(a, p) for a, p in zip(before, mod.parameters())] == \
        [not p.requires_grad for p in mod.parameters()]


def batchnormed(n):
    # no bias before the normalisation: its gradient would be round-off (BN takes the mean)
    return drawn(nn.Sequential(nn.Linear(3, 3, bias=False), nn.BatchNorm1d(3),
                               nn.Tanh()).double(), n)


@pytest.mark.parametrize("opts", [CONVERGED, dict(CONVERGED, tol=0.0, max_iter=30)],
                         ids=["converged", "fixed"])
def test_batchnorm_in_training_mode_updates_its_statistics_as_serial(opts):
    # MGRIT runs each f many times per solve; the running statistics were updated at
    # every evaluation (10 batches counted a forward, means 0.08 off serial's)
    mods = [LayerParallel(batchnormed, T=2.0, n_layers=8, mgrit=MGRITOptions(**opts))
            for _ in range(2)]
    for step in range(2):
        u0 = inputs(6, 3, seed=step).requires_grad_()
        got = grads(mods[0](u0).pow(2).sum(), mods[0], u0)
        want = grads(mods[1].serial(u0).pow(2).sum(), mods[1], u0)
        assert all(close(a, b) for a, b in zip(got, want, strict=True))
    stats = [{k: v for k, v in m.state_dict().items() if "running" in k or "batches" in k}
             for m in mods]
    assert len(stats[0]) == 3 * 8 and all(int(v) == 2 for k, v in stats[0].items()
                                          if "batches" in k)
    assert all(close(stats[0][k].double(), v.double()) for k, v in stats[1].items())
    for m in mods:
        m.eval()
    u1 = inputs(6, 3, seed=5)
    with torch.no_grad():
        assert close(mods[0](u1), mods[1].serial(u1))


def spectral(n):
    from torch.nn.utils.parametrizations import spectral_norm
    m = dense(n)
    return nn.Sequential(spectral_norm(m[0]), m[1])


@pytest.mark.parametrize("opts", [CONVERGED, dict(CONVERGED, tol=0.0, max_iter=30)],
                         ids=["converged", "fixed"])
def test_spectral_norm_takes_one_power_iteration_per_forward_as_serial(opts):
    # each evaluation of f took a power iteration of its own: f changed from call to
    # call (28 iterations to tol, outputs 0.04 off serial's)
    import copy
    mod = LayerParallel(spectral, T=2.0, n_layers=8, mgrit=MGRITOptions(**opts))
    u0 = inputs(5, 3).requires_grad_()
    start = copy.deepcopy(mod.state_dict())
    got = grads(mod(u0).pow(2).sum(), mod, u0)
    assert mod.last_forward.iterations <= (10 if opts["tol"] > 0 else 30)
    after = copy.deepcopy(mod.state_dict())
    mod.load_state_dict(start)
    want = grads(mod.serial(u0).pow(2).sum(), mod, u0)
    assert all(close(a, b) for a, b in zip(got, want, strict=True))
    assert all(close(v, mod.state_dict()[k]) for k, v in after.items())


def dropped(n):
    return nn.Sequential(*dense(n), nn.Dropout(0.3))


@pytest.mark.parametrize("opts, stack", [(CONVERGED, False), (CONVERGED, True),
                                         (dict(CONVERGED, tol=0.0, max_iter=30), False)],
                         ids=["converged", "stacked", "fixed"])
def test_dropout_draws_one_mask_per_layer_and_forward(opts, stack):
    # each evaluation of f drew a new mask: the forward solve did not converge (residual
    # 1.5 after 20 iterations), silently
    mod = LayerParallel(dropped, T=2.0, n_layers=8, mgrit=MGRITOptions(**opts), stack=stack)
    u0 = inputs(6, 3).requires_grad_()
    out = mod(u0)
    assert mod.last_forward.residual <= 1e-12
    mod.generator.manual_seed(3)
    out = mod(u0)
    got = grads(out.pow(2).sum(), mod, u0)
    mod.generator.manual_seed(3)        # serial() then draws the forward's masks
    ref = mod.serial(u0)
    want = grads(ref.pow(2).sum(), mod, u0)
    assert close(out, ref) and all(close(a, b) for a, b in zip(got, want, strict=True))
    with torch.no_grad():
        assert not close(mod(u0), out, 1e-3)             # the next forward: new masks
        mod.eval()
        assert torch.equal(mod(u0), mod(u0)) and close(mod(u0), mod.serial(u0))


def conv_dropped(n):
    torch.manual_seed(70 + n)
    return nn.Sequential(nn.Conv2d(2, 2, 3, padding=1), nn.Tanh(), nn.Dropout(0.3),
                         nn.Conv2d(2, 2, 3, padding=1)).double()


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "transposed"])
def test_dropout_on_image_states_gives_the_gradient_of_the_forward_it_ran(layout):
    """The adjoint linearised 4-d states in channels_last order, and dropout draws its
    mask in memory order: the same seed dropped other pixels than in the forward, and
    the gradient was off by 2 % (a conv step with dropout), silently."""
    mod = LayerParallel(conv_dropped, T=1.0, n_layers=4, mgrit=MGRITOptions(**CONVERGED))
    u0 = inputs(3, 2, 5, 5)
    u0 = {"contiguous": u0, "channels_last": u0.contiguous(memory_format=torch.channels_last),
          "transposed": u0.transpose(2, 3).contiguous().transpose(2, 3)}[layout]
    u0.requires_grad_()
    w = inputs(3, 2, 5, 5, seed=1)
    mod.generator.manual_seed(3)
    got = grads((mod(u0) * w).sum(), mod, u0)
    mod.generator.manual_seed(3)
    want = grads((mod.serial(u0) * w).sum(), mod, u0)
    assert all(close(a, b) for a, b in zip(got, want, strict=True))
