"""LayerParallel on one rank under autograd: gradcheck, several forwards before one
backward, no_grad, replaced and changed parameters, dtypes, fixed iterations and the
warnings and refusals of solves and second derivatives."""
import warnings

import pytest
import torch
from torch import nn

from helpers import CONVERGED, close, dense, grads, inputs
from lptrain import LayerParallel, MGRITOptions


# -- the module --------------------------------------------------------------------------
def test_gradcheck_on_a_tiny_case():
    mod = LayerParallel(lambda n: dense(n, 2), T=1.0, n_layers=4,
                        mgrit=MGRITOptions(levels=2, cfactor0=2, tol=1e-14, max_iter=80))
    u0 = inputs(2, 2).requires_grad_()
    params = list(mod.parameters())

    def f(u, *ps):
        return mod(u)

    assert torch.autograd.gradcheck(f, (u0, *params), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_several_forwards_before_one_backward():
    mod = LayerParallel(dense, T=2.0, n_layers=8, mgrit=MGRITOptions(**CONVERGED))
    u1, u2 = inputs(4, 3, seed=1).requires_grad_(), inputs(5, 3, seed=2).requires_grad_()
    loss = (mod(u1) ** 2).sum() + mod(u2).sin().sum()
    with torch.no_grad():
        mod(u2 * 3)                                   # an evaluation in between
    got = torch.autograd.grad(loss, [u1, u2, *mod.parameters()])
    ref = (mod.serial(u1) ** 2).sum() + mod.serial(u2).sin().sum()
    want = torch.autograd.grad(ref, [u1, u2, *mod.parameters()])
    assert all(close(a, b) for a, b in zip(got, want))


def test_no_grad_evaluation_keeps_the_training_warm_start():
    mod = LayerParallel(dense, T=2.0, n_layers=8, warm_start=True,
                        mgrit=MGRITOptions(levels=2, cfactor0=2, tol=0.0, max_iter=2))
    u0 = inputs(4, 3)
    mod(u0).sum().backward()
    warm = mod._warm[0].clone()
    with torch.no_grad():
        out = mod(inputs(4, 3, seed=5))
    # (row 0 is u_0, which every solve writes into its warm start)
    assert not out.requires_grad and torch.equal(mod._warm[0][1:], warm[1:])


def _sgd_losses(between) -> list[float]:
    """Six SGD steps of one-shot training (warm starts, one MGRIT iteration a solve),
    `between(mod)` run after each step."""
    torch.manual_seed(0)
    mod = LayerParallel(dense, T=2.0, n_layers=8, warm_start=True,
                        mgrit=MGRITOptions(levels=2, cfactor0=2, tol=0.0, max_iter=1,
                                           adj_max_iter=1))
    opt = torch.optim.SGD(mod.parameters(), lr=0.05)
    u0, losses = inputs(6, 3), []
    for _ in range(6):
        opt.zero_grad()
        loss = (mod(u0) ** 2).sum()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        between(mod)
    return losses


def _eval_forward(batch: int, backward: bool):
    def between(mod):
        mod.eval()
        u = inputs(batch, 3, seed=9).requires_grad_()
        out = mod(u).sum()            # with gradients on: validation without no_grad
        if backward:
            out.backward()            # a saliency map: the input's gradient
        mod.zero_grad()
        mod.train()
    return between


@pytest.mark.parametrize("batch, backward", [(6, False), (2, False), (6, True)])
def test_an_eval_mode_forward_leaves_the_training_warm_starts(batch, backward):
    """An eval-mode forward with gradients on replaced the training warm start: a
    validation batch of another shape made every next training solve cold (losses
    1.6e-2 apart), one of the same shape moved them by 1e-3 (held-out check)."""
    plain = _sgd_losses(lambda mod: None)
    assert _sgd_losses(_eval_forward(batch, backward)) == plain
    cold = _sgd_losses(lambda mod: mod._warm.__setitem__(0, None))   # the test can fail
    assert cold != plain


def test_in_place_parameter_changes_before_backward_are_refused():
    mod = LayerParallel(dense, T=1.0, n_layers=4, mgrit=MGRITOptions(levels=2, cfactor0=2))
    loss = mod(inputs(2, 3)).sum()
    with torch.no_grad():
        next(mod.parameters()).add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("replace", ["parameter", "submodule", "layer"])
def test_a_replaced_parameter_is_the_one_differentiated(replace):
    """After a forward, a layer's parameter, submodule or whole module replaced by a new
    object: the next forward differentiates the new one (as serial does)."""
    mod = LayerParallel(dense, T=1.0, n_layers=4, mgrit=MGRITOptions(**CONVERGED))
    u0 = inputs(2, 3).requires_grad_()
    grads(mod(u0).sum(), mod, u0)
    if replace == "parameter":
        mod.layers["1"][0].weight = nn.Parameter(torch.full((3, 3), 0.3, dtype=torch.float64))
    elif replace == "submodule":
        mod.layers["2"][0] = dense(7)[0]
    else:
        mod.layers["3"] = dense(8)
    got, want = grads(mod(u0).sum(), mod, u0), grads(mod.serial(u0).sum(), mod, u0)
    assert len(got) == 1 + 8 and all(close(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("dtype, rel", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_float32_and_float64(dtype, rel):
    opts = dict(CONVERGED, tol=1e-6 if dtype == torch.float32 else 1e-13)
    mod = LayerParallel(lambda n: dense(n, dtype=dtype), T=2.0, n_layers=8,
                        mgrit=MGRITOptions(**opts))
    u0 = inputs(4, 3, dtype=dtype).requires_grad_()
    out = mod(u0)
    assert out.dtype == dtype
    got, want = grads(out.pow(2).sum(), mod, u0), grads(mod.serial(u0).pow(2).sum(), mod, u0)
    assert close(out, mod.serial(u0), rel) and all(close(a, b, rel) for a, b in zip(got, want))


@pytest.mark.parametrize("iters", [1, 30])
def test_fixed_iterations_reuse_the_forwards_linearisations(iters):
    # a fixed solve leaves f's graphs at its returned states for the adjoint: the
    # gradient equals that of recomputed graphs (no keep), exactly, and after enough
    # iterations serial's
    opts = dict(levels=3, cfactor0=2, cfactor=2, tol=0.0, max_iter=iters)
    mod = LayerParallel(dense, T=2.0, n_layers=8, mgrit=MGRITOptions(**opts))
    u0 = inputs(4, 3).requires_grad_()
    got = grads(mod(u0).pow(2).sum(), mod, u0)
    assert len(mod.solver.plan) == 0 and mod.last_forward.iterations == iters
    solver_forward = mod.solver.forward
    mod.solver.forward = lambda *a, keep=None, **kw: solver_forward(*a, keep=None, **kw)
    again = grads(mod(u0).pow(2).sum(), mod, u0)
    assert all(torch.allclose(a, b, rtol=1e-14, atol=1e-15) for a, b in zip(got, again))
    if iters == 30:
        want = grads(mod.serial(u0).pow(2).sum(), mod, u0)
        assert all(close(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("iters", [1, 3])
def test_a_fixed_adjoint_takes_parameter_products_in_its_last_sweep(iters, monkeypatch):
    # the last adjoint sweep's fused products replace every separate parameter product,
    # and the gradients are bitwise those of separate products
    from lptrain.model.module_vjp import Linear
    from lptrain.parallel import module_propagators
    opts = dict(levels=3, cfactor0=2, cfactor=2, tol=0.0, max_iter=iters)
    mod = LayerParallel(dense, T=2.0, n_layers=8, mgrit=MGRITOptions(**opts))
    u0 = inputs(4, 3).requires_grad_()
    calls = []
    vjp_params = Linear.vjp_params
    monkeypatch.setattr(Linear, "vjp_params", lambda *a: calls.append(1) or vjp_params(*a))
    fused = grads(mod(u0).pow(2).sum(), mod, u0)
    assert calls == []
    init = module_propagators.ModuleAdjoint.__init__

    def unfused(self, *a, **k):
        init(self, *a, **k)
        self.fixed = False
    monkeypatch.setattr(module_propagators.ModuleAdjoint, "__init__", unfused)
    separate = grads(mod(u0).pow(2).sum(), mod, u0)
    assert len(calls) == 8 and all(torch.equal(a, b) for a, b in zip(fused, separate))


def test_a_solve_that_misses_its_tolerance_warns():
    mod = LayerParallel(dense, T=2.0, n_layers=8,
                        mgrit=MGRITOptions(**dict(CONVERGED, max_iter=2)))
    u0 = inputs(4, 3).requires_grad_()
    with pytest.warns(RuntimeWarning, match=r"the forward MGRIT solve stopped after 2 "
                                            r"iterations at residual .* \(tol=1e-13"):
        out = mod(u0)
    with pytest.warns(RuntimeWarning, match="the adjoint MGRIT solve stopped after 2"):
        out.sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mod(u0, max_iter=60)                              # converged: silent
        mod.exchange.rank = 1           # rank 1 of a job: rank 0 warns for both (each did)
        mod(u0)
        LayerParallel(dense, T=2.0, n_layers=8,           # fixed iterations: by design
                      mgrit=MGRITOptions(**dict(CONVERGED, tol=0.0, max_iter=2)))(u0)


def test_a_second_derivative_is_refused():
    mod = LayerParallel(dense, T=1.0, n_layers=4, mgrit=MGRITOptions(levels=2, cfactor0=2))
    u0 = inputs(2, 3).requires_grad_()
    (g,) = torch.autograd.grad(mod(u0).pow(2).sum(), u0, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        g.sum().backward()
