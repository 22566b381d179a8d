"""LayerParallel of lptrain's built-in steps (BuiltinSteps): a step family with its own
propagators, equal to serial autograd when converged and to the autograd path of the same
layers iteration by iteration; parameters, dtypes, several forwards, errors."""
import pytest
import torch

from lptrain import LayerParallel, MGRITOptions
from lptrain.errors import ConfigError
from lptrain.mgrit.protocols import StepFamily
from lptrain.parallel import module_propagators
from lptrain.parallel.builtin_steps import BuiltinSteps, StepperLayer
from lptrain.parallel.module_propagators import AutogradFamily
from lptrain.parallel.stepper_family import StepperFamily

N = 8
CONVERGED = dict(levels=3, cfactor0=2, cfactor=2, tol=1e-13, max_iter=60, adj_tol=1e-13,
                 adj_max_iter=60)
FIXED = dict(levels=3, cfactor0=2, cfactor=2, tol=0.0, max_iter=2, adj_max_iter=2)
# kind: (state shape, K's shape per layer, activation)
KINDS = {"dense": ((5, 4), (4, 4), "tanh"), "conv": ((2, 3, 5, 5), (3, 3, 3, 3), "relu")}


def weights(kind, seed=0, nb=None):
    gen = torch.Generator().manual_seed(seed)
    shape, k, _ = KINDS[kind]
    K = 0.4 * torch.randn(N, *k, generator=gen, dtype=torch.float64)
    b = 0.2 * torch.randn(N, nb or k[0], generator=gen, dtype=torch.float64)
    return K, b


def steps(kind, seed=0, nb=None):
    return BuiltinSteps(kind, *weights(kind, seed, nb), KINDS[kind][2])


def inputs(kind, seed=1):
    return torch.randn(*KINDS[kind][0], generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64)


