"""The torch module: MGRIT forward/backward equal the serial autograd network."""
import pytest
import torch

from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.module import LayerParallelResNet


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
    gu, gK, gb = torch.autograd.grad(loss, (u0, mod.K, mod.b))
    ref = mod.serial(u0)
    rloss = ((ref - target) ** 2).sum()
    ru, rK, rb = torch.autograd.grad(rloss, (u0, mod.K, mod.b))
    assert torch.allclose(out, ref, rtol=1e-10, atol=1e-12)
    for a, b in ((gu, ru), (gK, rK), (gb, rb)):
        assert float((a - b).norm() / b.norm()) <= 1e-8
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
