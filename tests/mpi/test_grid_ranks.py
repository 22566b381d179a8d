"""Layer × data grids on 4 ranks (4x1, 2x2, 1x4) against one rank: one launch runs them all."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import grid_case  # noqa: E402

MPIEXEC = Path(sys.executable).parent / "mpiexec"
RANKS = 4
pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def one_rank():
    return grid_case.run(None)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("grid") / "out.pt"
    env = dict(os.environ, MPIR_CVAR_ENABLE_HEAVY_YIELD="1", OMP_NUM_THREADS="1")
    cmd = [str(MPIEXEC), "-n", str(RANKS), sys.executable, grid_case.__file__, str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out)


def _rel(a, b) -> float:
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30)


def test_every_grid_ran(four_ranks):
    want = {f"{name}/{layer}x{RANKS // layer}" for name, o in grid_case.CASES.items()
            for layer in grid_case.grids(RANKS, o)}
    assert set(four_ranks) == want
    assert {"lbfgs-simultaneous/4x1", "lbfgs-simultaneous/2x2",
            "lbfgs-simultaneous/1x4"} <= want


@pytest.mark.parametrize("case", sorted(grid_case.CASES))
def test_grids_equal_one_rank(case, one_rank, four_ranks):
    """Full batch and mini-batches (some groups without samples): 1e-10 of one rank."""
    ref = one_rank[f"{case}/1x1"]
    for key, got in four_ranks.items():
        if key.split("/")[0] != case:
            continue
        for part in ("train", "val", "theta"):
            assert got[part].shape == ref[part].shape, (key, part)
            assert _rel(got[part], ref[part]) <= 1e-10, (key, part)


def test_mgrit_on_every_grid_equals_serial(one_rank, four_ranks):
    serial = one_rank["lbfgs-serial/1x1"]
    for key, got in four_ranks.items():
        if key.startswith("lbfgs-mgrit/"):
            assert _rel(got["train"], serial["train"]) <= 1e-9, key
            assert _rel(got["theta"], serial["theta"]) <= 1e-9, key


def test_the_runs_trained(one_rank):
    for case, res in one_rank.items():
        assert res["train"].shape[0] == 4, case
        assert torch.isfinite(res["train"]).all(), case
    lbfgs = one_rank["lbfgs-serial/1x1"]["train"][:, 0]
    assert lbfgs[-1] < lbfgs[0]
