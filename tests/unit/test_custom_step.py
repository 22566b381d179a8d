"""network=custom: a user's module as the residual step (model/custom.py, custom_steps.py).

Gradients against autograd, MGRIT against the serial sweep, bad targets refused in one
line, and the whole application in process (modes, optimizers, resume, saved model).
"""
import numpy as np
import pytest
import torch

from helpers import (autograd_objective, batch, composed, copies_of,
                     serial_objective_and_grad, StopAt)
from lptrain import app
from lptrain.errors import ConfigError, Interrupted
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.options import MGRITOptions
from lptrain.model.network import NetworkOptions, ResNet
from lptrain.model.saved import load_model
from lptrain.parallel.layer_parallel import LayerParallel

CONV = {"_target_": "custom_step_pkg.MyStep", "channels": 3, "hidden": 4, "groups": 2}
DENSE = {"_target_": "custom_step_pkg.DenseStep", "width": 5, "hidden": 3}
CHECKPOINTED = {**DENSE, "_target_": "custom_step_pkg.Checkpointed"}
STEPS = dict(argnames="step", argvalues=[CONV, DENSE, CHECKPOINTED],
             ids=["conv-groupnorm", "dense", "checkpointed"])


def custom_net(step, layers=8, seed=1, **kw):
    image = step is CONV
    o = NetworkOptions(name="custom", width=5, channels=3, layers=layers, T=1.0,
                       opening="conv" if image else "dense", init_opening=0.3,
                       init_classifier=0.3, gamma_ddt=1e-3, step=dict(step), **kw)
    net = ResNet(o, (1, 5, 5) if image else (2,), 3)
    return net, net.init_params(seed)


@pytest.mark.parametrize("step", [CONV, DENSE], ids=["conv-groupnorm", "dense"])
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
    ({"_target_": "custom_step_pkg.DenseStep", "width": 5}, "conv",
     r"network.opening='conv': choose \('dense', 'pad'\)"),
])
def test_bad_steps_are_refused_in_one_line(step, opening, message):
    o = NetworkOptions(name="custom", width=5, opening=opening, step=step)
    with pytest.raises(ConfigError, match=message) as err:
        ResNet(o, (2,), 3).custom.steps(torch.float64, "cpu")    # tried where it runs
    assert "\n" not in str(err.value)


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


# -- the application in process ---------------------------------------------------------
K = 8
TINY = ["network=custom", "network.step._target_=custom_step_pkg.DenseStep",
        "+network.step.width=4", "+network.step.hidden=3", "network.width=4",
        "network.layers=8", "dataset.n_train=120", "dataset.n_val=40", "seed=5",
        "eval_every=4", "mgrit.levels=2", "mgrit.cfactor0=2", f"train.iterations={K}"]


def _cfg(*overrides, base=TINY):
    return composed(*base, *overrides)


def _train(path, *overrides, base=TINY, **kw):
    path.mkdir(exist_ok=True)
    app.run(_cfg(*overrides, base=base), None, path, **kw)
    return read_metrics(path / ms.FILE_NAME)


