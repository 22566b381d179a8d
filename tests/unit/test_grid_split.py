"""Grid arithmetic (parallel.grid) and batch shards (the grid time model: test_speedup_model)."""
import pytest
import torch

from lptrain.errors import ConfigError
from lptrain.mgrit.hierarchy import build_levels
from lptrain.parallel.grid import Grid, c_intervals, candidates, choose, more_intervals, shard
from lptrain.train.loop import Batches


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 30, 32, 33, 100])
@pytest.mark.parametrize("cf0", [2, 3, 4])
@pytest.mark.parametrize("levels", [1, 2, 3])
@pytest.mark.parametrize("min_coarse", [0, 2, 10])
def test_c_intervals_match_the_hierarchy(n, cf0, levels, min_coarse):
    lv = build_levels(n, cf0, 4, levels, min_coarse)
    want = len(lv[0].cpoints) - 1 if len(lv) > 1 else n
    assert c_intervals(n, cf0, levels, min_coarse) == want


def test_coords_put_a_layer_group_on_neighbouring_ranks():
    g = Grid(4, 2)
    assert [g.coords(r) for r in range(8)] == [(0, 0), (1, 0), (2, 0), (3, 0),
                                               (0, 1), (1, 1), (2, 1), (3, 1)]
    assert (g.size, str(g)) == (8, "4x2")


def test_auto_offers_every_divisor_up_to_the_c_intervals():
    assert candidates(12, "auto", None, 4, True) == [Grid(1, 12), Grid(2, 6), Grid(3, 4),
                                                     Grid(4, 3)]
    assert candidates(12, "auto", None, 4, False) == [Grid(1, 12)]
    assert candidates(12, "auto", 3, 4, True) == [Grid(4, 3)]
    assert candidates(4, "2", None, 8, True) == [Grid(2, 2)]
    assert candidates(4, 2, 2, 8, True) == [Grid(2, 2)]


@pytest.mark.parametrize(("size", "layer", "data", "most", "layered", "words"), [
    (4, "3", None, 8, True, "parallel.layer_ranks=3: must divide the job's 4 ranks"),
    (16, "16", None, 8, True, "parallel.layer_ranks=16: only 8 C-intervals"),
    (2, "2", None, 1, True, "only 1 C-interval on the finest level; use at most 1 layer "
                            "rank,"),                      # was '1 C-intervals'
    (6, "4", 3, 8, True, "parallel.layer_ranks=4: times parallel.data_ranks=3"),
    (4, "auto", 3, 8, True, "parallel.data_ranks=3: must divide the job's 4 ranks "
                            "(choose one of 1, 2, 4)"),       # held-out: no choices named
    # one rank: lptrain started without mpiexec, likely (held-out: no hint)
    (1, "2", None, 8, True, "parallel.layer_ranks=2: the job has 1 rank; start it with "
                            "mpiexec -n P for P ranks"),
    (1, "auto", 2, 8, True, "parallel.data_ranks=2: the job has 1 rank; start it with "),
    (4, "2", None, 8, False, "parallel.layer_ranks=2: mode=serial"),
    # the layer ranks data_ranks implies: the key the user gave (held-out: named
    # parallel.layer_ranks, which they never typed)
    (2, "auto", 1, 8, False, "parallel.data_ranks=1 (so 2 layer ranks): mode=serial"),
    (4, "auto", 1, 2, True, "parallel.data_ranks=1 (so 4 layer ranks): only 2 C-intervals"),
    (4, "0", None, 8, True, "parallel.layer_ranks='0'"),
    (4, "many", None, 8, True, "parallel.layer_ranks='many'"),
])
def test_invalid_splits_are_one_line_config_errors(size, layer, data, most, layered, words):
    with pytest.raises(ConfigError) as err:
        candidates(size, layer, data, most, layered)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_one_level_hierarchy_counts_layer_steps_not_c_intervals():
    """network.layers=3 mgrit.levels=1 on 4 layer ranks: 'only 3 C-intervals on the
    finest level', where one level has none (held-out)."""
    with pytest.raises(ConfigError, match=r"^parallel.layer_ranks=4: only 3 layer steps "
                                          r"\(MGRIT has one level\); use at most 3 layer "
                                          r"ranks, or more layers \(network.layers=3\)$"):
        candidates(4, "4", None, 3, True, more_intervals(3, 4, 3), one_level=True)


