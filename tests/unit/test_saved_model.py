"""model.pt: written by every run, loaded without MPI, reproducing the run's numbers."""
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import lptrain
from lptrain import app, config, evaluate
from lptrain.config.schema import register_configs
from lptrain.data import load_dataset
from lptrain.errors import RunFileError
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics
from lptrain.model.saved import MODEL_FILE, load_model
from lptrain.train.checkpoint import AUTO_FIRST

CONF_DIR = Path(config.CONF_DIR)
TINY = ["network.layers=6", "network.width=4", "dataset.n_train=200", "dataset.n_val=50",
        "train.iterations=12", "seed=4", "eval_every=5"]


def run(tmp_path, *overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*TINY, *overrides])
    tmp_path.mkdir(parents=True, exist_ok=True)
    app.run(cfg, None, tmp_path)
    return read_metrics(tmp_path / ms.FILE_NAME)


@pytest.fixture(scope="module")
def serial_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("serial")
    return path, run(path)


def _val_split(model):
    options, seed = evaluate.dataset_for(model, [])
    return load_dataset(options, seed)


def test_saved_model_reproduces_final_validation_exactly(serial_run):
    path, m = serial_run
    model = lptrain.load_model(path)
    assert m.status == ms.COMPLETED
    assert model.iteration == m.n_iterations == 12
    data = _val_split(model)
    loss, acc = model.evaluate(data.x_val, data.y_val)
    assert loss == m.validation[ms.LOSS][-1]          # bitwise: the same serial sweep
    assert acc == m.validation[ms.ACCURACY][-1]


def test_evaluation_in_chunks_equals_one_pass(serial_run):
    path, m = serial_run
    model = lptrain.load_model(path)
    data = _val_split(model)
    n = data.x_val.shape[0]
    whole = model.evaluate(data.x_val, data.y_val, chunk=n)
    for chunk in (1, 7, n - 1):
        loss, acc = model.evaluate(data.x_val, data.y_val, chunk=chunk)
        assert loss == pytest.approx(whole[0], rel=1e-13, abs=0) and acc == whole[1]


def test_mgrit_run_model_matches_its_validation(tmp_path):
    m = run(tmp_path, "mode=mgrit", "mgrit.levels=2", "mgrit.cfactor0=2")
    model = load_model(tmp_path / MODEL_FILE)
    data = _val_split(model)
    loss, acc = model.evaluate(data.x_val, data.y_val)
    assert acc == m.validation[ms.ACCURACY][-1]
    assert loss == pytest.approx(m.validation[ms.LOSS][-1], rel=1e-9, abs=0)


def test_prediction_on_new_data_is_the_network_applied_by_hand(serial_run):
    path, _ = serial_run
    model = load_model(path)
    net, theta = model.net, model.theta
    x = torch.randn(37, 2, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    st, u = net.stepper(theta), net.opening(theta, x)
    for n in range(net.opts.layers):
        u = st.step(u, n, net.h)
    v = net.layout.views(theta)
    logits = u.t() @ v["W"].t() + v["mu"]
    torch.testing.assert_close(model(x), logits, rtol=1e-12, atol=1e-12)
    assert torch.equal(model.predict(x), logits.argmax(1))
    assert model.predict(x.float()).dtype == torch.int64     # inputs are cast to θ's dtype
    with pytest.raises(ValueError, match=r"\(batch, 2\)"):
        model(torch.zeros(3, 5, dtype=torch.float64))


def test_model_records_data_description(serial_run):
    path, m = serial_run
    model = load_model(path)
    assert model.feature_shape == (2,) and model.n_classes == 5
    assert model.dataset_name == "peaks"
    assert len(model.dataset_meta["bin_edges"]) == 6
    assert "layers: 6" in model.config_yaml


def test_lptrain_eval_reports_the_run_split(serial_run, capsys):
    path, m = serial_run
    evaluate.main([str(path)])
    out = capsys.readouterr().out
    assert f"accuracy {m.validation[ms.ACCURACY][-1]:.4f}" in out
    assert "50 samples" in out
    r = evaluate.evaluate(path, ["dataset.n_val=100"], "train")
    assert (r["split"], r["samples"]) == ("train", 200)
    r = evaluate.evaluate(path, ["dataset.n_val=100"])
    assert r["samples"] == 100


@pytest.mark.parametrize("args, fragment", [
    (["network.width=3"], "only dataset"),
    (["dataset.nval=3"], "nval"),
    (["dataset.n_val=7"], "dataset.n_val=7"),
    (["dataset=mnist"], "the model takes (2,)"),
])
def test_lptrain_eval_errors_are_one_line(serial_run, capsys, args, fragment):
    path, _ = serial_run
    with pytest.raises(SystemExit) as exc:
        evaluate.main([str(path), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lptrain-eval: error: ") and fragment in err[0]


def test_missing_or_foreign_model_file_is_named(tmp_path):
    with pytest.raises(RunFileError, match="no saved model"):
        load_model(tmp_path)
    torch.save({"x": 1}, tmp_path / MODEL_FILE)
    with pytest.raises(RunFileError, match="not an lptrain model"):
        load_model(tmp_path)


def test_unwritable_model_file_fails_the_run_and_keeps_its_iterations(tmp_path):
    (tmp_path / MODEL_FILE).mkdir()            # renaming onto a directory fails
    with pytest.raises(RunFileError, match=f"{MODEL_FILE}: cannot write"):
        run(tmp_path)
    m = read_metrics(tmp_path / ms.FILE_NAME)
    assert m.status == ms.FAILED and MODEL_FILE in m.attrs[ms.ERROR]
    # model.pt is written with every checkpoint: the first one (AUTO_FIRST) fails the run
    assert m.n_iterations == AUTO_FIRST < 12
