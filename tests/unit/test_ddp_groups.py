"""Data groups for DistributedDataParallel: the world ranks holding the same layers."""
import pytest
import torch
from torch import nn

from lptrain.parallel.ddp import check_ddp_group, data_group_ranks
from lptrain.parallel.grid import Grid


@pytest.mark.parametrize("layer, data", [(1, 1), (1, 4), (2, 2), (3, 2), (4, 1)])
def test_each_data_group_holds_one_layer_rank_of_every_layer_group(layer, data):
    grid = Grid(layer, data)
    groups = data_group_ranks(grid)
    assert sorted(r for g in groups for r in g) == list(range(grid.size))
    for layer_rank, ranks in enumerate(groups):
        assert [grid.coords(r) for r in ranks] == [(layer_rank, d) for d in range(data)]


def test_data_groups_of_a_two_by_three_grid():
    assert data_group_ranks(Grid(2, 3)) == [[0, 2, 4], [1, 3, 5]]


def test_without_ddp_the_check_does_nothing():
    checked = set()
    check_ddp_group(nn.Linear(2, 2), range(0, 4), checked)
    assert checked == set() and not torch.distributed.is_initialized()
