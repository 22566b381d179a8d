"""network=custom: a user's module as the residual step (model/custom.py, custom_steps.py).

Gradients against autograd, MGRIT against the serial sweep, bad targets refused in one
line, the speedup model's kernels of the step, and a saved θ checked against the network
built now; the whole application in process is in test_custom_step_app.py.
"""
import numpy as np
import pytest
import torch

from helpers import autograd_objective, batch, serial_objective_and_grad
from lptrain.errors import ConfigError
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.options import MGRITOptions
from lptrain.model.network import NetworkOptions, ResNet
from lptrain.parallel.layer_parallel import LayerParallel

CONV = {"_target_": "custom_step_pkg.MyStep", "channels": 3, "hidden": 4, "groups": 2}
DENSE = {"_target_": "custom_step_pkg.DenseStep", "width": 5, "hidden": 3}
CHECKPOINTED = {**DENSE, "_target_": "custom_step_pkg.Checkpointed"}
HAMILTONIAN = {**DENSE, "_target_": "custom_step_pkg.Hamiltonian"}   # autograd.grad inside
STEPS = dict(argnames="step", argvalues=[CONV, DENSE, CHECKPOINTED, HAMILTONIAN],
             ids=["conv-groupnorm", "dense", "checkpointed", "hamiltonian"])


def custom_net(step, layers=8, seed=1, **kw):
    image = step is CONV
    o = NetworkOptions(name="custom", width=5, channels=3, layers=layers, T=1.0,
                       opening="conv" if image else "dense", init_opening=0.3,
                       init_classifier=0.3, gamma_ddt=1e-3, step=dict(step), **kw)
    net = ResNet(o, (1, 5, 5) if image else (2,), 3)
    return net, net.init_params(seed)


@pytest.mark.parametrize("step", [CONV, DENSE, HAMILTONIAN],
                         ids=["conv-groupnorm", "dense", "hamiltonian"])
def test_serial_gradient_equals_autograd(step):
    net, theta = custom_net(step)
    x, y = batch(net, n=6)
    value, grad, _ = serial_objective_and_grad(net, theta, x, y)
    t = theta.clone().requires_grad_()
    J = autograd_objective(net, t, x, y)
    J.backward()
    assert value == pytest.approx(float(J.detach()), rel=1e-13)
    assert float((t.grad - grad).norm() / grad.norm()) <= 1e-12


def test_a_checkpointed_step_has_the_plain_steps_gradient():
    # activation checkpointing recomputes f in its backward, which must see the
    # parameters of θ's row again (autograd through functional_call alone would not:
    # autograd_objective is no oracle here); the same class without it is
    net, theta = custom_net(DENSE)
    plain = serial_objective_and_grad(net, theta, *batch(net, n=6))
    net, theta2 = custom_net(CHECKPOINTED)
    got = serial_objective_and_grad(net, theta2, *batch(net, n=6))
    assert torch.equal(theta, theta2) and got[0] == pytest.approx(plain[0], rel=1e-14)
    assert float((got[1] - plain[1]).norm() / plain[1].norm()) <= 1e-14


@pytest.mark.parametrize(**STEPS)
@pytest.mark.parametrize("coarse", ["inject", "average"])
@pytest.mark.parametrize("tol", [0.0, 1e-13])   # 0: weight products in the last sweep
def test_converged_mgrit_equals_serial(step, coarse, tol):
    net, theta = custom_net(step)
    x, y = batch(net, n=6)
    _, grad, states = serial_objective_and_grad(net, theta, x, y)
    lp = LayerParallel(net, MGRITOptions(levels=3, cfactor0=2, cfactor=2, tol=tol,
                                         coarse_weights=coarse), SerialExchange())
    res = lp.forward(theta, x, max_iter=30, tol=tol)
    ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
    g, _ = lp.backward(theta, x, res.states, ev, max_iter=30, tol=tol)
    net.regulariser(theta, g)
    assert float((res.states - states).norm() / states.norm()) <= 1e-12
    assert float((g - grad).norm() / grad.norm()) <= 1e-10


def test_initial_parameters_are_the_modules_own_and_seeded():
    net, theta = custom_net(CONV, seed=3)
    torch.manual_seed(3)
    first = dict(net.custom.build().named_parameters())
    K = net.layout.views(theta)["K"]
    assert K.shape == (8, net.custom.size)
    np.testing.assert_array_equal(K[0][:first["conv1.weight"].numel()],
                                  first["conv1.weight"].detach().reshape(-1))
    assert not torch.equal(K[0], K[1])          # each layer a fresh draw
    assert torch.equal(theta, custom_net(CONV, seed=3)[1])
    assert not torch.equal(theta, custom_net(CONV, seed=4)[1])


