"""lptrain/sweeps.py: what each job of a resumed sweep does, from the files in its
directory, and the command that resumes a sweep from its multirun.yaml."""
import re
import shutil

import h5py
import pytest

from lptrain import rundir
from lptrain.errors import ConfigError, InputFileError
from lptrain.metrics import schema as s
from lptrain.metrics.writer import MetricsWriter
from lptrain.rundir import is_sweep
from lptrain.sweeps import RESOLVER, JobPlan, SweepJobs, job_dirs, swept_keys, sweep_command
from lptrain.train.checkpoint import CHECKPOINT_FILE

MULTIRUN = """hydra:
  overrides:
    hydra:
    - hydra/sweeper=optuna
    - hydra.sweeper.n_trials=4
    - hydra.sweep.dir=/old/place
    - hydra.mode=MULTIRUN
    task:
    - optimizer.lr=0.5,1.0
    - train.iterations=400
    - seed=3
"""


SEED = ["seed=3"]      # the overrides of _job's run


def _job(directory, status, rows, checkpoint=True):
    directory.mkdir(parents=True)
    (directory / ".hydra").mkdir()
    (directory / ".hydra" / "overrides.yaml").write_text("- seed=3\n")
    attrs = {s.MODE: "serial", s.WORLD_SIZE: 1, s.SEED: 3, s.CONFIG: "seed: 3\n"}
    with MetricsWriter(directory / s.FILE_NAME, attrs) as w:
        for i in range(1, rows + 1):
            w.log_train(iteration=i, objective=1.0 / i, loss=0.5 / i)
        w.close(s.INTERRUPTED if status == s.RUNNING else status)
    if status == s.RUNNING:       # as a killed run leaves it
        with h5py.File(directory / s.FILE_NAME, "r+") as f:
            f.attrs[s.STATUS] = s.RUNNING
    if checkpoint:
        (directory / CHECKPOINT_FILE).write_bytes(b"")


@pytest.mark.parametrize("status, rows, asked, plan", [
    (s.COMPLETED, 4, 4, JobPlan("kept", 4, s.COMPLETED, 0.25)),
    (s.COMPLETED, 4, 6, JobPlan("resume", 4, s.COMPLETED)),      # asked for more
    (s.INTERRUPTED, 4, 6, JobPlan("resume", 4, s.INTERRUPTED)),
    (s.RUNNING, 3, 6, JobPlan("resume", 3, s.RUNNING)),            # killed
    (s.FAILED, 2, 6, JobPlan("resume", 2, s.FAILED)),              # e.g. a full disk
    (s.STALLED, 2, 6, JobPlan("kept", 2, s.STALLED, 0.5)),         # ended by itself
    (s.DIVERGED, 2, 6, JobPlan("kept", 2, s.DIVERGED, None)),
])
def test_each_job_does_what_its_directory_calls_for(tmp_path, status, rows, asked, plan):
    _job(tmp_path / "sweep" / "0", status, rows)
    jobs = SweepJobs(tmp_path / "sweep")
    assert jobs.plan(tmp_path / "sweep" / "0", asked, SEED) == plan
    assert jobs.plan(tmp_path / "sweep" / "1", asked, SEED) == JobPlan("fresh")  # not started


@pytest.mark.parametrize("status, how", [
    (s.RUNNING, r"was killed \(its status is still running\)"),
    (s.FAILED, r"stopped \(failed\)")])
def test_a_job_stopped_before_its_first_checkpoint_is_refused_not_truncated(
        tmp_path, status, how):
    """A refusal (exit 2) that says the job was killed, as `resume=SWEEP/0` does: was
    exit 1 and 'stopped (running)'."""
    _job(tmp_path / "sweep" / "0", status, 3, checkpoint=False)
    with pytest.raises(InputFileError, match=rf"sweep/0: this job of the sweep {how} after "
                                             rf"3 iterations, before its first checkpoint.* "
                                             rf"move its metrics.h5 away"):
        SweepJobs(tmp_path / "sweep").plan(tmp_path / "sweep" / "0", 6, SEED)


