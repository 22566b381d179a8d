"""`lptrain resume=DIR` end to end: a run stopped on 2 ranks continues on 1 rank and equals
the uninterrupted run (every mode, to 1e-10: the simultaneous mode's warm starts move to
the one rank); metrics.h5 says which rows ran on how many ranks."""
from __future__ import annotations

import numpy as np
import pytest

from launch import lptrain
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics

pytestmark = [pytest.mark.cli, pytest.mark.mpi]

TINY = ["network.layers=8", "network.width=4", "dataset.n_train=200", "dataset.n_val=50",
        "seed=2", "eval_every=2", "mgrit.levels=2", "mgrit.cfactor0=2", "mgrit.tol=1e-13"]
MODES = ("serial", "mgrit", "simultaneous")


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """mode -> a run of 4 iterations on 2 ranks; one mpiexec launch runs them all (a sweep)."""
    sweep = tmp_path_factory.mktemp("parts") / "sweep"
    proc = lptrain(["-m", f"hydra.sweep.dir={sweep}", *TINY, f"mode={','.join(MODES)}",
                    "train.iterations=4"], sweep.parent, ranks=2, timeout=360)
    assert proc.returncode == 0, proc.stderr
    jobs = [p for p in sorted(sweep.iterdir()) if p.is_dir() and p.name.isdigit()]
    return {read_metrics(p / ms.FILE_NAME).mode: p for p in jobs}


@pytest.mark.parametrize("mode", MODES)
def test_resume_on_another_rank_count_equals_the_uninterrupted_run(mode, stopped, tmp_path):
    whole, parts = tmp_path / "whole", stopped[mode]
    one = lptrain([f"hydra.run.dir={whole}", *TINY, f"mode={mode}", "train.iterations=8"],
                  tmp_path)
    assert one.returncode == 0, one.stderr
    second = lptrain([f"resume={parts}", "train.iterations=8"], tmp_path)
    assert second.returncode == 0, second.stderr
    a, b = read_metrics(whole / ms.FILE_NAME), read_metrics(parts / ms.FILE_NAME)
    assert b.status == ms.COMPLETED and b.attrs[ms.WORLD_SIZE] == 1   # the latest start's
    np.testing.assert_array_equal(b.train[ms.ITERATION], np.arange(1, 9))
    np.testing.assert_allclose(b.train[ms.OBJECTIVE], a.train[ms.OBJECTIVE], rtol=1e-10,
                               atol=0)
    np.testing.assert_array_equal(b.validation[ms.ACCURACY], a.validation[ms.ACCURACY])
    np.testing.assert_array_equal(b.timing[ms.WORLD_SIZE], [2] * 4 + [1] * 4)
    assert b.timing[ms.COMPUTE].shape == (8, 2) and np.isnan(b.timing[ms.COMPUTE][4:, 1]).all()


def test_a_run_in_a_directory_with_a_space_and_a_quote_resumes(tmp_path):
    """Hydra takes such a directory quoted (hydra.run.dir='...'): the lock went to a
    directory named with the quotes, and resume= handed Hydra the path bare (a lexer
    error). The stop and refusal lines quote it for the shell."""
    run = tmp_path / "my runs" / "it's ü"
    quoted = "'" + str(run).replace("'", "\\'") + "'"
    first = lptrain([f"hydra.run.dir={quoted}", *TINY, "train.iterations=2"], tmp_path)
    assert first.returncode == 0, first.stderr
    again = lptrain([f"hydra.run.dir={quoted}", *TINY], tmp_path)
    assert again.returncode == 2 and f"""`lptrain 'resume={run}'`""".replace(
        "'s", "'\"'\"'s") in again.stderr, again.stderr
    resumed = lptrain([f"resume={run}", "train.iterations=3"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert read_metrics(run / ms.FILE_NAME).n_iterations == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my runs"]

