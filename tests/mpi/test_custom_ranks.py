"""network=custom (two convolutions with a GroupNorm) on 2 ranks = on 1 rank, converged
MGRIT = serial (objective histories to 1e-8, float64), and a run stopped on 1 rank and
resumed on 2 = the uninterrupted run. The 2-rank runs: custom_case.py in the ranks of the
tests' shared 2-rank launch (tests/rankserver.py)."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import custom_case  # noqa: E402
from lptrain.metrics import schema as ms  # noqa: E402
from lptrain.metrics.reader import read_metrics  # noqa: E402
from lptrain.errors import Interrupted  # noqa: E402
from lptrain.model.saved import load_model  # noqa: E402
from helpers import StopAt  # noqa: E402
from launch import ENV, python  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{ranks: {case: metrics}} for 1 rank (in process) and 2 ranks (one launch)."""
    base = tmp_path_factory.mktemp("custom")
    for case in custom_case.CASES:
        (base / "one" / case).mkdir(parents=True)
        custom_case.app.run(custom_case.cfg(case), None, base / "one" / case)
    stopped = base / "stopped"
    stopped.mkdir()
    with pytest.raises(Interrupted):
        custom_case.app.run(custom_case.cfg(custom_case.STOPPED), None, stopped,
                            StopAt(custom_case.STOP_AT))
    proc = python(custom_case.__file__, [base / "two", stopped], ranks=2, timeout=500,
                  env={**ENV, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {ranks: {case: (read_metrics(base / d / case / ms.FILE_NAME), base / d / case)
                    for case in [*custom_case.CASES, "resumed"] if (base / d / case).exists()}
            for ranks, d in ((1, "one"), (2, "two"))}


@pytest.mark.parametrize("case, says", [
    ("refused-on-rank-1", "RuntimeError: this step fails on rank 1"),
    ("unbuilt-on-rank-1", "failed: RuntimeError: this step cannot be built on rank 1")])
def test_a_step_refused_on_one_rank_ends_every_rank(runs, case, says):
    # the fixture's launch would have timed out had a rank waited
    two = next(iter(runs[2].values()))[1].parent
    error = (two / case / "error.txt").read_text()
    assert error.startswith(f"2 network.step: custom_step_pkg.{custom_case.REFUSED[case]}(")
    assert says in error and error.rstrip().endswith("(on rank 1)")   # which one failed


def _close(a, b, what, rtol=1e-8):
    np.testing.assert_allclose(a, b, rtol=rtol, atol=0, err_msg=what)


@pytest.mark.parametrize("ranks", [1, 2])
def test_converged_mgrit_trains_as_serial(runs, ranks):
    serial, mgrit = runs[1]["serial"][0], runs[ranks]["mgrit"][0]
    _close(mgrit.train[ms.OBJECTIVE], serial.train[ms.OBJECTIVE], f"{ranks} ranks")
    _close(mgrit.validation[ms.LOSS], serial.validation[ms.LOSS], f"{ranks} ranks")
    assert serial.train[ms.OBJECTIVE][-1] < serial.train[ms.OBJECTIVE][0]


@pytest.mark.parametrize("case", sorted(custom_case.CASES))
def test_two_ranks_equal_one(runs, case):
    (one, one_dir), (two, two_dir) = runs[1][case], runs[2][case]
    assert two.attrs[ms.WORLD_SIZE] == 2
    assert two.status == ms.COMPLETED
    for key in (ms.OBJECTIVE, ms.LOSS):
        _close(two.train[key], one.train[key], f"{case}: {key}")
    _close(load_model(two_dir, "last").theta, load_model(one_dir, "last").theta, case,
           rtol=1e-7)


def test_stopped_on_one_rank_and_resumed_on_two_equals_the_uninterrupted_run(runs):
    """The warm starts of the custom step's states move to the 2-rank grid."""
    whole, resumed = runs[1][custom_case.STOPPED][0], runs[2]["resumed"][0]
    assert resumed.status == ms.COMPLETED
    np.testing.assert_array_equal(resumed.train[ms.ITERATION], whole.train[ms.ITERATION])
    for key in (ms.OBJECTIVE, ms.LOSS):
        _close(resumed.train[key], whole.train[key], f"resumed: {key}", rtol=1e-10)
