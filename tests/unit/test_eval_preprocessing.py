"""lptrain-eval maps raw samples by the model's recorded preprocessing, as predict does:
overrides choose samples, never how they are scaled."""
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.io
import torch
from omegaconf import OmegaConf

from helpers import composed, write_set
from lptrain import evaluate
from lptrain.data import indian_pines as ip
from lptrain.data import load_dataset, preprocessing
from lptrain.data.base import stratified_split
from lptrain.model.network import NetworkOptions, ResNet
from lptrain.model.saved import MODEL_FILE, load_model, model_record, save_torch


@pytest.fixture
def mnist_run(tmp_path):
    """A run directory whose model.pt (random parameters, no training) was saved from
    MNIST-like IDX files scaled `standard` by its 60 training images' statistics."""
    parts = write_set(tmp_path / "idx", n_train=60, n_val=20)
    cfg = composed("dataset=mnist", f"dataset.path={tmp_path / 'idx'}",
                   "dataset.scaling=standard", "seed=3")
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    options, seed = evaluate.dataset_for(SimpleNamespace(config_yaml=config_yaml), [])
    data = load_dataset(options, seed)
    opts = NetworkOptions(name="conv", channels=2, layers=3, opening="conv", pool=4,
                          init="normal", init_opening=1.0, init_hidden=1.0,
                          init_classifier=1.0)                # scores that differ
    net = ResNet(opts, data.feature_shape, 10)
    record = model_record(net.init_params(0, torch.float64), net, config_yaml, "float64",
                          data, 3, "best")
    (tmp_path / "run").mkdir()
    save_torch(record, tmp_path / "run" / MODEL_FILE)
    return tmp_path / "run", data, parts["t10k"]


@pytest.mark.parametrize("overrides", [["dataset.scaling=unit"], ["dataset.n_train=30"],
                                       ["dataset.scaling=authors", "dataset.n_train=20"]])
def test_overrides_of_scaling_or_training_subset_change_no_score(mnist_run, overrides):
    """`lptrain-eval RUN dataset.scaling=standard` of an MNIST run re-fitted the scaling
    (accuracy 0.64 where predict on the same raw digits gave 0.862), and a smaller
    training subset standardised by other images' statistics."""
    run, data, (images, labels) = mnist_run
    model = load_model(run)
    own = evaluate.evaluate(run, [])
    assert (own["loss"], own["accuracy"]) == model.evaluate(data.x_val, data.y_val)  # bitwise
    raw = model.evaluate(model.preprocess(images), torch.from_numpy(labels.astype(np.int64)))
    assert (own["loss"], own["accuracy"]) == raw
    other = evaluate.evaluate(run, overrides)
    assert (other["loss"], other["accuracy"]) == raw
    assert (other["split_changed"], other["trained_on"]) == (False, 0)
    # said, not silently dropped: the scaling typed is not the model's (standard)
    assert other["not_applied"] == [(o, "standard") for o in overrides
                                    if o.startswith("dataset.scaling=")]
    assert own["not_applied"] == []
    assert load_dataset(evaluate.dataset_for(model, overrides)[0], 3).x_val.ne(
        data.x_val).any()                       # what the loader alone would have scored


