"""logger=tensorboard: the scalars of metrics.h5 as TensorBoard events, the HParams with the
final numbers, multirun jobs named by their overrides, or a clear error."""
from pathlib import Path

import numpy as np
import pytest
import yaml

from helpers import composed
from lptrain import app
from lptrain.errors import ConfigError, MissingPackageError
from lptrain.metrics import schema as ms
from lptrain.metrics import tensorboard
from lptrain.metrics.quantities import iteration_time
from lptrain.metrics.reader import read_metrics

TINY = ["network.layers=4", "network.width=4", "dataset.n_train=100", "dataset.n_val=20",
        "train.iterations=4", "eval_every=2", "seed=1", "mgrit.levels=2", "mgrit.cfactor0=2"]


def _cfg(*overrides):
    return composed(*TINY, *overrides)


def test_scalars_equal_the_metrics_file(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    app.run(_cfg("logger=tensorboard", "mode=simultaneous"), None, tmp_path)
    m = read_metrics(tmp_path / ms.FILE_NAME)
    events = EventAccumulator(str(tmp_path / tensorboard.DIR_NAME))
    events.Reload()
    for tag, group, field in [("train/objective", m.train, ms.OBJECTIVE),
                              ("train/grad_norm", m.train, "grad_norm"),
                              ("validation/accuracy", m.validation, ms.ACCURACY),
                              ("mgrit/fwd_residual", m.mgrit, ms.FWD_RESIDUAL)]:
        got = events.Scalars(tag)
        np.testing.assert_array_equal([e.step for e in got], group[ms.ITERATION])
        # TensorBoard stores float32
        np.testing.assert_allclose([e.value for e in got], group[field], rtol=1e-6)
    assert not any(t.endswith("history") for t in events.Tags()["scalars"])


def test_a_column_a_mode_leaves_out_is_no_scalar(tmp_path):
    """mode=mgrit plans no iterations: metrics.h5 fills fwd_plan with -1, which
    TensorBoard had drawn as a value."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    app.run(_cfg("logger=tensorboard", "mode=mgrit"), None, tmp_path)
    assert set(read_metrics(tmp_path / ms.FILE_NAME).mgrit["fwd_plan"]) == {-1}
    events = EventAccumulator(str(tmp_path / tensorboard.DIR_NAME))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert "mgrit/fwd_residual" in tags
    assert not {"mgrit/fwd_plan", "mgrit/adj_plan"} & set(tags)


def test_missing_tensorboard_is_a_one_line_error_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorboard.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingPackageError,
                       match=r"logger=tensorboard: .*pip install 'lptrain\[tensorboard\]'"):
        app.run(_cfg("logger=tensorboard"), None, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unknown_logger_is_refused():
    with pytest.raises(ConfigError, match="logger"):
        app.options(_cfg("logger=wandb"))


def _events(directory: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(directory))
    events.Reload()
    return events


def _hparams(events) -> dict:
    """The HParams a run's events hold: name -> value."""
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
    content = events.PluginTagToContent("hparams")
    start = HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    return {name: getattr(value, value.WhichOneof("kind"))
            for name, value in start.session_start_info.hparams.items()}


def test_hparams_hold_the_config_and_the_final_metrics(tmp_path):
    pytest.importorskip("tensorboard")
    app.run(_cfg("logger=tensorboard", "mode=simultaneous", "optimizer=adam"), None, tmp_path)
    m = read_metrics(tmp_path / ms.FILE_NAME)
    events = _events(tmp_path / tensorboard.DIR_NAME)
    hp = _hparams(events)
    assert hp["optimizer.name"] == "adam" and hp["mode.name"] == "simultaneous"
    assert hp["network.layers"] == 4 and hp["seed"] == 1 and hp["world_size"] == 1
    assert hp["mgrit_levels"] == "4/2"              # 4 layers, cfactor0 2, 2 levels
    assert hp["train.batch_size"] == "null" and hp["mgrit.adj_tol"] == "null"

    _finals_are_the_files(events, m)


def _finals_are_the_files(events, m) -> None:
    """The HParams' final numbers are those of metrics.h5 (`m`), the whole run's."""
    def final(tag):          # a resumed run's: the last start's (its file sorts last)
        return events.Scalars(f"final/{tag}")[-1].value
    expected = {"objective": m.train[ms.OBJECTIVE][-1], "loss": m.train[ms.LOSS][-1],
                "val_accuracy": m.validation[ms.ACCURACY][-1],
                "best_val_accuracy": m.validation[ms.ACCURACY].max(),
                "iterations": m.n_iterations, "wall_time": m.train[ms.WALL_TIME][-1],
                "iteration_time": iteration_time(m.train[ms.STEP_TIME]),
                "fwd_iterations": m.mgrit[ms.FWD_ITERATIONS].mean(),
                "adj_iterations": m.mgrit[ms.ADJ_ITERATIONS].mean()}
    for tag, value in expected.items():
        assert final(tag) == pytest.approx(value, rel=1e-6), tag   # float32 in the file
    assert {t for t in events.Tags()["scalars"] if t.startswith("final/")} <= \
        set(tensorboard.FINAL)


def test_a_resumed_runs_final_numbers_are_the_whole_runs(tmp_path):
    """Were this start's: the iteration time, the mean MGRIT iterations and the best
    validation accuracy of the iterations after the resume only."""
    pytest.importorskip("tensorboard")
    import h5py
    from helpers import StopAt
    from lptrain.errors import Interrupted
    cfg = _cfg("logger=tensorboard", "mode=simultaneous", "train.iterations=8")
    with pytest.raises(Interrupted):
        app.run(cfg, None, tmp_path, StopAt(4))
    with h5py.File(tmp_path / ms.FILE_NAME, "a", locking=False) as f:   # known, earlier
        f[ms.TRAIN][ms.STEP_TIME][:] = 100.0
        f[ms.MGRIT][ms.FWD_ITERATIONS][:] = 9
        f[ms.VALIDATION][ms.ACCURACY][-1] = 1.0
    app.run(cfg, None, tmp_path, resume=True)
    m = read_metrics(tmp_path / ms.FILE_NAME)
    assert m.n_iterations == 8 and m.validation[ms.ACCURACY].max() == 1.0
    events = _events(tmp_path / tensorboard.DIR_NAME)
    _finals_are_the_files(events, m)


def test_a_stopped_run_leaves_its_hparams_to_the_run_that_carries_it_on(tmp_path):
    """TensorBoard keeps a run's first HParams record: a stopped start's (its grid, its
    train.iterations) hid the resumed run's, and its final/* points stayed beside the
    resumed run's."""
    pytest.importorskip("tensorboard")
    from helpers import StopAt
    from lptrain.errors import Interrupted
    with pytest.raises(Interrupted):
        app.run(_cfg("logger=tensorboard", "train.iterations=8"), None, tmp_path, StopAt(4))
    app.run(_cfg("logger=tensorboard", "train.iterations=10"), None, tmp_path, resume=True)
    events = _events(tmp_path / tensorboard.DIR_NAME)
    assert _hparams(events)["train.iterations"] == 10
    assert [e.step for e in events.Scalars("final/objective")] == [10]


def test_a_completed_run_carried_on_ends_with_one_hparams_record(tmp_path):
    """A completed run of 4 iterations carried on to 6: the dashboard kept the first
    start's record (train.iterations 4) beside the 6-iteration numbers, and final/* had a
    point at each end (held-out)."""
    pytest.importorskip("tensorboard")
    app.run(_cfg("logger=tensorboard", "mode=simultaneous"), None, tmp_path)
    app.run(_cfg("logger=tensorboard", "mode=simultaneous", "train.iterations=6"), None,
            tmp_path, resume=True)
    events = _events(tmp_path / tensorboard.DIR_NAME)
    assert _hparams(events)["train.iterations"] == 6
    assert [e.step for e in events.Scalars("final/objective")] == [6]
    _finals_are_the_files(events, read_metrics(tmp_path / ms.FILE_NAME))


def _sweep(root: Path, jobs: dict[str, list[str]], task: list[str]) -> None:
    """The files Hydra writes for a multirun: multirun.yaml and each job's overrides."""
    root.mkdir()
    (root / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {
        "hydra": ["hydra.mode=MULTIRUN"], "task": task}}}))
    for job, overrides in jobs.items():
        (root / job / ".hydra").mkdir(parents=True)
        (root / job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))


