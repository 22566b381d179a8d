"""DistributedDataParallel around a network with LayerParallel: on 1 × 2 and 2 × 2 grids
(one launch of 4 ranks) every gradient equals the whole batch's in one process, and a
DDP whose group spans layer ranks is refused."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import ddp_case  # noqa: E402

pytestmark = pytest.mark.mpi
MPIEXEC = Path(sys.executable).parent / "mpiexec"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp") / "out.pt"
    env = dict(os.environ, MPIR_CVAR_ENABLE_HEAVY_YIELD="1", OMP_NUM_THREADS="1")
    cmd = ["timeout", "300", str(MPIEXEC), "-n", "4", sys.executable, ddp_case.__file__,
           str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=340)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out)


@pytest.mark.parametrize("grid", ["1x2", "2x2"])
def test_gradients_equal_the_whole_batch_in_one_process(grid, results):
    got, want = results[f"{grid}-data"], ddp_case.reference()
    assert set(got) == set(want) and len(want) == 2 + 2 * ddp_case.N
    for key, ref in want.items():
        assert float((got[key] - ref).abs().max()) <= 1e-10 * float(ref.abs().max()), key


def test_a_group_across_layer_ranks_is_refused(results):
    error = results["2x2-world"]["error"]
    assert "holding layers 8..15 as well as this rank's 0..7" in error
    assert "data_process_group" in error