@pytest.mark.parametrize(("step", "opening", "message"), [
    ({"_target_": None}, "dense", r"network.step: name your step's class, e.g."),
    ({"_target_": "nopkg_xyz.Step"}, "dense", r"no module 'nopkg_xyz' to import"),
    ({"_target_": "custom_step_pkg.Missing"}, "dense", r"has no attribute 'Missing'"),
    ({"_target_": "custom_step_pkg.not_a_module"}, "dense", r"gave a int, not a torch"),
    ({"_target_": "custom_step_pkg.Widening", "width": 5}, "dense",
     r"maps a state of shape \(2, 5\) to \(2, 6\)"),
    ({"_target_": "custom_step_pkg.FrozenBias", "width": 5}, "dense",
     r"parameter 'inner.bias' is frozen \(requires_grad=False\)"),
    ({"_target_": "custom_step_pkg.DenseStep", "depth": 3}, "dense",
     r"DenseStep\(depth=3\) failed: TypeError"),
    ({"_target_": "custom_step_pkg.MyStep", "channels": 3}, "dense",
     r"fails on a state of shape \(2, 5\)"),
    ({"_target_": "custom_step_pkg.Single", "width": 5}, "dense",     # was accepted
     r"maps a torch.float64 state to torch.float32: a residual branch must keep"),
    ({"_target_": "custom_step_pkg.AlwaysNaN", "width": 5}, "dense",   # blamed on T, data
     r"AlwaysNaN\(width=5\) returns non-finite values \(nan or inf\) for finite states"),
    ({"_target_": "custom_step_pkg.TinyNoise", "width": 5}, "dense",   # passed: absolute
     r"TinyNoise\(width=5\) gives another update for the same state"),
    ({"_target_": "custom_step_pkg.Noisy", "width": 5}, "dense",       # trained on silently
     r"Noisy\(width=5\) gives another update for the same state when called again"),
    ({"_target_": "custom_step_pkg.DenseStep", "width": 5}, "conv",
     r"network.opening='conv': choose one of dense, pad for network=custom"),
    ({"_target_": "custom_step_pkg.HamiltonianNoGraph", "width": 5}, "dense",  # trained
     r"HamiltonianNoGraph\(width=5\)'s update does not depend on its parameters under "
     r"autograd: .* without create_graph=True"),                  # with zero gradients
    ({"_target_": "custom_step_pkg.DetachedWeights", "width": 5}, "dense",
     r"DetachedWeights\(width=5\)'s update does not depend on its parameters"),
    ({"_target_": "custom_step_pkg.Centred", "width": 5}, "dense",   # 1 and 2 ranks
     r"Centred\(width=5\) couples the samples of a batch \(a sample's update changes "
     r"by [0-9.e-]+ with the others beside it\)"),                  # trained apart
    ({"_target_": "custom_step_pkg.ClampsInPlace", "width": 5}, "dense",   # 2 ranks parted
     r"ClampsInPlace\(width=5\) writes into its inner.weight when called: a step must "
     r"leave its parameters and buffers as they are \(its parameters are θ's rows"),
    ({"_target_": "custom_step_pkg.CountsCalls", "width": 5}, "dense",
     r"CountsCalls\(width=5\) writes into its calls when called: .* \(every layer shares "
     r"its buffers"),
])
def test_bad_steps_are_refused_in_one_line(step, opening, message):
    o = NetworkOptions(name="custom", width=5, opening=opening, step=step)
    with pytest.raises(ConfigError, match=message) as err:
        ResNet(o, (2,), 3).custom.steps(torch.float64, "cpu")    # tried where it runs
    assert "\n" not in str(err.value)


def test_a_step_that_makes_a_buffer_at_its_first_call_is_accepted():
    """The parameter check raised KeyError for a buffer registered in forward (re-check:
    the code before it trained this step)."""
    o = NetworkOptions(name="custom", width=5, step={"_target_": "custom_step_pkg.LazyBuffer",
                                                     "width": 5})
    ResNet(o, (2,), 3).custom.steps(torch.float64, "cpu")


def test_a_step_that_takes_autograd_grad_with_its_graph_is_accepted():
    o = NetworkOptions(name="custom", width=5, step={"_target_": "custom_step_pkg.Hamiltonian",
                                                     "width": 5})
    ResNet(o, (2,), 3).custom.steps(torch.float64, "cpu")


def test_a_step_defined_for_non_negative_states_is_tried_at_zero_too():
    """log1p(u): NaN on a random state, finite on the states a relu opening gives; it was
    refused, and so were its saved models (held-out, stop 64)."""
    o = NetworkOptions(name="custom", width=5, step={"_target_": "custom_step_pkg.Log1p",
                                                     "width": 5})
    ResNet(o, (2,), 3).custom.steps(torch.float64, "cpu")


@pytest.mark.parametrize(("target", "dtype", "refused"), [
    ("Single", torch.float32, None),      # keeps a float32 state's dtype: was refused
    ("Single", torch.float64, "torch.float64 state to torch.float32"),
    ("Doubling", torch.float32, "torch.float32 state to torch.float64"),  # was accepted
    ("Doubling", torch.float64, None)])