@pytest.mark.parametrize("status", [s.COMPLETED, s.INTERRUPTED])
def test_a_job_whose_checkpoint_is_gone_says_so(tmp_path, status):
    """Was refused as 'stopped before its first checkpoint': a completed or interrupted
    run wrote one as it stopped, so it was moved or deleted."""
    from lptrain.rundir import not_resumable
    _job(tmp_path / "sweep" / "0", status, 4, checkpoint=False)
    with pytest.raises(InputFileError, match=rf"no checkpoint.pt there, though its run "
                                           rf"stopped \({status}\) after 4 iterations and "
                                           rf"wrote one then \(moved or deleted\?\)"):
        SweepJobs(tmp_path / "sweep").plan(tmp_path / "sweep" / "0", 6, SEED)
    assert not_resumable(tmp_path / "sweep" / "0") == (
        f"no checkpoint.pt there, though its run stopped ({status}) after 4 iterations "
        f"and wrote one then (moved or deleted?): nothing to resume")


@pytest.mark.parametrize("status", [s.DIVERGED, s.STALLED])
def test_a_job_that_ended_before_its_first_checkpoint_is_kept(tmp_path, status):
    """Was refused as 'stopped before its first checkpoint': a run that diverged at
    iteration 2 ended, and a resume would end it the same way."""
    _job(tmp_path / "sweep" / "0", status, 2, checkpoint=False)
    plan = SweepJobs(tmp_path / "sweep").plan(tmp_path / "sweep" / "0", 6, SEED)
    assert (plan.action, plan.status, plan.iterations) == ("kept", status, 2)
    assert plan.failed == (status == s.DIVERGED)     # the resumed sweep exits 1, as it did


def test_a_single_run_without_a_checkpoint_says_how_it_ended(tmp_path):
    """`lptrain resume=DIR` of such a run (rundir.not_resumable) said 'only runs of this
    lptrain version can be resumed', which sent users looking for a version problem."""
    from lptrain.rundir import not_resumable
    _job(tmp_path / "run", s.DIVERGED, 2, checkpoint=False)
    assert not_resumable(tmp_path / "run") == (
        "its run stopped (diverged) after 2 iterations, before its first checkpoint: "
        "nothing to resume; run it again in another directory")
    _job(tmp_path / "killed", s.RUNNING, 3, checkpoint=False)     # a SIGKILL's file
    assert not_resumable(tmp_path / "killed").startswith(
        "its run was killed (its status is still running) after 3 iterations, before its "
        "first checkpoint")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "notes.txt").write_text("")
    assert "only runs of this lptrain version" in not_resumable(tmp_path / "elsewhere")
    # its checkpoint there, its .hydra/ deleted: it named the checkpoint as missing
    (tmp_path / "elsewhere" / "checkpoint.pt").write_bytes(b"")
    assert not_resumable(tmp_path / "elsewhere").startswith(
        "its checkpoint.pt is there but not .hydra/overrides.yaml")
    # killed while it started: only its lock there, which sent users looking for a
    # version problem too (held-out check)
    (tmp_path / "starting").mkdir()
    (tmp_path / "starting" / rundir.LOCK_FILE).write_text("host 1 token\n")
    assert not_resumable(tmp_path / "starting") == (
        "its run ended before its first iteration (no metrics.h5 there; its lptrain.log, "
        "if any, says why): nothing to resume; start the run again without resume=")
    assert not_resumable(tmp_path / "nowhere") == (    # was the 'no checkpoint.pt' line
        "no such directory; give the run directory lptrain printed when it stopped")
    assert not_resumable(tmp_path / "run" / s.FILE_NAME) == (
        f"a file, not a run's directory; did you mean `lptrain resume={tmp_path / 'run'}`?")


@pytest.mark.parametrize("status, rows", [(s.COMPLETED, 4), (s.INTERRUPTED, 2)])
def test_a_job_whose_directory_holds_a_run_of_other_overrides_is_refused(tmp_path, status,
                                                                          rows):
    """Was kept (or resumed) as that job: `resume=SWEEP train.iterations=3` of a sweep of
    seed=0,1 x train.iterations=2,3 reported seed=1's job kept with seed=0's run. What
    the directory held before Hydra rewrote its .hydra/ is what counts."""
    _job(tmp_path / "sweep" / "1", status, rows)
    jobs = SweepJobs(tmp_path / "sweep")
    # a key a resume gives anew, which the sweep did not sweep, may differ
    free = SweepJobs(tmp_path / "sweep", may_change=["train.iterations"])
    saved = tmp_path / "sweep" / "1" / ".hydra" / "overrides.yaml"
    saved.write_text("- seed=4\n- train.iterations=4\n")      # as Hydra rewrites it
    with pytest.raises(InputFileError, match=re.escape(
            f"{tmp_path / 'sweep' / '1'}: its run was seed=3, no train.iterations but this "
            f"job of the sweep is seed=4, train.iterations=4 (a run of other overrides)")):
        jobs.plan(tmp_path / "sweep" / "1", 4, ["seed=4", "train.iterations=4"])
    assert free.plan(tmp_path / "sweep" / "1", 4, ["seed=3", "train.iterations=4"]) \
        .action in ("kept", "resume")
    with pytest.raises(InputFileError, match="its run was seed=3 but this job of the "
                                             "sweep is seed=4 "):
        free.plan(tmp_path / "sweep" / "1", 4, ["train.iterations=4", "seed=4"])
    (tmp_path / "sweep" / "1" / ".hydra" / "overrides.yaml").unlink()
    with pytest.raises(InputFileError, match="no .hydra/overrides.yaml"):
        SweepJobs(tmp_path / "sweep").plan(tmp_path / "sweep" / "1", 4, SEED)


