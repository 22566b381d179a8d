"""The fast convolution products of the conv adjoint against their definitions."""
import pytest
import torch

from lptrain.model.conv_ops import FastConvOps, ReferenceConvOps
from lptrain.model.steps import ConvSteps
from lptrain.model.activations import ACTIVATIONS


def _tensors(batch=3, c=4, side=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    draw = (lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64))
    return draw(batch, c, side, side), draw(batch, c, side, side), draw(c, c, 3, 3)


def test_fast_products_equal_the_reference():
    u, g, K = _tensors()
    for h in (1.0, 0.37):
        ref, fast = ReferenceConvOps.input_vjp(g, K, h), FastConvOps.input_vjp(g, K, h)
        assert torch.allclose(fast, ref, rtol=1e-13, atol=1e-13)
    ref, fast = ReferenceConvOps.weight_vjp(u, g), FastConvOps.weight_vjp(u, g)
    assert torch.allclose(fast, ref, rtol=1e-13, atol=1e-13)


def test_the_products_are_the_adjoint_of_the_convolution():
    # ⟨g, K ⋆ u⟩ = ⟨Kᵀg, u⟩ and its derivative in K, by autograd: both forms
    u, g, K = _tensors(seed=1)
    K = K.requires_grad_()
    u = u.requires_grad_()
    inner = (g * torch.nn.functional.conv2d(u, K, padding=1)).sum()
    du, dK = torch.autograd.grad(inner, (u, K))
    for ops in (ReferenceConvOps, FastConvOps):
        assert torch.allclose(ops.input_vjp(g, K.detach(), 1.0), du, rtol=1e-13, atol=1e-13)
        assert torch.allclose(ops.weight_vjp(u.detach(), g), dK, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("stacked", [False, True])
def test_conv_steps_adjoint_is_the_same_with_either_form(stacked, monkeypatch):
    u, lam, K = _tensors(seed=2)
    m = 3
    Ks = torch.stack([K * (1 + 0.1 * i) for i in range(m)])
    b = torch.zeros(m, 4, dtype=torch.float64)
    hs = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    results = []
    for ops in (ReferenceConvOps, FastConvOps):
        monkeypatch.setattr(ConvSteps, "conv_ops", ops)
        steps = ConvSteps(Ks, b, ACTIVATIONS["tanh"])
        if stacked:
            U, L = torch.stack([u] * m), torch.stack([lam] * m)
            saved = steps.linearize(U, steps.K, steps.b)
            results.append((steps.vjp_saved(saved, L, steps.K, hs),
                            *steps.vjp_weights(U, L)))
        else:
            saved = steps.linearize(u, steps.K[0], steps.b[0])
            results.append((steps.vjp_saved(saved, lam, steps.K[0], 0.25),
                            *steps.vjp_weights(u, lam)))
    for ref, fast in zip(*results):
        assert torch.allclose(fast, ref, rtol=1e-13, atol=1e-13)
