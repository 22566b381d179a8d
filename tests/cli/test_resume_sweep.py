"""`lptrain resume=SWEEP_DIR`: a multirun stopped by Ctrl-C carries on as a whole. The
stopped job continues from its checkpoint and equals an uninterrupted one, jobs never
started run, jobs that ended are kept with their objective, and a job whose directory
holds a run of other overrides is refused with its files left as they were."""
from __future__ import annotations

import signal
import time

import numpy as np
import pytest

from launch import lptrain, start
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics

pytestmark = [pytest.mark.cli]

TINY = ["network.layers=4", "network.width=4", "dataset.n_train=200", "dataset.n_val=50",
        "eval_every=2"]
TIMEOUT = 120


def _rows(path) -> int:
    try:
        return read_metrics(path).n_iterations
    except (ms.MetricsFileError, OSError, KeyError):
        return 0


def _objective(job) -> np.ndarray:
    return read_metrics(job / ms.FILE_NAME).train[ms.OBJECTIVE]


def test_a_sweep_stopped_by_a_signal_carries_on_where_it_stopped(tmp_path):
    sweep = tmp_path / "sweep"
    # jobs 0 and 2 train the same configuration: job 2 is the uninterrupted run of job 0
    proc = start(["-m", f"hydra.sweep.dir={sweep}", *TINY, "seed=1,2,1",
                  "train.iterations=1000000"], tmp_path)
    try:
        deadline = time.monotonic() + TIMEOUT
        while _rows(sweep / "0" / ms.FILE_NAME) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=TIMEOUT) == 128 + signal.SIGINT
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.output()[1].strip().splitlines()
    assert err[-1].endswith(f"resume with: lptrain resume={sweep}"), err
    assert not (sweep / "1").exists()          # the jobs after it never started
    done = read_metrics(sweep / "0" / ms.FILE_NAME).n_iterations
    total = done + 3
    again = lptrain([f"resume={sweep}", f"train.iterations={total}"], tmp_path)
    assert again.returncode == 0, again.stderr
    for job in ("0", "1", "2"):
        m = read_metrics(sweep / job / ms.FILE_NAME)
        assert m.status == ms.COMPLETED, job
        np.testing.assert_array_equal(m.train[ms.ITERATION], np.arange(1, total + 1))
    np.testing.assert_array_equal(_objective(sweep / "0"), _objective(sweep / "2"))
    assert not (_objective(sweep / "1") == _objective(sweep / "0")).all()    # seed 2


def test_jobs_that_ended_are_kept_and_a_changed_job_is_refused_untouched(tmp_path):
    sweep = tmp_path / "sweep"
    first = lptrain(["-m", f"hydra.sweep.dir={sweep}", *TINY, "seed=1,2",
                     "train.iterations=3"], tmp_path)
    assert first.returncode == 0, first.stderr
    before = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()
              and p.suffix != ".log" and p.name != "multirun.yaml"}   # the latest sweep's
    # fewer iterations than done: every job kept, its files as they were (Hydra had
    # rewritten its .hydra/ with train.iterations=2)
    kept = lptrain([f"resume={sweep}", "train.iterations=2"], tmp_path)
    assert kept.returncode == 0, kept.stderr
    for job in ("0", "1"):
        objective = _objective(sweep / job)[-1]
        assert (f"lptrain: job {job} ({sweep / job}) kept: completed earlier after 3 "
                f"iterations, objective {objective:.6g}") in kept.stdout
    assert [p for p in before if p.read_bytes() != before[p]] == []    # nothing rewritten

    # a sweep whose jobs come out otherwise than its directory's (here: edited)
    saved = sweep / "multirun.yaml"
    saved.write_text(saved.read_text().replace("- seed=1,2", "- seed=5,2"))
    hydra0 = {p: p.read_bytes() for p in (sweep / "0" / ".hydra").iterdir()}
    changed = lptrain([f"resume={sweep}", "train.iterations=5"], tmp_path)
    assert changed.returncode == 2
    assert [ln for ln in changed.stderr.splitlines() if "error" in ln] == [
        f"lptrain: error: {sweep / '0'}: its run was seed=1 but this job of the sweep is "
        f"seed=5 (a run of other overrides); move the directory away to run the job there"]
    assert {p: p.read_bytes() for p in hydra0} == hydra0       # put back
    assert read_metrics(sweep / "0" / ms.FILE_NAME).n_iterations == 3
    assert read_metrics(sweep / "1" / ms.FILE_NAME).n_iterations == 5   # the sweep went on
    # a new value of a key the sweep swept would make another sweep: refused, unwritten
    saved.write_text(saved.read_text().replace("- eval_every=2", "- eval_every=2,3"))
    text = saved.read_text()
    swept = lptrain([f"resume={sweep}", "eval_every=4"], tmp_path)
    assert (swept.returncode, swept.stderr.strip()) == (2, (
        f"lptrain: error: eval_every=4: the sweep in {sweep} sweeps eval_every=2,3 (each job "
        f"keeps its value); resume it without eval_every="))
    assert saved.read_text() == text


