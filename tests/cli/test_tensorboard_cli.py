"""logger=tensorboard through the lptrain command: a multirun's jobs are TensorBoard runs
named by the overrides they varied, each with its HParams (Hydra writes the files that
name them; this checks that it still does)."""
from __future__ import annotations

import pytest

from launch import lptrain

pytestmark = pytest.mark.cli

TINY = ["network.layers=4", "network.width=4", "dataset.n_train=100", "dataset.n_val=20",
        "train.iterations=2", "eval_every=2", "optimizer=sgd"]


def test_multirun_jobs_are_runs_named_by_their_overrides(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.plugin_event_multiplexer import \
        EventMultiplexer
    proc = lptrain(["-m", "logger=tensorboard", "optimizer.lr=0.5,1.0", *TINY,
                    f"hydra.sweep.dir={tmp_path}"], tmp_path, 1, 180)
    assert proc.returncode == 0, proc.stderr
    runs = EventMultiplexer()
    runs.AddRunsFromDirectory(str(tmp_path / "tensorboard"))
    runs.Reload()
    assert sorted(runs.Runs()) == ["optimizer.lr=0.5", "optimizer.lr=1.0"]
    for name in runs.Runs():
        events = EventAccumulator(str(tmp_path / "tensorboard" / name))
        events.Reload()
        assert "_hparams_/session_start_info" in events.PluginTagToContent("hparams")
        assert [e.step for e in events.Scalars("train/loss")] == [1, 2]
        assert len(events.Scalars("final/val_accuracy")) == 1
    assert not (tmp_path / "0" / "tensorboard").exists()
