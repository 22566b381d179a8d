"""DistributedDataParallel around a network with LayerParallel: on 1 × 2 and 2 × 2 grids
(in the shared launch of 4 ranks, conftest.py) every gradient equals the whole batch's in
one process, and a DDP whose group spans layer ranks is refused."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import ddp_case  # noqa: E402

pytestmark = pytest.mark.mpi
FOUR_RANKS = "ddp"     # this file's case in the shared 4-rank launch


@pytest.fixture(scope="module")
def results(four_ranks):
    """{grid-group: results}, from the shared 4-rank launch."""
    return four_ranks[FOUR_RANKS]


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
