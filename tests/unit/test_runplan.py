"""lptrain/runplan.py: what `make reproduce-*` does with a mode's run directory it fills
again (a rerun deleted an interrupted run the console had just said to resume, and
trained the modes that had completed again)."""
import h5py
import pytest

from lptrain.metrics import schema as ms
from lptrain.metrics.writer import open_writer
from lptrain.runplan import FRESH, KEPT, RESUME, plan
from lptrain.train.checkpoint import CHECKPOINT_FILE

ATTRS = {ms.MODE: "serial", ms.WORLD_SIZE: 1, ms.SEED: 0, ms.CONFIG: "x: 1\n"}
GIVEN = ["experiment=peaks_paper", "mode=mgrit", "train.iterations=40"]


def _run(path, status, checkpoint=True, saved=GIVEN):
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {a}\n" for a in saved))
    writer = open_writer(path / ms.FILE_NAME, ATTRS, True)
    writer.log_train(iteration=1, objective=1.0, loss=1.0)
    writer.close(ms.COMPLETED if status == ms.RUNNING else status)
    if status == ms.RUNNING:             # a killed run's file
        with h5py.File(path / ms.FILE_NAME, "a") as f:
            f.attrs[ms.STATUS] = ms.RUNNING
    if checkpoint:
        (path / CHECKPOINT_FILE).write_bytes(b"")
    return path


@pytest.mark.parametrize("status, checkpoint, expected", [
    (ms.COMPLETED, True, KEPT), (ms.STALLED, False, KEPT), (ms.DIVERGED, True, KEPT),
    (ms.INTERRUPTED, True, RESUME), (ms.FAILED, True, RESUME), (ms.RUNNING, True, RESUME),
    (ms.INTERRUPTED, False, FRESH)])         # stopped before its first checkpoint
def test_a_run_of_the_same_settings_is_kept_or_resumed(tmp_path, status, checkpoint,
                                                       expected):
    run = _run(tmp_path / "mgrit", status, checkpoint)
    # the run directory is Hydra's, not an override it saves
    assert plan(run, [*GIVEN, f"hydra.run.dir={run}"]) == expected


def test_other_settings_or_no_run_start_afresh(tmp_path):
    run = _run(tmp_path / "mgrit", ms.COMPLETED)
    assert plan(run, [*GIVEN, "seed=3"]) == FRESH          # ARGS changed
    assert plan(run, list(reversed(GIVEN))) == KEPT        # the same, in another order
    assert plan(tmp_path / "none", GIVEN) == FRESH
    (run / ".hydra" / "overrides.yaml").write_text("{damaged")
    assert plan(run, GIVEN) == FRESH