def loss(out):
    return (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum() \
        + 0.5 * (out ** 2).sum()


def grads(mod, u0):
    u = u0.clone().requires_grad_()
    out = mod(u)
    g = torch.autograd.grad(loss(out), [u, *mod.parameters()])
    return [out.detach(), *g]


def serial_grads(mod, u0):
    u = u0.clone().requires_grad_()
    out = mod.serial(u)
    return [out.detach(), *torch.autograd.grad(loss(out), [u, *mod.parameters()])]


def close(xs, ys, rel=1e-10):
    return all(float((x - y).detach().abs().max())
               <= rel * max(float(y.detach().abs().max()), 1e-30)
               for x, y in zip(xs, ys, strict=True))


def test_the_families_meet_the_protocol():
    fam = steps("dense")
    assert isinstance(fam, StepFamily) and isinstance(StepperFamily(fam.stepper()), StepFamily)
    assert isinstance(AutogradFamily(fam), StepFamily)
    mod = LayerParallel(steps("dense"), T=1.0)
    assert mod.solver.family is mod.steps


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("coarse", ["inject", "average"])
@pytest.mark.parametrize("nb", [None, 1])
def test_converged_equals_serial_autograd(kind, coarse, nb):
    opts = MGRITOptions(**CONVERGED, coarse_weights=coarse)
    mod = LayerParallel(steps(kind, nb=nb), T=1.5, mgrit=opts)
    got, want = grads(mod, inputs(kind)), serial_grads(mod, inputs(kind))
    assert close(got, want)


@pytest.mark.parametrize("kind", list(KINDS))
def test_fixed_iterations_equal_the_autograd_path_of_the_same_layers(kind, monkeypatch):
    """Same iterates as LayerParallel of the same layers as plain modules (autograd's
    propagators), over two warm-started steps; fails if the family's propagators were
    not used (the autograd path is switched off for it)."""
    K, b = weights(kind)
    act = KINDS[kind][2]
    fam = LayerParallel(BuiltinSteps(kind, K, b, act), T=1.0, mgrit=MGRITOptions(**FIXED),
                        warm_start=True)
    ref_steps = BuiltinSteps(kind, K, b, act)
    plain = LayerParallel([ref_steps._layer(n) for n in range(N)], T=1.0,
                          mgrit=MGRITOptions(**FIXED), warm_start=True)
    for call in range(2):
        want = grads(plain, inputs(kind, seed=call))
        with monkeypatch.context() as m:
            m.setattr(module_propagators.ModuleAdjoint, "step", None)
            m.setattr(module_propagators.ModuleForward, "step_many", None)
            got = grads(fam, inputs(kind, seed=call))
        assert close(got, want, 1e-12)
        assert not close(got[:1], serial_grads(fam, inputs(kind, seed=call))[:1], 1e-6)


def test_gradcheck_on_a_tiny_case():
    K, b = weights("dense")
    mod = LayerParallel(BuiltinSteps.dense(K[:4, :2, :2], b[:4, :2]), T=1.0,
                        mgrit=MGRITOptions(levels=2, cfactor0=2, tol=1e-14, max_iter=80,
                                           adj_tol=1e-14, adj_max_iter=80))
    u0 = inputs("dense")[:2, :2].clone().requires_grad_()
    assert torch.autograd.gradcheck(mod, (u0,))


def test_optimizer_steps_and_state_dicts_reach_the_solver():
    """SGD steps change the layers' parameters in place; the stacked weights the steps
    run on follow, as the same layers on the autograd path do."""
    K, b = weights("dense")
    fam = LayerParallel(BuiltinSteps.dense(K, b), T=1.0, mgrit=MGRITOptions(**CONVERGED))
    plain = LayerParallel([StepperLayer("dense", K[n].clone(), b[n].clone(),
                                        fam.steps.act) for n in range(N)], T=1.0,
                          mgrit=MGRITOptions(**CONVERGED))
    opts = [torch.optim.SGD(m.parameters(), lr=0.3) for m in (fam, plain)]
    for step in range(3):
        for mod, opt in zip((fam, plain), opts):
            opt.zero_grad()
            loss(mod(inputs("dense", seed=step))).backward()
            opt.step()
    assert close(list(fam.parameters()), list(plain.parameters()))
    other = LayerParallel(steps("dense", seed=5), T=1.0, mgrit=MGRITOptions(**CONVERGED))
    other.load_state_dict(fam.state_dict())
    with torch.no_grad():
        assert close([other(inputs("dense"))], [fam(inputs("dense"))], 1e-13)


def test_float32_after_to_rebuilds_the_stacks():
    mod = LayerParallel(steps("conv"), T=1.0, mgrit=MGRITOptions(**CONVERGED))
    want = grads(mod, inputs("conv"))
    mod.to(torch.float32)
    got = grads(mod, inputs("conv").float())
    assert all(g.dtype == torch.float32 for g in got)
    assert close([g.double() for g in got], want, 1e-4)
    assert mod.steps._K.dtype == torch.float32      # the steps run on float32 stacks


def test_a_parameter_assigned_after_a_forward_reaches_the_stacks():
    mod = LayerParallel(steps("dense"), T=1.0, mgrit=MGRITOptions(**CONVERGED))
    grads(mod, inputs("dense"))
    mod.layers["2"].K = torch.nn.Parameter(torch.full((4, 4), 0.1, dtype=torch.float64))
    got, want = grads(mod, inputs("dense")), serial_grads(mod, inputs("dense"))
    assert close(got, want)
    assert mod.steps._K[2].data_ptr() == mod.layers["2"].K.data_ptr()


def test_several_forwards_before_one_backward():
    mod = LayerParallel(steps("dense"), T=1.0, mgrit=MGRITOptions(**FIXED))
    x1, x2 = inputs("dense", 1), inputs("dense", 2)
    one = [torch.autograd.grad(loss(mod(x)), list(mod.parameters())) for x in (x1, x2)]
    both = torch.autograd.grad(loss(mod(x1)) + loss(mod(x2)), list(mod.parameters()))
    assert close(both, [a + b for a, b in zip(*one)], 1e-12)


@pytest.mark.parametrize("make, match", [
    (lambda: BuiltinSteps("lstm", *weights("dense")), "built-in steps are"),
    (lambda: BuiltinSteps("dense", *weights("dense"), activation="gelu"), "activation='gelu'"),
    (lambda: BuiltinSteps.conv(*weights("dense")), r"K of shape \(8, 4, 4\)"),
    (lambda: BuiltinSteps.dense(weights("dense")[0], torch.zeros(N, 3)), r"b of shape"),
    (lambda: LayerParallel(steps("dense"), n_layers=4), "n_layers=4"),
    (lambda: LayerParallel(steps("dense"), coarse_steps=lambda c: None), "coarse_steps"),
])
def test_bad_input_is_refused_with_the_value(make, match):
    with pytest.raises(ConfigError, match=match):
        make()