def test_the_command_says_which_override_it_did_not_apply(mnist_run, capsys):
    run, _, _ = mnist_run
    assert evaluate.main([str(run), "dataset.scaling=standard", "dataset.scaling=unit"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["lptrain-eval: note: dataset.scaling=unit not applied: the samples are "
                   "mapped as the model was trained (standard)"]
    assert evaluate.main([str(run), "dataset.scaling=unit", "dataset.scaling=standard"]) == 0
    assert capsys.readouterr().err == ""        # the last one counts, and is the model's


def _scene(directory, bands=200, seed=0):
    """Indian Pines files of a 12 x 10 scene, every class 7 times (0: unlabelled)."""
    rng = np.random.default_rng(seed)
    gt = rng.permutation(np.arange(120) % 17).reshape(12, 10).astype(np.uint8)
    cube = rng.integers(1000, 9000, size=(12, 10, bands)).astype(np.uint16)
    variant = "corrected" if bands == 200 else "full"
    scipy.io.savemat(directory / ip.CUBE_FILES[variant],
                     {ip.CUBE_FILES[variant][:-4].lower(): cube})
    scipy.io.savemat(directory / ip.GT_FILE, {"indian_pines_gt": gt})
    return torch.from_numpy(cube[gt > 0].astype(np.float64)), \
        torch.from_numpy(gt[gt > 0].astype(np.int64) - 1)


def test_indian_pines_standardises_by_a_given_spec(tmp_path, monkeypatch):
    """`lptrain-eval ip_run dataset=indian_pines` standardised by the default split's
    training pixels, not the run's: features up to 0.31 off model.preprocess(raw)."""
    monkeypatch.setattr(ip, "package_dir", lambda name: None)
    pixels, labels = _scene(tmp_path)
    run = ip.IndianPinesOptions(path=str(tmp_path), n_train=40, n_val=30)
    spec = load_dataset(run, 3).meta["preprocessing"]
    other = ip.IndianPinesOptions(path=str(tmp_path), n_train=30, n_val=60)
    data = load_dataset(other, 1, spec)
    _, val = stratified_split(labels, 30, 60, torch.Generator().manual_seed(1))
    assert torch.equal(data.x_val, preprocessing.apply(spec, pixels[val]))
    assert data.meta["preprocessing"] == spec
    assert not torch.equal(load_dataset(other, 1).x_val, data.x_val)
    # a spec of another kind or band count is not this data's: the loader fits its own
    for wrong in ({"kind": "pixels", "scaling": "unit"}, {**spec, "mean": spec["mean"][:5]}):
        assert torch.equal(load_dataset(other, 1, wrong).x_val, load_dataset(other, 1).x_val)


@pytest.fixture
def ip_run(tmp_path, monkeypatch):
    """A run directory whose model.pt (random parameters) was saved from an Indian Pines
    scene split 40 / 30 with seed 3, and that scene's labels."""
    monkeypatch.setattr(ip, "package_dir", lambda name: None)
    _, labels = _scene(tmp_path)
    cfg = composed("dataset=indian_pines", f"dataset.path={tmp_path}", "dataset.n_train=40",
                   "dataset.n_val=30", "seed=3")
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    options, seed = evaluate.dataset_for(SimpleNamespace(config_yaml=config_yaml), [])
    data = load_dataset(options, seed)
    net = ResNet(NetworkOptions(width=4, layers=2), data.feature_shape, 16)
    record = model_record(net.init_params(0, torch.float64), net, config_yaml, "float64",
                          data, 3, "best")
    (tmp_path / "run").mkdir()
    save_torch(record, tmp_path / "run" / MODEL_FILE)
    return tmp_path / "run", labels


def _drawn(labels, n_train, n_val):
    return stratified_split(labels, n_train, n_val, torch.Generator().manual_seed(3))


@pytest.mark.parametrize("n_train, n_val", [(20, 30), (40, 20)])
def test_lptrain_eval_says_where_overrides_change_the_validation_split(ip_run, capsys,
                                                                      n_train, n_val):
    """README said a smaller dataset.n_train "changes no score", but the validation split
    is drawn after the training one from the same shuffled order: lptrain-eval scored
    some of the run's training pixels as validation ones, silently. It now counts them
    and warns (a smaller n_val alone: a note that the split is not the run's)."""
    run, labels = ip_run
    overrides = [f"dataset.n_train={n_train}", f"dataset.n_val={n_val}"]
    trained = set(_drawn(labels, 40, 30)[0].tolist())
    want = sum(i in trained for i in _drawn(labels, n_train, n_val)[1].tolist())
    assert (n_train < 40) == (want > 0)
    r = evaluate.evaluate(run, overrides)
    assert (r["split_changed"], r["trained_on"], r["samples"]) == (True, want, n_val)
    assert evaluate.main([str(run), *overrides]) == 0
    err = capsys.readouterr().err.splitlines()
    kind = "warning" if want else "note"
    assert len(err) == 1 and err[0].startswith(f"lptrain-eval: {kind}: ")
    assert (f"{want} of these {n_val} samples" in err[0]) == (want > 0)
    # "not the run's" read as "none of the run's samples" (held-out: Fashion-MNIST's test
    # set holds the run's validation images)
    assert want or err[0].endswith(f"these {n_val} samples are another set than the run "
                                   f"validated on (none of them among its training samples)")


def test_lptrain_eval_of_the_runs_own_split_says_nothing(ip_run, capsys):
    run, _ = ip_run
    for overrides in ([], ["dataset.n_train=40"]):
        r = evaluate.evaluate(run, overrides)
        assert r["split_changed"] in (None, False) and not r["trained_on"]
        assert evaluate.main([str(run), *overrides]) == 0
        assert capsys.readouterr().err == ""


def test_lptrain_eval_of_a_peaks_run_says_which_validation_points_it_trained_on(
        tmp_path, capsys):
    """Peaks draws both sets from its grid with replacement, balanced by class: 52 of the
    default run's 200 validation points are training points too; lptrain-eval warned of
    overlap only where overrides changed the split (held-out)."""
    from helpers import composed
    from lptrain import app
    app.run(composed("network.layers=4", "network.width=4", "dataset.n_train=500",
                     "dataset.n_val=100", "train.iterations=2"), None, tmp_path)
    data = load_dataset(evaluate.dataset_for(load_model(tmp_path), [])[0], 0)
    train = {tuple(x.tolist()) for x in data.x_train}
    want = sum(tuple(x.tolist()) in train for x in data.x_val)
    assert want > 0
    r = evaluate.evaluate(tmp_path, [])
    assert (r["split_changed"], r["trained_on"]) == (False, want)
    assert evaluate.main([str(tmp_path)]) == 0
    assert capsys.readouterr().err == (
        f"lptrain-eval: note: {want} of these 100 samples are also among the run's training "
        f"samples (its dataset drew both sets with replacement), as in the run's own "
        f"validation\n")


def test_other_files_are_checked_against_the_runs_own_training_samples(mnist_run, tmp_path,
                                                                      capsys):
    """dataset.path= at other files: the run's training samples were read from those
    files too, and lptrain-eval said "none of them among its training samples" of a test
    set that held some of them (held-out, stop 67). The run's own files come first."""
    import shutil
    from helpers import fake_split, write_idx
    run, _, _ = mnist_run
    other = tmp_path / "other"
    other.mkdir()
    images, labels = fake_split(60, 99, 128)                 # another training set
    write_idx(other / "train-images-idx3-ubyte", images, False)
    write_idx(other / "train-labels-idx1-ubyte", labels, False)
    for part in ("images-idx3", "labels-idx1"):              # a test set of the run's own
        shutil.copy(tmp_path / "idx" / f"train-{part}-ubyte", other / f"t10k-{part}-ubyte")
    overrides = [f"dataset.path={other}", "dataset.n_val=60"]
    r = evaluate.evaluate(run, overrides)
    assert r["split_changed"] and r["trained_on"] == r["samples"] == 60
    assert evaluate.main([str(run), *overrides]) == 0
    assert ("lptrain-eval: warning: 60 of these 60 samples are among the run's training "
            "samples") in capsys.readouterr().err