def test_serial_and_converged_mgrit_train_alike(tmp_path):
    serial = _train(tmp_path / "serial", "mode=serial")
    mgrit = _train(tmp_path / "mgrit", "mode=mgrit", "mgrit.tol=1e-13")
    np.testing.assert_allclose(mgrit.train[ms.OBJECTIVE], serial.train[ms.OBJECTIVE],
                               rtol=1e-8, atol=0)
    assert serial.train[ms.OBJECTIVE][-1] < serial.train[ms.OBJECTIVE][0]
    model = load_model(tmp_path / "serial", "last")
    assert model.net.custom.target == "custom_step_pkg.DenseStep"
    last = load_model(tmp_path / "mgrit", "last")
    np.testing.assert_allclose(last.theta, model.theta, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("overrides", [
    ["mode=simultaneous"],
    ["mode=simultaneous", "optimizer=adam", "train.batch_size=40"],
    ["mode=serial", "optimizer=sgd", "train.batch_size=40"],
], ids=["simultaneous-lbfgs", "simultaneous-adam", "serial-sgd"])
def test_modes_and_optimizers_run_and_resume(overrides, tmp_path):
    """A stopped and resumed run equals the uninterrupted one, bitwise."""
    whole = _train(tmp_path / "whole", *overrides)
    assert np.isfinite(whole.train[ms.OBJECTIVE]).all()
    parts = tmp_path / "parts"
    with pytest.raises(Interrupted):
        _train(parts, *overrides, stop=StopAt(3))
    resumed = _train(parts, *overrides, resume=True)
    np.testing.assert_array_equal(resumed.train[ms.OBJECTIVE], whole.train[ms.OBJECTIVE])
    np.testing.assert_array_equal(load_model(parts, "last").theta,
                                  load_model(tmp_path / "whole", "last").theta)


def test_saved_model_rebuilds_the_users_module_and_scores_like_the_run(tmp_path):
    m = _train(tmp_path, base=[
        "dataset=mnist", "network=custom", "network.step._target_=custom_step_pkg.MyStep",
        "+network.step.channels=2", "+network.step.hidden=2", "network.channels=2",
        "network.opening=conv", "network.pool=4", "network.layers=4", "dataset.n_train=60",
        "dataset.n_val=30", "train.batch_size=null", "optimizer=lbfgs", "dtype=float64",
        "train.iterations=2", "eval_every=2"])
    model = load_model(tmp_path, "last")
    assert type(model.net.custom.template).__name__ == "MyStep"
    assert repr(model).startswith("Classifier(custom_step_pkg.MyStep: 4 layers, 2 channels")
    from lptrain.evaluate import evaluate
    scores = evaluate(tmp_path, [], "val", "last")
    assert scores["loss"] == pytest.approx(float(m.validation[ms.LOSS][-1]), rel=1e-12)
    x = torch.randn(3, 1, 28, 28, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(1))
    copies = copies_of(load_model(tmp_path, "last"), x)     # exported before any forward
    want = model(x).detach()
    for how, other in copies.items():     # as README "A trained model" says
        assert torch.equal(other(x).detach(), want), how


# -- the speedup model --------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["serial", "mgrit", "simultaneous"])
def test_the_speedup_model_records_and_measures_a_custom_step(mode):
    """lptrain-model: the kernels an iteration of the custom network records run on it."""
    from lptrain.model_perf.measure import kernel_calls
    from lptrain.model_perf.record import record_iteration
    net, theta = custom_net(CONV, layers=8)
    opts = MGRITOptions(levels=2, cfactor0=2, fwd_iters=1, adj_iters=1)
    record = record_iteration(net, mode, opts, 2, 1, 2, 2)
    kinds = set(record.kernels())
    assert any(name.startswith("apply") for name, _ in kinds)
    calls = kernel_calls(net, theta, 3, kinds)
    assert set(calls) == kinds
    for fn in calls.values():
        fn()


def test_a_saved_custom_model_fine_tunes_with_the_training_gradient(tmp_path):
    """load_model's module: forward's autograd gradient equals the serial adjoint's."""
    _train(tmp_path, "mode=serial", "train.iterations=2")
    model = load_model(tmp_path, "last")
    net, theta = model.net, model.theta
    x = torch.randn(7, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1, 2, 3, 4, 0, 1])
    loss = torch.nn.functional.cross_entropy(model(x), y, reduction="sum") / 7
    loss.backward()
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    _, grad, _ = serial_objective_and_grad(net, theta, x, y)
    reg = torch.zeros_like(theta)
    net.regulariser(theta, reg)                  # the loss's gradient: grad − ∇R
    assert float((got - (grad - reg)).norm() / got.norm()) <= 1e-12
    assert model.predict(x, preprocessed=True).shape == (7,)


def test_a_run_tries_the_step_in_its_dtype_and_checks_every_step(tmp_path):
    """float32 runs: a step returning float64 trained in float64 unsaid and saved a model
    whose predict failed in torch; one returning float32 was refused."""
    f32 = ["dtype=float32", "mode=serial", "train.iterations=2"]
    with pytest.raises(ConfigError, match=r"Doubling\(width=4, hidden=3\) maps a "
                       r"torch.float32 state to torch.float64: a residual branch must keep"):
        _train(tmp_path / "doubling", "network.step._target_=custom_step_pkg.Doubling", *f32)
    assert not (tmp_path / "doubling" / ms.FILE_NAME).exists()
    _train(tmp_path / "single", "network.step._target_=custom_step_pkg.Single", *f32)
    model = load_model(tmp_path / "single", "last")
    assert model.predict(np.array([[0.5, -1.0]])).shape == (1,)
    with pytest.raises(ValueError, match=r"Batchwise\(width=4, hidden=3\) maps a "
                       r"torch.float32 state to torch.float64: a residual branch must"):
        _train(tmp_path / "batchwise", "network.step._target_=custom_step_pkg.Batchwise", *f32)


def test_resume_refuses_another_step(tmp_path):
    with pytest.raises(Interrupted):
        _train(tmp_path, "mode=serial", stop=StopAt(2))
    with pytest.raises(ConfigError, match=r"network.step.hidden"):
        _train(tmp_path, "mode=serial", "network.step.hidden=4", resume=True)


