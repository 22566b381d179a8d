"""Sweeps under mpiexec: rank 0's sweeper decides every job and both ranks train it.

A serial sweep on one rank is the reference. The basic sweeper and Optuna then sweep a
key that changes tensor shapes (network.width) on 2 ranks in mode=mgrit, whose layers
are split over the ranks: a job whose ranks built different networks cannot finish, and
its objective history equals the serial one of the width its metrics.h5 records only if
both ranks trained that configuration. Optuna's study (kept in SQLite) must hold one
trial per job, with that job's width and final objective.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from launch import lptrain
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics

pytestmark = [pytest.mark.cli, pytest.mark.mpi]

TIMEOUT = 120
WIDTHS = (3, 5)
TINY = ["network.layers=8", "dataset.n_train=200", "dataset.n_val=50", "train.iterations=3",
        "eval_every=1000", "mgrit.levels=2", "mgrit.cfactor0=2", "mgrit.tol=1e-12"]
SWEEP = f"network.width={','.join(map(str, WIDTHS))}"


def _sweep(args, sweep_dir: Path, ranks: int) -> list[Path]:
    proc = lptrain(["-m", f"hydra.sweep.dir={sweep_dir}", *TINY, *args], ranks=ranks,
                   timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sorted((p for p in sweep_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def _job(run_dir: Path, ranks: int):
    """(width, objective history) of a completed job on `ranks` ranks."""
    m = read_metrics(run_dir / ms.FILE_NAME)
    assert m.status == ms.COMPLETED and m.attrs[ms.WORLD_SIZE] == ranks
    return OmegaConf.create(m.attrs[ms.CONFIG]).network.width, m.train[ms.OBJECTIVE]


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """width -> objective history of the serial run on one rank."""
    jobs = _sweep(["mode=serial", SWEEP], tmp_path_factory.mktemp("serial") / "s", ranks=1)
    return dict(_job(p, 1) for p in jobs)


def _assert_trained_as_serial(run_dir: Path, serial) -> int:
    width, objective = _job(run_dir, 2)
    assert len(objective) == 3
    np.testing.assert_allclose(objective, serial[width], rtol=1e-8)
    return width


def test_basic_sweeper_on_two_ranks(serial, tmp_path):
    jobs = _sweep(["mode=mgrit", SWEEP], tmp_path / "sweep", ranks=2)
    assert [_assert_trained_as_serial(p, serial) for p in jobs] == list(WIDTHS)


def test_optuna_on_two_ranks_samples_once_and_sees_every_objective(serial, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    optuna = pytest.importorskip("optuna")
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    trials = 4
    jobs = _sweep(["mode=mgrit", "hydra/sweeper=optuna", f"hydra.sweeper.n_trials={trials}",
                   f"hydra.sweeper.storage='{storage}'", "hydra.sweeper.study_name=widths",
                   f"network.width=choice({','.join(map(str, WIDTHS))})"],
                  tmp_path / "sweep", ranks=2)
    study = optuna.load_study(study_name="widths", storage=storage)
    done = sorted(study.trials, key=lambda t: t.number)
    assert len(jobs) == len(done) == trials      # one study, one trial per job
    for run_dir, trial in zip(jobs, done):
        width = _assert_trained_as_serial(run_dir, serial)
        assert trial.state == optuna.trial.TrialState.COMPLETE
        assert trial.params == {"network.width": width}
        final = read_metrics(run_dir / ms.FILE_NAME).train[ms.OBJECTIVE][-1]
        assert trial.value == pytest.approx(final, rel=1e-12)
    best = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    assert best.best_value == pytest.approx(min(t.value for t in done), rel=1e-12)


def test_an_error_of_rank_0s_hydra_ends_every_rank_once(tmp_path):
    sweep = tmp_path / "sweep"
    proc = lptrain(["-m", f"hydra.sweep.dir={sweep}", *TINY, "hydra.sweeper.foo=1",
                    "seed=1,2"], ranks=2, timeout=TIMEOUT)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("lptrain: error: hydra.sweeper.foo: Key 'foo' not in") == 1, \
        proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not list(sweep.glob(f"*/{ms.FILE_NAME}"))


def test_an_optuna_sweep_whose_every_job_is_refused_ends_in_one_line(tmp_path):
    """The sweeper goes on past lptrain's failed jobs and, with none completed, has no
    best trial to name: its error is one line after the jobs' own, with their status."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep = tmp_path / "sweep"
    proc = lptrain(["-m", f"hydra.sweep.dir={sweep}", *TINY, "hydra/sweeper=optuna",
                    "hydra.sweeper.n_trials=2", "network.width=choice(90000,100000)"],
                   ranks=2, timeout=TIMEOUT)
    out = proc.stderr + proc.stdout
    assert proc.returncode == 2, out
    # each job's line names the job (with stdout apart, nothing did)
    assert out.count("lptrain: error: job 0: memory: ") == 1, out
    assert out.count("lptrain: error: job 1: memory: ") == 1, out
    assert out.count("lptrain: error: the sweeper ended the sweep: ValueError: No trials "
                     "are completed yet. (2 of its 2 jobs failed") == 1, out
    assert "Traceback" not in out
    assert "get_best_trial" in (sweep / "error-hydra.log").read_text()