def test_a_step_is_tried_in_the_dtype_it_computes_in(target, dtype, refused):
    """The try at build ran in float64 whatever the run's dtype."""
    o = NetworkOptions(name="custom", width=5, step={**DENSE, "_target_":
                                                     f"custom_step_pkg.{target}"})
    net = ResNet(o, (2,), 3)
    if refused is None:
        theta = net.init_params(1, dtype)
        x = torch.zeros(4, 2, dtype=dtype)
        assert net.stepper(theta).step(net.opening(theta, x), 0, net.h).dtype == dtype
        return
    with pytest.raises(ConfigError) as err:
        net.custom.steps(dtype, "cpu")
    assert str(err.value) == (f"network.step: custom_step_pkg.{target}(width=5, hidden=3) "
                              f"maps a {refused}: a residual branch must keep the state's dtype")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_step_must_keep_the_states_dtype(dtype):
    """A step that changes the dtype past the try at build (on 3 samples, not 2) trained
    silently: torch.add wrote f's float64 into the float32 state, or the state became
    f's dtype where no `out` was given (a loaded model's forward)."""
    o = NetworkOptions(name="custom", width=5, step={**DENSE, "_target_":
                                                     "custom_step_pkg.Batchwise"})
    net = ResNet(o, (2,), 3)
    theta = net.init_params(1, dtype)
    stepper, (K, b) = net.stepper(theta), net.hidden_views(theta)
    u = net.opening(theta, torch.zeros(3, 2, dtype=dtype))
    other = torch.float32 if dtype == torch.float64 else torch.float64
    want = (f"network.step: custom_step_pkg.Batchwise(width=5, hidden=3) maps a {dtype} "
            f"state to {other}: a residual branch must keep the state's dtype")
    assert stepper.step(u[:2], 0, net.h).dtype == dtype
    for step in (lambda: stepper.step(u, 0, net.h, out=torch.empty_like(u)),
                 lambda: stepper.apply(u[None], K[:1], b[:1], net.h),    # a stack
                 # the adjoint's graph of f: was torch's 'Mismatch in shape' (or dtype)
                 lambda: stepper.vjp_saved(stepper.linearize(u, K[0], b[0]), u, K[0],
                                           net.h)):
        with pytest.raises(ValueError) as err:
            step()
        assert str(err.value) == want


def test_only_network_custom_takes_a_step():
    with pytest.raises(ConfigError, match="only network=custom takes a step"):
        NetworkOptions(name="dense", step=dict(DENSE))


# -- the speedup model --------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["serial", "mgrit", "simultaneous"])
def test_the_speedup_model_records_and_measures_a_custom_step(mode):
    """lptrain-model: the kernels an iteration of the custom network records run on it."""
    from lptrain.model_perf.measure import kernel_calls, whole
    from lptrain.model_perf.record import record_iteration
    net, theta = custom_net(CONV, layers=8)
    opts = MGRITOptions(levels=2, cfactor0=2, fwd_iters=1, adj_iters=1)
    record = record_iteration(net, mode, opts, 2, 1, 2, 2)
    kinds = set(record.kernels())
    # serial: its sweeps whole (serial_forward, serial_adjoint), run on the custom step
    assert any(name.startswith(("apply", "serial_forward")) for name, _ in kinds)
    calls = kernel_calls(net, theta, 3, kinds)
    assert set(calls) == kinds
    for fn in calls.values():
        whole(fn)()


# -- a saved θ against the network built now ----------------------------------------------
def test_a_file_without_a_signature_is_checked_by_its_size():
    """Files written before the signature was kept: a θ of another size is refused."""
    from lptrain.errors import InputFileError
    from lptrain.model.signature import check_fits
    net, theta = custom_net(DENSE)
    check_fits(net, None, theta, "model.pt")
    check_fits(net, net.signature(), theta, "model.pt")
    with pytest.raises(InputFileError, match=f"model.pt: its parameters do not fit the "
                       f"network: it holds {theta.numel() - 1} parameter values, the "
                       f"network built now has {theta.numel()}; use it where"):
        check_fits(net, None, theta[1:], "model.pt")
    moved = net.signature()
    moved["step"] = moved["step"][::-1]
    with pytest.raises(InputFileError, match="the step's parameters come in another order"):
        check_fits(net, moved, theta, "model.pt")


def test_a_renamed_or_added_parameter_is_said_in_words():
    """A step class whose parameter was renamed (inner → first) was said as '... was (3,
    5), the network built now has absent'."""
    from lptrain.model.signature import signature_difference
    net, theta = custom_net(DENSE)
    now = net.signature()
    renamed = {**now, "step": [[name.replace("inner", "first"), s] for name, s in now["step"]]}
    assert signature_difference(renamed, theta.numel(), net) == (
        "the step's parameter 'first.weight' was (3, 5), the network built now has no "
        "such parameter")
    fewer = {**now, "step": now["step"][1:]}
    assert signature_difference(fewer, theta.numel(), net) == (
        "the step's parameter 'inner.weight' of the network built now, (3, 5), was not "
        "saved")
    other = {**now, "blocks": [["extra", [2]], *now["blocks"]]}
    assert signature_difference(other, theta.numel(), net) == (
        "block 'extra' was (2,), the network built now has no such block")