def test_a_new_value_of_a_key_the_sweep_swept_is_refused(tmp_path):
    """Was taken in place of the sweep's values: `train.iterations=20,400` resumed with
    train.iterations=30 ran one job of 30 iterations, left the other unmentioned and
    rewrote multirun.yaml into that one-job sweep."""
    (tmp_path / "multirun.yaml").write_text(MULTIRUN.replace(
        "train.iterations=400", "train.iterations=20,400").replace(
        "seed=3", "eval_every=range(1,3)"))
    for given, swept in (("train.iterations=30", "train.iterations=20,400"),
                         ("eval_every=2", "eval_every=range(1,3)")):
        with pytest.raises(ConfigError, match=re.escape(
                f"{given}: the sweep in {tmp_path} sweeps {swept} (each job keeps its "
                f"value); resume it without {given.split('=')[0]}=")):
            sweep_command(tmp_path, [given])
    command, swept = sweep_command(tmp_path, ["checkpoint_every=5"])
    assert swept_keys(command[1:]) == swept == {
        "optimizer.lr": "optimizer.lr=0.5,1.0", "train.iterations": "train.iterations=20,400",
        "eval_every": "eval_every=range(1,3)"}


def test_put_back_restores_a_jobs_saved_configuration(tmp_path):
    _job(tmp_path / "sweep" / "0", s.COMPLETED, 2)
    jobs = SweepJobs(tmp_path / "sweep")
    saved = tmp_path / "sweep" / "0" / ".hydra" / "overrides.yaml"
    saved.write_text("- seed=4\n")
    (saved.parent / "config.yaml").write_text("new: 1\n")
    jobs.put_back(tmp_path / "sweep" / "0")
    assert saved.read_text() == "- seed=3\n" and not (saved.parent / "config.yaml").exists()
    jobs.put_back(tmp_path / "sweep" / "7")        # a job that had no files: nothing
    # a job directory whose run had no .hydra/ (refused: no overrides to tell whose):
    # the one Hydra wrote for the job goes, else the next resume took it for the run's
    _job(tmp_path / "sweep" / "1", s.COMPLETED, 2)
    shutil.rmtree(tmp_path / "sweep" / "1" / ".hydra")
    jobs = SweepJobs(tmp_path / "sweep")
    written = tmp_path / "sweep" / "1" / ".hydra" / "overrides.yaml"
    written.parent.mkdir()
    written.write_text("- seed=4\n")
    with pytest.raises(InputFileError, match="no .hydra/overrides.yaml"):
        jobs.plan(tmp_path / "sweep" / "1", 4, ["seed=4"])
    jobs.put_back(tmp_path / "sweep" / "1")
    assert not written.parent.exists()
    with pytest.raises(InputFileError, match="no .hydra/overrides.yaml"):
        SweepJobs(tmp_path / "sweep").plan(tmp_path / "sweep" / "1", 4, ["seed=4"])


def test_put_back_finds_the_job_of_a_sweep_given_by_a_relative_path(tmp_path, monkeypatch):
    """`resume=sweep` from the sweep's parent: Hydra names the job by its absolute path."""
    _job(tmp_path / "sweep" / "0", s.COMPLETED, 2)
    monkeypatch.chdir(tmp_path)
    jobs = SweepJobs("sweep")
    saved = tmp_path / "sweep" / "0" / ".hydra" / "overrides.yaml"
    saved.write_text("- seed=4\n")
    jobs.put_back(tmp_path / "sweep" / "0")
    assert saved.read_text() == "- seed=3\n"