def test_run_names_are_the_overrides_a_job_varied(tmp_path):
    sweep = tmp_path / "sweep"
    task = ["train.iterations=4", "optimizer.lr=0.1,0.5", "dataset.path=/a/b,/c/d"]
    _sweep(sweep, {"0": ["train.iterations=4", "optimizer.lr=0.1", "dataset.path=/a/b"],
                   "1": ["train.iterations=4", "optimizer.lr=0.5", "dataset.path=/c/d"],
                   "2": ["train.iterations=4"]}, task)
    tb = sweep / tensorboard.DIR_NAME
    assert tensorboard.log_dir(sweep / "0") == tb / "dataset.path=_a_b,optimizer.lr=0.1"
    assert tensorboard.log_dir(sweep / "1") == tb / "dataset.path=_c_d,optimizer.lr=0.5"
    assert tensorboard.log_dir(sweep / "2") == tb / "2"           # it varied nothing
    single = tmp_path / "single"
    (single / ".hydra").mkdir(parents=True)
    (single / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    assert tensorboard.log_dir(single) == single / tensorboard.DIR_NAME


def test_an_interpolated_override_is_not_a_varied_value(tmp_path):
    """Was `optimizer.step0=0.5,seed=$\\{hydra\\:job.num\\}`: a job's overrides.yaml stores
    `seed=${hydra:job.num}` escaped, multirun.yaml as typed, so it counted as varied."""
    sweep = tmp_path / "sweep"
    _sweep(sweep, {str(n): [f"optimizer.step0={v}", r"seed=$\{hydra\:job.num\}"]
                   for n, v in enumerate(("0.5", "1.0"))},
           ["optimizer.step0=0.5,1.0", "seed=${hydra:job.num}"])
    tb = sweep / tensorboard.DIR_NAME
    assert tensorboard.log_dir(sweep / "0") == tb / "optimizer.step0=0.5"
    assert tensorboard.log_dir(sweep / "1") == tb / "optimizer.step0=1.0"
    assert tensorboard.run_name(["seed=${oc.env:S}", "x=1"], []) == "x=1"


def test_jobs_with_equal_overrides_write_apart_and_a_resume_finds_its_own(tmp_path):
    pytest.importorskip("tensorboard")
    from lptrain.metrics.writer import NullWriter
    sweep = tmp_path / "sweep"
    _sweep(sweep, {"0": ["seed=1"], "1": ["seed=1"]}, ["seed=1,1"])
    dirs = []
    for job in ("0", "1", "1", "0"):       # two jobs, then each resumed
        with tensorboard.with_logger(NullWriter(), "tensorboard", sweep / job, True) as w:
            dirs.append(w.directory)
    assert dirs == [sweep / "tensorboard" / "seed=1", sweep / "tensorboard" / "seed=1 (1)",
                    sweep / "tensorboard" / "seed=1 (1)", sweep / "tensorboard" / "seed=1"]


def test_a_resumed_run_replaces_the_events_after_its_checkpoint(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    import time

    from lptrain.metrics.writer import NullWriter
    now = time.time()
    for start, stop, resume_after, value in ((1, 5, None, 1.0), (3, 6, 2, 2.0)):
        # a resume is a later process: its event file's name (a time stamp) sorts after
        monkeypatch.setattr(time, "time", lambda: now + start)
        with tensorboard.with_logger(NullWriter(), "tensorboard", tmp_path, True,
                                     resume_after=resume_after) as w:
            for k in range(start, stop + 1):
                w.log_train(iteration=k, loss=value)
    got = [(e.step, e.value) for e in _events(tmp_path / "tensorboard").Scalars("train/loss")]
    assert got == [(1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0), (5, 2.0), (6, 2.0)]
