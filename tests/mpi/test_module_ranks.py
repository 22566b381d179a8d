"""LayerParallel on 1..4 ranks equals serial autograd: outputs, every gradient, state."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import module_case  # noqa: E402

pytestmark = pytest.mark.mpi
FOUR_RANKS = "module"     # this file's case in the shared 4-rank launch (conftest.py)


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


@pytest.fixture(scope="module")
def many(four_ranks):
    """{ranks: results} on 2, 3 and 4 ranks, from the shared launch."""
    return four_ranks[FOUR_RANKS]


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_many_ranks_equal_serial(ranks, reference, many):
    assert_equal(many[ranks], reference)
