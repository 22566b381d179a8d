"""network=custom in the whole application, in process (app.run, load_model, lptrain-eval):
modes, optimizers and resume, saved models, and what a run refuses or says of the step.
"""
import numpy as np
import pytest
import torch

from helpers import composed, copies_of, serial_objective_and_grad, StopAt
from lptrain import app
from lptrain.errors import ConfigError, Interrupted
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics
from lptrain.model.saved import load_model

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
    assert ", T=5, tanh opening; mnist" in repr(model)   # σ is the opening's, not the step's
    from lptrain.evaluate import evaluate
    scores = evaluate(tmp_path, [], "val", "last")
    assert scores["loss"] == pytest.approx(float(m.validation[ms.LOSS][-1]), rel=1e-12)
    x = torch.randn(3, 1, 28, 28, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(1))
    copies = copies_of(load_model(tmp_path, "last"), x)     # exported before any forward
    want = model(x).detach()
    for how, other in copies.items():     # as README "A trained model" says
        assert torch.equal(other(x).detach(), want), how


def test_a_layers_step_comes_back_as_the_users_module(tmp_path):
    """A saved custom model showed its layers as rows K (N, p) and an empty b (N, 0): no
    way to see layer n's weights by the step's own names (held-out check)."""
    _train(tmp_path, "train.iterations=2")
    model = load_model(tmp_path, "last")
    u = torch.randn(5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    theta, h = model.theta, model.net.h
    for n in (0, 5, 7):
        step = model.step_module(n)
        assert type(step).__name__ == "DenseStep" and not step.training
        assert set(dict(step.named_parameters())) == {"inner.weight", "inner.bias",
                                                      "outer.weight", "outer.bias"}
        with torch.no_grad():
            want = model.net.stepper(theta).step(u, n, h)
            torch.testing.assert_close(u + h * step(u), want, rtol=1e-14, atol=1e-15)
    assert not torch.equal(model.step_module(0).inner.weight, model.step_module(1).inner.weight)
    model.step_module(0).inner.weight.data.zero_()             # a copy: the model keeps its
    assert torch.equal(model.theta, theta)
    assert model.float().step_module(3).inner.weight.dtype == torch.float32
    with pytest.raises(IndexError, match=r"layer 8 of a network of 8 \(0 to 7\)"):
        model.step_module(8)
    dense = tmp_path / "dense"
    _train(dense, "network=dense", "train.iterations=1", base=[o for o in TINY
                                                             if "step" not in o])
    with pytest.raises(ValueError, match="network=dense steps with K and b"):
        load_model(dense).step_module(0)


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
