"""lptrain/runplan.py: what `make reproduce-*` does with a mode's run directory it fills
again (a rerun deleted an interrupted run the console had just said to resume, and
trained the modes that had completed again)."""
import h5py
import pytest
import yaml

from lptrain import rundir
from lptrain.config import compose
from lptrain.metrics import schema as ms
from lptrain.metrics.writer import open_writer
from lptrain.runplan import FRESH, KEPT, KEPT_FAILED, RESUME, RUNNING, plan
from lptrain.train.checkpoint import CHECKPOINT_FILE

GIVEN = ["experiment=peaks_paper", "mode=mgrit", "train.iterations=40"]


def _run(path, status, checkpoint=True, saved=GIVEN, ranks=1, rows=1):
    (path / ".hydra").mkdir(parents=True)
    (path / ".hydra" / "overrides.yaml").write_text("".join(f"- {a}\n" for a in saved))
    attrs = {ms.MODE: "mgrit", ms.WORLD_SIZE: ranks, ms.SEED: 0,
             ms.CONFIG: yaml.safe_dump(compose(saved)[1])}
    writer = open_writer(path / ms.FILE_NAME, attrs, True)
    for k in range(1, rows + 1):
        writer.log_train(iteration=k, objective=1.0, loss=1.0)
    writer.close(ms.COMPLETED if status == ms.RUNNING else status)
    if status == ms.RUNNING:             # a killed run's file
        with h5py.File(path / ms.FILE_NAME, "a") as f:
            f.attrs[ms.STATUS] = ms.RUNNING
    if checkpoint:
        (path / CHECKPOINT_FILE).write_bytes(b"")
    return path


@pytest.mark.parametrize("status, checkpoint, expected", [
    (ms.COMPLETED, True, KEPT), (ms.STALLED, False, KEPT),
    (ms.DIVERGED, True, KEPT_FAILED),
    (ms.INTERRUPTED, True, RESUME), (ms.FAILED, True, RESUME), (ms.RUNNING, True, RESUME),
    (ms.INTERRUPTED, False, FRESH)])         # stopped before its first checkpoint
def test_a_run_of_the_same_settings_is_kept_or_resumed(tmp_path, status, checkpoint,
                                                       expected):
    run = _run(tmp_path / "mgrit", status, checkpoint)
    # the run directory and Hydra's own keys are not overrides Hydra saves with the run
    assert plan(run, 1, [*GIVEN, f"hydra.run.dir={run}", "hydra/job_logging=disabled"]) == \
        expected


def test_other_settings_ranks_or_conf_files_start_afresh(tmp_path):
    run = _run(tmp_path / "mgrit", ms.COMPLETED)
    assert plan(run, 1, [*GIVEN, "seed=3"]) == FRESH            # ARGS changed
    assert plan(run, 1, list(reversed(GIVEN))) == KEPT          # the same, reordered
    assert plan(run, 2, GIVEN) == FRESH                         # NP changed (review)
    with h5py.File(run / ms.FILE_NAME, "a") as f:               # a conf file changed
        f.attrs[ms.CONFIG] = f.attrs[ms.CONFIG].replace("gamma_tik:", "gamma_tik: 1 #")
    assert plan(run, 1, GIVEN) == FRESH
    assert plan(tmp_path / "none", 1, GIVEN) == FRESH
    (run / ".hydra" / "overrides.yaml").write_text("{damaged")
    assert plan(run, 1, GIVEN) == FRESH


def test_a_run_killed_after_its_iterations_or_still_running(tmp_path, monkeypatch):
    """Killed after its last iteration: lptrain refuses to resume it ('the run has done
    40 iterations'); a live run's directory was deleted under it."""
    done = _run(tmp_path / "done", ms.RUNNING, rows=40)
    assert plan(done, 1, GIVEN) == FRESH
    live = _run(tmp_path / "live", ms.RUNNING)
    (live / rundir.LOCK_FILE).write_text("thishost 12345 token\n")
    monkeypatch.setattr(rundir, "_owner_alive", lambda host, pid: True)
    assert plan(live, 1, [*GIVEN, "seed=1"]) == RUNNING
    # FRESH=1 had deleted a live run's directory under it (held-out check)
    assert plan(live, 1, GIVEN, fresh=True) == RUNNING


def test_fresh_replaces_every_run_that_is_not_going(tmp_path):
    kept, stopped = _run(tmp_path / "kept", ms.COMPLETED), \
        _run(tmp_path / "stopped", ms.INTERRUPTED)
    assert [plan(r, 1, GIVEN) for r in (kept, stopped)] == [KEPT, RESUME]
    assert [plan(r, 1, GIVEN, fresh=True) for r in (kept, stopped)] == [FRESH, FRESH]


def test_the_command_line_takes_fresh_first(tmp_path, capsys):
    from lptrain.runplan import main
    kept = _run(tmp_path / "kept", ms.COMPLETED, rows=3)
    assert [main([*flag, str(kept), "1", *GIVEN]) for flag in ([], ["--fresh"])] == \
        [KEPT, FRESH]
    assert capsys.readouterr().err == \
        f"{kept}: kept (completed after 3 iterations, with these settings; FRESH=1 runs " \
        "it again)\n" f"{kept}: its run is replaced (FRESH=1; OUT=DIR keeps both)\n"


def test_a_run_it_replaces_is_named_with_why(tmp_path, capsys):
    """make compare-modes NP=1 after NP=2 replaced the 2-rank runs without a word
    (held-out, stop 67)."""
    from lptrain.runplan import main
    run = _run(tmp_path / "mgrit", ms.COMPLETED, ranks=2)
    assert main([str(run), "1", *GIVEN]) == FRESH
    assert main([str(run), "2", *GIVEN, "seed=3"]) == FRESH
    assert main([str(tmp_path / "none"), "1", *GIVEN]) == FRESH     # nothing to replace
    assert capsys.readouterr().err.splitlines() == [
        f"{run}: its run is replaced (it ran on 2 ranks, this on 1 rank; OUT=DIR keeps both)",
        f"{run}: its run is replaced (it ran with other settings; OUT=DIR keeps both)"]


def test_a_kept_diverged_run_says_so(tmp_path, capsys):
    """A diverged run was kept with "it ended with these settings", its divergence
    unnamed (held-out check)."""
    from lptrain.runplan import main
    run = _run(tmp_path / "mgrit", ms.DIVERGED, rows=2)
    assert main([str(run), "1", *GIVEN]) == KEPT_FAILED
    assert capsys.readouterr().err == \
        f"{run}: kept (diverged at iteration 2, with these settings; FRESH=1 runs it " \
        "again)\n"


def test_a_resume_given_too_few_iterations_names_the_value_given():
    """`resume=DIR train.iterations=10` on a run that had done 20 of its 100 said "it
    asked for train.iterations=100": the value the user typed appeared nowhere."""
    from types import SimpleNamespace

    from lptrain.app import check_resumable
    from lptrain.errors import ConfigError
    _, saved_cfg = compose(["train.iterations=100"])
    saved = SimpleNamespace(config=yaml.safe_dump(saved_cfg), iteration=20)
    for given, message in ((10, "train.iterations=10: the run has done 20 iterations; "
                                "give train.iterations=M with M > 20 to train on"),
                           (20, "train.iterations=20: the run has done 20 iterations; "
                                "give train.iterations=M with M > 20 to train on")):
        opts, cfg = compose([f"train.iterations={given}"])
        with pytest.raises(ConfigError) as err:
            check_resumable(saved, yaml.safe_dump(cfg), opts)
        assert str(err.value) == message
