"""CLI: mode=mgrit gives serial's objective history on 1 and 4 ranks; multirun under mpiexec."""
from pathlib import Path

import numpy as np
import pytest

from launch import lptrain
from lptrain.metrics.reader import read_metrics
from lptrain.metrics.timing import text_lines
from lptrain.report.table import rank_times

ITERATIONS = 3       # L-BFGS steps whose objectives mgrit must reproduce
TINY = ["network.layers=12", "network.width=4", "dataset.n_train=200", "dataset.n_val=50",
        f"train.iterations={ITERATIONS}", "mgrit.levels=3", "mgrit.cfactor0=2",
        "mgrit.cfactor=2", "mgrit.tol=1e-12", "eval_every=5"]
pytestmark = pytest.mark.cli


def run(args, ranks=1, timeout=240):
    proc = lptrain(args, ranks=ranks, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def objectives(run_dir):
    m = read_metrics(Path(run_dir) / "metrics.h5")
    assert m.status == "completed"
    return m, m.train["objective"]


@pytest.mark.mpi
def test_mgrit_mode_equals_serial_on_1_and_4_ranks(tmp_path):
    run([*TINY, "mode=serial", f"hydra.run.dir={tmp_path / 's'}"])
    one = run([*TINY, "mode=mgrit", f"hydra.run.dir={tmp_path / 'm1'}"])
    # in the ranks of the 4-rank launch that tests/mpi/conftest.py's cases share
    four = run([*TINY, "mode=mgrit", f"hydra.run.dir={tmp_path / 'm4'}"], ranks=4)
    _, ref = objectives(tmp_path / "s")
    for name, ranks in (("m1", 1), ("m4", 4)):
        m, got = objectives(tmp_path / name)
        assert m.attrs["world_size"] == ranks and len(got) == ITERATIONS
        np.testing.assert_allclose(got, ref, rtol=1e-8)
        assert np.all(m.mgrit["fwd_residual"] <= 1e-12)
        assert m.timing["compute"].shape == (ITERATIONS, ranks)
    # the summary's time per rank: the totals of the file's timing/ rows, on 4 ranks only
    lines = text_lines(rank_times(read_metrics(tmp_path / "m4" / "metrics.h5")))
    assert all(line in four.stdout for line in lines) and len(lines) == 6
    assert "time per rank" not in one.stdout


@pytest.mark.mpi
def test_multirun_under_mpiexec_agrees_on_directories(tmp_path):
    sweep = tmp_path / "sweep"
    run(["-m", *TINY, "mode=simultaneous", "mgrit.cfactor0=2,3",
             f"hydra.sweep.dir={sweep}"], ranks=2)
    runs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [p.name for p in runs] == ["0", "1"]
    for p in runs:
        m, obj = objectives(p)
        assert m.attrs["world_size"] == 2 and len(obj) == ITERATIONS
    assert not list(sweep.rglob("error-rank*.log"))