def test_a_steps_random_buffer_is_the_same_in_every_process(tmp_path):
    """A buffer the constructor draws was drawn from whatever torch's generator held: two
    runs of one command ended at objectives 0.849 and 0.708, and lptrain-eval scored a
    saved model 0.24 that had validated at 0.68 (only θ is saved; the buffer was drawn
    anew)."""
    from lptrain.evaluate import evaluate
    mixed = ["network.step._target_=custom_step_pkg.RandomMixing", "mode=serial",
             "train.iterations=4"]
    runs = []
    for i in range(2):
        torch.manual_seed(100 + i)          # another state of torch's generator
        runs.append(_train(tmp_path / str(i), *mixed))
    np.testing.assert_array_equal(runs[0].train[ms.OBJECTIVE], runs[1].train[ms.OBJECTIVE])
    torch.manual_seed(7)
    scored = evaluate(tmp_path / "0", [])             # lptrain-eval's numbers
    at = list(runs[0].validation[ms.ITERATION]).index(scored["iteration"])
    assert scored["loss"] == pytest.approx(runs[0].validation[ms.LOSS][at], rel=1e-12)
    assert scored["accuracy"] == runs[0].validation[ms.ACCURACY][at]


def test_lptrain_eval_of_a_step_that_fails_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    """Was a traceback and exit 1 (every other failure of the tool is one line)."""
    import custom_step_pkg
    from lptrain.evaluate import main
    _train(tmp_path, "mode=serial", "train.iterations=2")

    forward = custom_step_pkg.DenseStep.forward

    def broken(self, u):          # builds (tried on 2 samples), fails on the data
        if u.shape[0] > 2:
            raise RuntimeError("no GPU here\nsecond line")
        return forward(self, u)
    monkeypatch.setattr(custom_step_pkg.DenseStep, "forward", broken)
    assert main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == (f"lptrain-eval: error: {tmp_path / 'model.pt'}: the model failed on peaks "
                   f"val: RuntimeError: no GPU here\n")


def test_a_step_with_dropout_or_batchnorm_is_told_they_run_in_eval_mode(tmp_path, caplog):
    """Was silence: the modules did nothing and nothing said so."""
    import logging
    with caplog.at_level(logging.INFO, logger="lptrain"):
        _train(tmp_path / "r", "network.step._target_=custom_step_pkg.Regularised",
               "mode=serial", "train.iterations=1")
        _train(tmp_path / "plain", "mode=serial", "train.iterations=1")
    notes = [m for m in caplog.messages if m.startswith("network.step: ")]
    assert notes == ["network.step: its BatchNorm1d, Dropout run in eval mode"]


@pytest.mark.parametrize("hidden, message", [
    (2, "the step's parameter 'inner.weight' was (3, 4), the network built now has (2, 4)"),
    (4, "the step's parameter 'inner.weight' was (3, 4), the network built now has (4, 4)")])
def test_parameters_saved_for_another_step_class_are_refused(hidden, message, tmp_path,
                                                            monkeypatch):
    """The step class changed after training (its hidden size): the model loaded
    silently with each layer reading the first values of its saved row (fewer
    parameters) or failed deep in torch (more), and a resume trained on in the wrong
    layout; both are refused in one line naming the parameter, the run's files as
    they were."""
    import custom_step_pkg
    from lptrain.errors import InputFileError
    with pytest.raises(Interrupted):
        _train(tmp_path, "mode=serial", stop=StopAt(3))
    before = read_metrics(tmp_path / ms.FILE_NAME)

    class Changed(custom_step_pkg.DenseStep):
        def __init__(self, width=8, hidden=6):
            super().__init__(width, hidden=hidden_now)
    hidden_now = hidden
    monkeypatch.setattr(custom_step_pkg, "DenseStep", Changed)
    want = (f"{message}; use it where the step class it was trained with "
            f"(custom_step_pkg.DenseStep) is importable")
    with pytest.raises(InputFileError) as err:
        load_model(tmp_path, "last")
    assert str(err.value) == f"{tmp_path / 'model-last.pt'}: its parameters do not fit " \
        f"the network: {want}"
    with pytest.raises(InputFileError) as err:
        _train(tmp_path, "mode=serial", resume=True)
    assert str(err.value) == f"resume: the checkpoint: its parameters do not fit the " \
        f"network: {want}"
    after = read_metrics(tmp_path / ms.FILE_NAME)
    assert after.status == before.status == ms.INTERRUPTED
    np.testing.assert_array_equal(after.train[ms.OBJECTIVE], before.train[ms.OBJECTIVE])


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