def test_the_sweeps_own_command_with_the_new_values(tmp_path):
    (tmp_path / "multirun.yaml").write_text(MULTIRUN)
    assert is_sweep(tmp_path) and not is_sweep(tmp_path / "0")
    assert sweep_command(tmp_path, ["train.iterations=600"])[0] == [
        "-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=4", "optimizer.lr=0.5,1.0",
        "seed=3", "train.iterations=600", f"hydra.sweep.dir={tmp_path}"]


@pytest.mark.parametrize("text, says", [
    ("hydra: {}\n", "unreadable"),
    ("hydra: {overrides: {hydra: [], task: [1, 2]}}\n", "not lists of strings"),
    ("hydra: {overrides: {hydra: [], task: ['dataset']}}\n", "'dataset' is not an override"),
    ("hydra: [\n", "unreadable"),
])
def test_a_damaged_multirun_file_is_named(tmp_path, text, says):
    (tmp_path / "multirun.yaml").write_text(text)
    with pytest.raises(InputFileError, match=f"multirun.yaml: .*{says}"):
        sweep_command(tmp_path, [])


def test_a_sweep_naming_jobs_by_overrides_keeps_their_directories(tmp_path):
    """A job that started keeps its directory however the resume's overrides would name
    it (by job number, through the resolver); one never started is named by the pattern."""
    from omegaconf import OmegaConf
    from lptrain.sweeps import install_job_dirs
    (tmp_path / "multirun.yaml").write_text(MULTIRUN.replace(
        "    - hydra.mode=MULTIRUN\n",
        "    - hydra.mode=MULTIRUN\n    - hydra.sweep.subdir=${hydra.job.override_dirname}\n"))
    for num, name in ((0, "seed=1,x=3"), (1, "sub/seed=2,x=3")):
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  job:\n    num: {num}\n")
    assert job_dirs(tmp_path) == {0: "seed=1,x=3", 1: "sub/seed=2,x=3"}
    command, _ = sweep_command(tmp_path, ["train.iterations=600"])
    pinned = (f"hydra.sweep.subdir=\"${{{RESOLVER}:${{hydra.job.num}},"
              f"'${{hydra.job.override_dirname}}'}}\"")
    assert pinned in command
    install_job_dirs(tmp_path)
    value = pinned.split("=", 1)[1].strip('"')
    for num, want in ((0, "seed=1,x=3"), (1, "sub/seed=2,x=3"), (2, "seed=3,x=4")):
        cfg = OmegaConf.create({"num": num, "dirname": "seed=3,x=4", "subdir": value.replace(
            "hydra.job.num", "num").replace("hydra.job.override_dirname", "dirname")})
        assert cfg.subdir == want
    # resumed again: the saved override is the pinned one, pinned the same way
    (tmp_path / "multirun.yaml").write_text(MULTIRUN.replace(
        "    - hydra.mode=MULTIRUN\n", f"    - hydra.mode=MULTIRUN\n    - {pinned}\n"))
    assert pinned in sweep_command(tmp_path, [])[0]



def test_a_mini_batch_run_is_ranked_by_its_last_whole_epochs_mean(tmp_path):
    """A sweep named the job with the lowest last-batch objective best, the worst of three
    by validation, and gave Optuna that value (held-out, stop 64): a mini-batch run
    returns, records and is kept with the mean objective of its last whole epoch."""
    import numpy as np

    from helpers import composed
    from lptrain import app
    from lptrain.metrics.reader import read_metrics
    run_dir = tmp_path / "sweep" / "0"
    run_dir.mkdir(parents=True)
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "overrides.yaml").write_text("- seed=3\n")
    cfg = composed("optimizer=sgd", "train.batch_size=50", "dataset.n_train=200",
                   "dataset.n_val=40", "network.layers=4", "train.iterations=10", "seed=3")
    outcome = app.run(cfg, None, run_dir)         # 4 batches an epoch: 2 whole, 2 more
    m = read_metrics(run_dir)
    last_epoch = float(np.mean(m.train[s.OBJECTIVE][4:8]))
    assert outcome.ranked == outcome.epoch_objective == pytest.approx(last_epoch, rel=1e-12)
    assert outcome.objective == m.train[s.OBJECTIVE][-1] != outcome.ranked
    assert m.attrs[s.EPOCH_OBJECTIVE] == pytest.approx(last_epoch, rel=1e-12)
    plan = SweepJobs(tmp_path / "sweep").plan(run_dir, 10, SEED)
    assert plan == JobPlan("kept", 10, s.COMPLETED, m.attrs[s.EPOCH_OBJECTIVE])
