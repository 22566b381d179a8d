"""Resumed on another rank count or grid = the uninterrupted run (1e-10, float64).

Every mode, full batch and mini-batches (warm starts of revisited batches, evictions,
data groups without a batch's samples): stopped on 1 rank and resumed on 2 (2x1 and
1x2), stopped on 2 and resumed on 1, stopped on 2x1 and resumed on 1x2 and back. One
run of resume_case.py in the ranks of the tests' shared 2-rank launch (tests/rankserver.py)
does every 2-rank part.
"""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import resume_case  # noqa: E402
from lptrain.metrics import schema as ms  # noqa: E402
from lptrain.metrics.reader import read_metrics  # noqa: E402
from lptrain.model.saved import load_model  # noqa: E402
from lptrain.train import checkpoint as ck  # noqa: E402
from launch import ENV, python  # noqa: E402

CASES = sorted(resume_case.CASES)
pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """BASE/{whole, one, from_one, two, across}/CASE[/GRID] (see resume_case.py); the
    2-rank stops resumed on one rank in place."""
    base = tmp_path_factory.mktemp("resume")
    for case in CASES:
        total = resume_case.CASES[case][2]
        whole = base / "whole" / case
        whole.mkdir(parents=True)
        resume_case.app.run(resume_case.cfg(case, total), None, whole)
        resume_case.stopped(case, None, base / "one" / case)
    proc = python(resume_case.__file__, [base], ranks=2, timeout=600,
                  env={**ENV, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for case in CASES:
        for grid in resume_case.grids(case):
            two = base / "two" / case / grid
            assert ck.load_checkpoint(two / ck.CHECKPOINT_FILE)["world_size"] == 2
            resume_case.resumed(case, None, two, base / "to_one" / case / grid)
    return base


def _resumed_dirs(base: Path, case: str) -> dict:
    """{how: run dir} of every resumed run of `case`."""
    found = {}
    for how in ("from_one", "to_one", "across"):
        for d in sorted((base / how / case).glob("*")):
            found[f"{how}/{d.name}"] = d
    return found


def _close(a, b, what):
    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-14, err_msg=what)


@pytest.mark.parametrize("case", CASES)
def test_resumed_on_another_grid_equals_the_uninterrupted_run(case, runs):
    whole = read_metrics(runs / "whole" / case / ms.FILE_NAME)
    total = resume_case.CASES[case][2]
    resumed = _resumed_dirs(runs, case)
    assert len(resumed) == (2 if case.startswith("serial") else 6)
    for how, run_dir in resumed.items():
        got = read_metrics(run_dir / ms.FILE_NAME)
        assert got.status == ms.COMPLETED, how
        np.testing.assert_array_equal(got.train[ms.ITERATION], np.arange(1, total + 1))
        for key in (ms.OBJECTIVE, ms.LOSS, "grad_norm", "step_size"):
            _close(got.train[key], whole.train[key], f"{how} {key}")
        _close(got.validation[ms.LOSS], whole.validation[ms.LOSS], how)
        np.testing.assert_array_equal(got.validation[ms.ACCURACY],
                                      whole.validation[ms.ACCURACY])
        if not case.startswith("serial"):   # rank 0's record: 0 where its group had
            for key in ("fwd_iterations", "adj_iterations"):       # no samples
                solved = got.mgrit[key] > 0
                np.testing.assert_array_equal(got.mgrit[key][solved], whole.mgrit[key][solved],
                                              how)
        _close(load_model(run_dir).theta, load_model(runs / "whole" / case).theta, how)


@pytest.mark.parametrize("case", ["simultaneous-adam-batches", "mgrit-lbfgs"])
def test_each_timing_row_names_the_grid_that_computed_it(case, runs):
    at, total = resume_case.CASES[case][1:]
    grids = {"from_one": ((1, 1), (2, 1)), "to_one": ((2, 1), (1, 1)),
             "across": ((2, 1), (1, 2))}         # (layer, data) before and after the stop
    for how, (first, then) in grids.items():
        m = read_metrics(runs / how / case / "2x1" / ms.FILE_NAME)
        rows = np.array([first] * at + [then] * (total - at))
        np.testing.assert_array_equal(m.timing[ms.LAYER_RANKS], rows[:, 0], how)
        np.testing.assert_array_equal(m.timing[ms.DATA_RANKS], rows[:, 1], how)
        ranks = rows.prod(axis=1)
        np.testing.assert_array_equal(m.timing[ms.WORLD_SIZE], ranks, how)
        assert m.timing[ms.COMPUTE].shape == (total, 2), how
        assert np.isnan(m.timing[ms.COMPUTE][ranks == 1, 1]).all(), how
        assert not np.isnan(m.timing[ms.COMPUTE][ranks == 2]).any(), how
        assert (m.attrs[ms.WORLD_SIZE], m.attrs[ms.LAYER_RANKS],
                m.attrs[ms.DATA_RANKS]) == (then[0] * then[1], *then), how