def test_the_way_to_more_c_intervals_is_one_that_gives_them():
    """2 layer ranks of a 1-layer network: 'more layers or a smaller mgrit.cfactor0
    (2 at least)' where cfactor0 was 2 already and one level has no C-intervals."""
    from lptrain.parallel.grid import more_intervals
    assert more_intervals(1, 2, 1) == "more layers (network.layers=1)"   # one level
    assert more_intervals(8, 2, 4) == "more layers (network.layers=8; mgrit.cfactor0 is " \
                                      "2 already)"
    assert more_intervals(32, 4, 8) == "more layers or a smaller mgrit.cfactor0 (2 at least)"
    with pytest.raises(ConfigError, match=r"use at most 1 layer rank, or more layers "
                                          r"\(network.layers=1\)$"):
        candidates(2, "2", None, 1, True, more_intervals(1, 2, 1))


def test_choose_takes_the_fastest_and_within_the_tie_the_most_layer_ranks():
    grids = [Grid(1, 8), Grid(2, 4), Grid(4, 2), Grid(8, 1)]
    times = {Grid(1, 8): 1.0, Grid(2, 4): 1.04, Grid(4, 2): 1.2, Grid(8, 1): 0.9}
    assert choose(grids, times.get) == Grid(8, 1)
    times[Grid(8, 1)] = 2.0
    assert choose(grids, times.get) == Grid(2, 4)


@pytest.mark.parametrize("n", [0, 1, 3, 4, 10, 11])
@pytest.mark.parametrize("parts", [1, 2, 4, 5])
def test_shards_cover_the_samples_and_empty_ones_come_last(n, parts):
    bounds = [shard(n, parts, i) for i in range(parts)]
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1
    if n < parts:                   # data group 0 (rank 0's) always has samples
        assert sizes == [1] * n + [0] * (parts - n)


@pytest.mark.parametrize("batch_size", [None, 3, 7])
def test_sharded_batches_together_are_the_one_rank_batches(batch_size):
    n, parts = 23, 4
    x = torch.arange(n, dtype=torch.float64).view(n, 1)
    y = torch.arange(n)
    whole = Batches(x, y, batch_size, seed=2)
    shards = []
    for i in range(parts):
        lo, hi = shard(n, parts, i)
        shards.append(Batches(x[lo:hi], y[lo:hi], batch_size, seed=2, n_total=n, offset=lo))
    for _ in range(12):
        ref = whole.next()
        got = [s.next() for s in shards]
        assert all(g.key == ref.key and g.n == ref.y.numel() for g in got)
        assert sorted(torch.cat([g.y for g in got]).tolist()) == sorted(ref.y.tolist())


@pytest.mark.parametrize("batch_size", [None, 3, 7])
def test_local_size_is_the_largest_batch_a_shard_sees(batch_size):
    n, parts = 23, 4
    x, y = torch.zeros(n, 1, dtype=torch.float64), torch.arange(n)
    for i in range(parts):
        lo, hi = shard(n, parts, i)
        b = Batches(x[lo:hi], y[lo:hi], batch_size, seed=2, n_total=n, offset=lo)
        seen = [b.next().y.numel() for _ in range(3 * len(b.parts))]
        assert b.local_size() == max(max(seen), 1)
        assert b.local_size() <= (hi - lo if batch_size is None else batch_size)


class _Rank:
    """The rank and size of a layer group's exchange (all SerialOracle.begin reads)."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size


@pytest.mark.parametrize("n", [1, 5, 7, 8])
@pytest.mark.parametrize("size", [2, 3, 4])
def test_serial_oracle_splits_a_batch_by_the_data_groups_rule(n, size):
    # one rule for which samples a rank holds: the mode=serial oracle on a layer group
    # (calibration, validation) cuts its batch as parallel.grid.shard cuts the data
    from helpers import dense_net
    from lptrain.train.oracles import Batch, SerialOracle
    x = torch.arange(n, dtype=torch.float64).view(n, 1)
    held = []
    for r in range(size):
        oracle = SerialOracle(dense_net(), _Rank(r, size))
        oracle.begin(Batch(x, torch.arange(n)))
        lo, hi = shard(n, size, r)
        assert oracle.x.flatten().tolist() == list(range(lo, hi))
        assert oracle.y.tolist() == list(range(lo, hi))
        held += oracle.y.tolist()
    assert held == list(range(n))