def test_a_sweep_directory_refuses_a_new_sweep_and_says_how_to_resume_it(tmp_path):
    sweep = tmp_path / "sweep"
    first = lptrain(["-m", f"hydra.sweep.dir={sweep}", *TINY, "seed=1",
                     "train.iterations=2"], tmp_path)
    assert first.returncode == 0, first.stderr
    again = lptrain(["-m", f"hydra.sweep.dir={sweep}", *TINY, "seed=3",
                     "train.iterations=2"], tmp_path)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines()[-1].endswith(
        f"continue that sweep with `lptrain resume={sweep}`")
    # a sweeper that saves no multirun.yaml (Optuna's): its jobs resume one by one
    (sweep / "multirun.yaml").unlink()
    jobs = lptrain([f"resume={sweep}"], tmp_path)
    assert jobs.returncode == 2
    assert jobs.stderr.strip().splitlines() == [
        f"lptrain: error: resume={sweep}: a sweep whose sweeper saved no multirun.yaml (only "
        f"the basic sweeper's can be resumed as a whole); resume its jobs one by one "
        f"(resume={sweep / '0'} ...)"]


def test_jobs_named_by_their_overrides_resume_in_their_directories(tmp_path):
    """With hydra.sweep.subdir=${hydra.job.override_dirname}, a resume's new
    train.iterations renamed every job: they started over in new directories beside
    their earlier runs. Each job that started keeps its directory now."""
    sweep = tmp_path / "sweep"
    first = lptrain(["-m", f"hydra.sweep.dir={sweep}", *TINY, "seed=1,2",
                     "hydra.sweep.subdir=${hydra.job.override_dirname}",
                     "train.iterations=2"], tmp_path)
    assert first.returncode == 0, first.stderr
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 2 and all(j.endswith(",train.iterations=2") for j in jobs), jobs
    again = lptrain([f"resume={sweep}", "train.iterations=3"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == jobs
    for job in jobs:
        np.testing.assert_array_equal(read_metrics(sweep / job / ms.FILE_NAME)
                                      .train[ms.ITERATION], [1, 2, 3])


def test_a_job_sent_into_an_earlier_jobs_folder_is_refused_and_leaves_it(tmp_path):
    """hydra.sweep.subdir naming no swept key gave two jobs one folder: the second failed
    there ("metrics.h5: exists") after Hydra had rewritten the first run's .hydra/, which
    then read as the second job's (lptrain-report's labels, the sweep's resume)."""
    sweep = tmp_path / "sweep"
    run = lptrain(["-m", f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=same", *TINY,
                   "seed=1,2", "train.iterations=3"], tmp_path)
    assert run.returncode == 2
    assert [ln for ln in run.stderr.splitlines() if "error" in ln] == [
        f"lptrain: error: job 1: {sweep / 'same'} holds the run of job 0 of this sweep "
        f"(hydra.sweep.subdir gives both one folder); give each job its own, e.g. "
        f"hydra.sweep.subdir='${{hydra.job.num}}' (the default)"]
    overrides = (sweep / "same" / ".hydra" / "overrides.yaml").read_text()
    assert "- seed=1\n" in overrides and "seed=2" not in overrides
    assert read_metrics(sweep / "same").n_iterations == 3
    assert "1 finished, 1 failed" in run.stdout
    # resumed: job 0 runs on, job 1 is refused there again, and what is put back is job
    # 0's .hydra/ as this resume left it (it was the one of before the resume)
    again = lptrain([f"resume={sweep}", "train.iterations=5"], tmp_path)
    assert again.returncode == 2
    overrides = (sweep / "same" / ".hydra" / "overrides.yaml").read_text()
    assert "- seed=1\n" in overrides and "- train.iterations=5\n" in overrides
    assert read_metrics(sweep / "same").n_iterations == 5
