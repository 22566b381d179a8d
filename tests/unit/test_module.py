"""LayerParallelResNet: MGRIT forward/backward equal the serial autograd network; a
LayerParallel of the built-in dense steps (several forwards, state dicts)."""
import pytest
import torch

from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.module import LayerParallelResNet, initial_weights


def make(**kw):
    opts = MGRITOptions(levels=3, cfactor0=2, cfactor=2, tol=1e-12, max_iter=40)
    return LayerParallelResNet(width=4, layers=20, T=2.0, mgrit=opts, init_scale=0.5, **kw)


def test_module_matches_serial_autograd():
    mod = make()
    gen = torch.Generator().manual_seed(0)
    u0 = torch.randn(6, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    target = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    out = mod(u0)
    loss = ((out - target) ** 2).sum()
    got = torch.autograd.grad(loss, (u0, *mod.parameters()))
    ref = mod.serial(u0)
    rloss = ((ref - target) ** 2).sum()
    want = torch.autograd.grad(rloss, (u0, *mod.parameters()))
    assert torch.allclose(out, ref, rtol=1e-10, atol=1e-12)
    assert len(got) == 1 + 2 * 20
    for a, b in zip(got, want, strict=True):
        assert float((a - b).abs().max()) <= 1e-10 * float(b.abs().max())
    assert mod.last_forward.converged and mod.last_backward.converged


def _train(mod, steps=4):
    """SGD on one batch: the losses and each step's (forward, adjoint) MGRIT iterations."""
    opt = torch.optim.SGD(mod.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    u0 = torch.randn(8, 4, generator=gen, dtype=torch.float64)
    losses, iters = [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = (mod(u0) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        iters.append((mod.last_forward.iterations, mod.last_backward.iterations))
    return losses, iters


def test_module_trains_with_a_torch_optimizer_and_warm_starts():
    # warm starts from the previous step's states and adjoints: the same training to the
    # solver's tolerance, in fewer iterations of both solves at every step after the first
    warm_losses, warm = _train(make(warm_start=True))
    cold_losses, cold = _train(make())
    assert warm_losses == pytest.approx(cold_losses, rel=1e-10)
    assert warm_losses[-1] < warm_losses[0]
    assert warm[0] == cold[0]
    for (wf, wa), (cf, ca) in zip(warm[1:], cold[1:]):
        assert wf < cf and wa < ca, (warm, cold)


def test_initial_weights_are_the_dense_networks():
    K, b = initial_weights(4, 20, 2.0, "tanh", "scalar", 0.5, 3, torch.float64)
    state = make(bias="scalar", seed=3).state_dict()
    assert torch.equal(torch.stack([state[f"layers.{n}.K"] for n in range(20)]), K)
    assert torch.equal(torch.stack([state[f"layers.{n}.b"] for n in range(20)]), b)
    assert b.shape == (20, 1) and not torch.equal(K, make(seed=4).state_dict()["layers.0.K"])


def test_several_forwards_before_one_backward():
    # e.g. an evaluation inside a training step: each forward keeps its own states
    mod = make()
    gen = torch.Generator().manual_seed(2)
    x1, x2 = (torch.randn(5, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    params = list(mod.parameters())
    one = [torch.autograd.grad((mod(x) ** 2).sum(), params) for x in (x1, x2)]
    both = torch.autograd.grad((mod(x1) ** 2).sum() + (mod(x2) ** 2).sum(), params)
    for a, b, c in zip(both, *one, strict=True):
        assert float((a - b - c).abs().max()) <= 1e-12 * float(a.abs().max())


def test_state_dict_round_trip_gives_the_same_network():
    mod, other = make(seed=1), make(seed=2)
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with torch.no_grad():
        assert not torch.allclose(mod(x), other(x))
        other.load_state_dict(mod.state_dict())
        assert torch.equal(mod(x), other(x))


def test_initial_weights_are_the_commands_with_the_pad_opening():
    """The README said 'the initial weights of `lptrain network=dense`': the command's
    dense opening draws its own weights first, so only `network.opening=pad` starts the
    same (and the docs now say so)."""
    from helpers import composed
    from lptrain.app import options
    from lptrain.model.network import ResNet
    K, b = initial_weights(4, 20, 2.0, "tanh", "vector", 0.5, 3, torch.float64)
    for opening, same in (("pad", True), ("dense", False)):
        opts = options(composed("network=dense", f"network.opening={opening}", "seed=3",
                                "network.width=4", "network.layers=20", "network.T=2.0",
                                "network.init_hidden=0.5"))
        net = ResNet(opts.network, (2,), 5)
        K_cli, b_cli = net.hidden_views(net.init_params(opts.seed, torch.float64))
        assert (torch.equal(K_cli, K) and torch.equal(b_cli, b)) == same, opening


def test_print_shows_depth_ranks_and_each_layers_kind_and_shape():
    """print(LayerParallelResNet(...)) was N lines of `StepperLayer()` (held-out check)."""
    text = str(LayerParallelResNet(width=3, layers=2, T=2.0, activation="relu"))
    assert text.splitlines() == [
        "LayerParallelResNet(",
        "  n_layers=2, T=2.0, ranks=1 (layers here: 0..1), warm_start=False",
        "  (layers): ModuleDict(",
        "    (0): StepperLayer(dense, K (3, 3), activation=relu)",
        "    (1): StepperLayer(dense, K (3, 3), activation=relu)",
        "  )", ")"]
