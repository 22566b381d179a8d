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


class OneRank:
    """The mpi4py calls data_process_group makes, for one process."""

    def Get_size(self):
        return 1

    def Get_rank(self):
        return 0

    def bcast(self, value, root=0):
        return value


class TwoRanks(OneRank):
    def Get_size(self):
        return 2


@pytest.fixture
def one_rank_world():
    import torch.distributed as dist
    yield OneRank()
    if dist.is_initialized():
        dist.destroy_process_group()


def test_torch_distributed_must_agree_with_the_communicator(one_rank_world):
    from lptrain.errors import ConfigError
    from lptrain.parallel.ddp import data_process_group, init_torch_distributed

    with pytest.raises(ConfigError, match="grid 2x1 needs 2 ranks, the communicator has 1"):
        data_process_group(one_rank_world, Grid(2, 1))
    assert data_process_group(one_rank_world, Grid(1, 1)) is not None
    init_torch_distributed(one_rank_world)           # initialised already: agrees
    with pytest.raises(ConfigError, match="rank 0 of 1, this MPI communicator has rank 0 of 2"):
        init_torch_distributed(TwoRanks())
