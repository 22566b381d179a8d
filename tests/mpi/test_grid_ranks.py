"""Layer × data grids on 4 ranks (4x1, 2x2, 1x4) against one rank: the shared 4-rank launch
(conftest.py) runs them all."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import grid_case  # noqa: E402
from lptrain.parallel.grid import shard  # noqa: E402

RANKS = 4
pytestmark = pytest.mark.mpi
FOUR_RANKS = "grid"     # this file's case in the shared 4-rank launch


@pytest.fixture(scope="module")
def one_rank():
    return grid_case.run(None)


@pytest.fixture(scope="module")
def on_four(four_ranks):
    """{case/grid: results} on the 4-rank grids, from the shared launch."""
    return four_ranks[FOUR_RANKS]


def _rel(a, b) -> float:
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30)


def test_every_grid_ran(on_four):
    want = {f"{name}/{layer}x{RANKS // layer}" for name, o in grid_case.CASES.items()
            for layer in grid_case.grids(RANKS, o)}
    assert set(on_four) == want
    assert {"lbfgs-simultaneous/4x1", "lbfgs-simultaneous/2x2",
            "lbfgs-simultaneous/1x4"} <= want


@pytest.mark.parametrize("case", sorted(grid_case.CASES))
def test_grids_equal_one_rank(case, one_rank, on_four):
    """Full batch and mini-batches (some groups without samples): 1e-10 of one rank."""
    ref = one_rank[f"{case}/1x1"]
    for key, got in on_four.items():
        if key.split("/")[0] != case:
            continue
        for part in ("train", "val", "theta"):
            assert got[part].shape == ref[part].shape, (key, part)
            assert _rel(got[part], ref[part]) <= 1e-10, (key, part)


@pytest.mark.parametrize("case", ["lbfgs-serial", "lbfgs-mgrit", "lbfgs-simultaneous"])
def test_lbfgs_keeps_its_part_of_the_pairs_and_gathers_the_whole(case, one_rank, on_four):
    """Each rank recurses over its part of θ (rank 0's: the first of 4 contiguous parts);
    a checkpoint's gathered pairs are the one-rank run's."""
    ref = one_rank[f"{case}/1x1"]
    lo, hi = shard(ref["theta"].numel(), RANKS, 0)
    assert set(ref["part"]) == {ref["theta"].numel()} and len(ref["part"]) >= 4
    for key, got in on_four.items():
        if key.split("/")[0] != case:
            continue
        assert got["part"] == [hi - lo] * len(ref["part"]), key
        assert got["pairs"].shape == ref["pairs"].shape, key
        assert _rel(got["pairs"], ref["pairs"]) <= 1e-10, key
        assert got["reloaded"], key      # a resume's parts are the ones saved


@pytest.mark.parametrize("case", ["lbfgs-simultaneous", "sgd-simultaneous"])
def test_the_mgrit_record_is_the_whole_batch_s_on_every_grid(case, one_rank, on_four):
    """metrics.h5's mgrit/ rows were data group 0's: its shard's residuals (NaN and 0
    iterations where it had no samples). Every grid records the one-rank run's."""
    ref = one_rank[f"{case}/1x1"]["mgrit"]
    for key, got in on_four.items():
        if key.split("/")[0] != case:
            continue
        assert len(got["mgrit"]) == len(ref) == 4, key
        for k, (a, b) in enumerate(zip(got["mgrit"], ref)):
            for name in ("fwd_iterations", "adj_iterations", "fwd_total", "adj_total",
                         "fwd_plan"):
                assert a[name] == b[name], (key, k, name)
            for name in ("fwd_history", "adj_history"):
                assert len(a[name]) == len(b[name]) > 0, (key, k, name)
                assert torch.allclose(torch.tensor(a[name]), torch.tensor(b[name]),
                                      rtol=1e-6, atol=0), (key, k, name)
            for name in ("fwd_residual", "adj_residual", "grad_error"):
                assert a[name] == pytest.approx(b[name], rel=1e-6), (key, k, name)


def test_mgrit_on_every_grid_equals_serial(one_rank, on_four):
    serial = one_rank["lbfgs-serial/1x1"]
    for key, got in on_four.items():
        if key.startswith("lbfgs-mgrit/"):
            assert _rel(got["train"], serial["train"]) <= 1e-9, key
            assert _rel(got["theta"], serial["theta"]) <= 1e-9, key


def test_the_runs_trained(one_rank):
    for case, res in one_rank.items():
        assert res["train"].shape[0] == 4, case
        assert torch.isfinite(res["train"]).all(), case
    lbfgs = one_rank["lbfgs-serial/1x1"]["train"][:, 0]
    assert lbfgs[-1] < lbfgs[0]
