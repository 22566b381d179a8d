"""Halo index arithmetic of LayerParallel: which layers a rank borrows from the others."""
import pytest

from lptrain.mgrit.options import MGRITOptions as Options
from lptrain.parallel.halo import needed_layers, owned_layers, transfers


# -- halo arithmetic ---------------------------------------------------------------------
@pytest.mark.parametrize("average, want", [(False, ([4], [0, 2, 3])),
                                           (True, ([4, 5, 6, 7], [0, 1, 2, 3]))])
def test_layers_a_rank_borrows(average, want):
    # N = 8, levels 0..2 with points 0..8, (0, 2, 4, 6, 8), (0, 4, 8); rank 0 owns
    # points 0..3, rank 1 points 4..8.  Rank 1's forward steps into 4 (layer 3), 4 from
    # 2 and 8 from 4 on level 1, 4 from 0 on level 2; rank 0's adjoint steps into λ_3
    # (layer 4) and the mirrored coarse steps over [4, 6) and [4, 8).
    hier = Options(levels=3, cfactor0=2, cfactor=2).hierarchy(8, 2)
    assert [list(owned_layers(hier, r)) for r in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert (needed_layers(hier, 0, average), needed_layers(hier, 1, average)) == want
    plan = transfers(hier, average)
    assert [(n, src, dst) for n, src, dst in plan if dst == 0] == [(n, 1, 0) for n in want[0]]


def test_one_rank_borrows_nothing():
    hier = Options(levels=4).hierarchy(32, 1)
    assert transfers(hier, True) == [] and list(owned_layers(hier, 0)) == list(range(32))
