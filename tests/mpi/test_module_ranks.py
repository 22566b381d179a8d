"""LayerParallel on 1..4 ranks equals serial autograd: outputs, every gradient, state."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import module_case  # noqa: E402

MPIEXEC = Path(sys.executable).parent / "mpiexec"
pytestmark = pytest.mark.mpi


def launch_script(script, ranks: int, out: Path) -> dict:
    """`script out` under mpiexec -n ranks (one launch for all cases); rank 0's results."""
    env = dict(os.environ, MPIR_CVAR_ENABLE_HEAVY_YIELD="1", OMP_NUM_THREADS="1")
    cmd = ["timeout", "200", str(MPIEXEC), "-n", str(ranks), sys.executable, str(script),
           str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out)


@pytest.fixture(scope="module")
def reference():
    return module_case.reference()


def assert_equal(got: dict, ref: dict):
    assert set(got) == set(ref)
    for key, want in ref.items():
        assert got[key].shape == want.shape, key
        scale = max(float(want.abs().max()), 1e-30)
        assert float((got[key] - want).abs().max()) <= 1e-10 * scale, key


def test_one_rank_equals_serial(reference):
    assert_equal(module_case.run(), reference)


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_many_ranks_equal_serial(ranks, reference, tmp_path):
    assert_equal(launch_script(module_case.__file__, ranks, tmp_path / "out.pt"), reference)
