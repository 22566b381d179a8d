"""Warm starts moved between grids: the block arithmetic (parallel/blocks.py) and the
assembly (train/regrid.py) against blocks cut directly from whole states."""
import itertools

import pytest
import torch

from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.blocks import (C_POINTS, KINDS, block_shape, layout, overlap, pieces,
                                     sources)
from lptrain.parallel.grid import Grid, shard
from lptrain.train.mgrit_oracle import MGRITOracle
from lptrain.train.oneshot import SimultaneousOracle
from lptrain.train.regrid import fits, regrid

N, N_SAMPLES, WIDTH = 16, 13, 2
OPTIONS = MGRITOptions(levels=3, cfactor0=2, cfactor=2)      # 8 C-intervals on level 0
GRIDS = [Grid(1, 1), Grid(2, 1), Grid(1, 2), Grid(2, 2), Grid(4, 1), Grid(1, 3), Grid(3, 2),
         Grid(8, 1)]


def _batches(size):
    """key -> a batch's training-set indices (None: the full batch; else fixed random
    batches of `size`, as train.loop.Batches draws them)."""
    perm = torch.randperm(N_SAMPLES, generator=torch.Generator().manual_seed(3))
    parts = [torch.arange(N_SAMPLES)] if size is None else list(perm.split(size))
    return lambda key: parts[key]


BATCHES = {"full": _batches(None), "mini": _batches(4)}
KEYS = {"full": [0], "mini": [2, 0, 3, 1]}       # least recently used first


def _layout(grid):
    return layout(grid, OPTIONS.hierarchy(N, grid.layer), N_SAMPLES)


def _whole(key, axis=1):
    """A batch's whole forward and adjoint states, samples at `axis` (2: as dense
    states (width, batch) are held): every value names its place."""
    rows = torch.arange(N + 1, dtype=torch.float64)[:, None, None]
    cols = torch.arange(N_SAMPLES, dtype=torch.float64)[None, :, None]
    out = {}
    for i, kind in enumerate(KINDS):
        out[kind] = (1e6 * (i + 1) + 1e4 * key + 100 * rows + cols +
                     0.5 * torch.arange(WIDTH, dtype=torch.float64)).movedim(1, axis)
    return out


def _block(lay, rank, kind, batch, whole, axis=1):
    """The block of world rank `rank` cut from the whole state (the definition)."""
    layer, group = lay.grid.coords(rank)
    lo, hi = lay.rows(kind, layer)
    lo_s, hi_s = lay.shards[group]
    mine = batch[(batch >= lo_s) & (batch < hi_s)]
    return whole[kind][lo:hi].index_select(axis, mine)


def _cache(lay, rank, samples, keys, axis=1):
    """A simultaneous oracle's state: the adjoint states are those of the rank's mean
    loss, so divided by its samples of the batch."""
    entries = []
    for key in keys:
        batch = samples(key)
        fwd, adj = [_block(lay, rank, kind, batch, _whole(key, axis), axis) for kind in KINDS]
        blocks = [fwd, adj / max(adj.shape[axis], 1)]
        if blocks[0].shape[axis] == 0:
            blocks = [None, None]         # a group without samples of this batch
        entries.append([key, *blocks])
    return {"cache": entries, "rung": 0, "last_gnorm": 1.5, "controller": {"plans": [[0, 3, 4]]}}


def test_layout_partitions_rows_and_samples():
    for grid in GRIDS:
        lay = _layout(grid)
        for kind in KINDS:
            ranges = sorted(lay.rows(kind, j) for j in range(grid.layer))
            assert ranges[0][0] == 0 and ranges[-1][1] == N + 1
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        assert lay.shards == tuple(shard(N_SAMPLES, grid.data, g) for g in range(grid.data))
    two = _layout(Grid(2, 1))       # layer rank 0 holds λ_0..λ_8 (mirrored points 8..16)
    assert two.fwd == ((0, 8), (8, 17)) and two.adj == ((8, 17), (0, 8))


def test_overlap():
    assert overlap((0, 5), (3, 9)) == (3, 5)
    assert overlap((0, 3), (3, 9)) is None


@pytest.mark.parametrize("batches", sorted(BATCHES))
def test_pieces_cover_every_new_block_once(batches):
    samples = BATCHES[batches]
    for a, b in itertools.product(GRIDS, GRIDS):
        old, new = _layout(a), _layout(b)
        for rank, kind, key in itertools.product(range(b.size), KINDS, KEYS[batches]):
            batch = samples(key)
            count = torch.zeros(block_shape(new, rank, kind, batch))
            for p in pieces(old, new, rank, kind, batch):
                count[p.rows][:, p.samples] += 1
                assert p.source in sources(old, new, rank)
            assert bool((count == 1).all()), (a, b, rank, kind, key)


def test_full_batch_pieces_are_views():
    old, new = _layout(Grid(1, 2)), _layout(Grid(2, 1))
    found = pieces(old, new, 1, "fwd", BATCHES["full"](0))
    assert [p.source for p in found] == [0, 1]
    assert all(isinstance(p.samples, slice) and isinstance(p.old_samples, slice)
               for p in found)


@pytest.mark.parametrize("axis", [1, 2])
@pytest.mark.parametrize("batches", sorted(BATCHES))
def test_regrid_gives_the_blocks_of_the_new_grid(batches, axis):
    samples, keys = BATCHES[batches], KEYS[batches]
    for a, b in itertools.product(GRIDS, GRIDS):
        old, new = _layout(a), _layout(b)
        saved = {r: _cache(old, r, samples, keys, axis) for r in range(a.size)}
        for rank in range(b.size):
            read = []

            def states():
                for r in sources(old, new, rank):
                    read.append(r)
                    yield r, saved[r]
            got = regrid(old, new, rank, samples, states(), SimultaneousOracle, axis)
            want = _cache(new, rank, samples, keys, axis)
            assert [e[0] for e in got["cache"]] == keys
            for (_, *g), (_, *w) in zip(got["cache"], want["cache"]):
                for x, y in zip(g, w):
                    assert (x is None and y is None) or \
                        torch.allclose(x, y, rtol=1e-15, atol=0), (a, b, rank)
                    assert x is None or x.is_contiguous()
            assert got["controller"] == want["controller"] and got["last_gnorm"] == 1.5
            assert len(read) <= a.size


def test_a_missing_piece_leaves_that_batch_cold():
    samples = BATCHES["full"]
    old, new = _layout(Grid(2, 1)), _layout(Grid(1, 1))
    saved = {r: _cache(old, r, samples, [0]) for r in range(2)}
    saved[1]["cache"][0][2] = None              # rank 1 kept no adjoint states
    got = regrid(old, new, 0, samples, saved.items(), SimultaneousOracle)
    (key, fwd, adj), = got["cache"]
    assert key == 0 and adj is None and torch.equal(fwd, _whole(0)["fwd"])


def test_mgrit_states_keep_their_one_batch():
    samples = BATCHES["mini"]
    old, new = _layout(Grid(1, 2)), _layout(Grid(2, 1))

    def state(lay, r):
        key, fwd, adj = _cache(lay, r, samples, [3])["cache"][0]
        return {"warm_key": key, "warm_fwd": fwd, "warm_adj": adj}
    for rank in range(2):
        got = regrid(old, new, rank, samples, ((r, state(old, r)) for r in range(2)),
                     MGRITOracle)
        want = state(new, rank)
        assert got["warm_key"] == 3
        assert torch.equal(got["warm_fwd"], want["warm_fwd"])
        assert torch.allclose(got["warm_adj"], want["warm_adj"], rtol=1e-15, atol=0)
    empty = {"warm_key": None, "warm_fwd": None, "warm_adj": None}
    assert regrid(old, new, 0, samples, [(0, empty)], MGRITOracle) == empty


def test_blocks_of_another_layout_are_refused_or_do_not_fit():
    samples = BATCHES["full"]
    two_by_one, one_by_two = _layout(Grid(2, 1)), _layout(Grid(1, 2))
    state = _cache(two_by_one, 0, samples, [0])
    assert fits(two_by_one, 0, samples, state, SimultaneousOracle)
    assert not fits(one_by_two, 0, samples, state, SimultaneousOracle)
    assert not fits(two_by_one, 0, samples, state, SimultaneousOracle, axis=2)
    stray = {"cache": [[7, *state["cache"][0][1:]]]}      # a batch this run does not have

    def no_batch(key):
        raise ValueError(f"batch {key}: the run has 4 batches")
    assert not fits(two_by_one, 0, no_batch, stray, SimultaneousOracle)
    with pytest.raises(ValueError, match=r"rank 0's fwd warm start of batch 0 has shape "
                                         r"\(8, 13, 2\), its layout \(17, 7\)"):
        regrid(one_by_two, _layout(Grid(1, 1)), 0, samples, [(0, state)],
               SimultaneousOracle)


def test_a_group_without_samples_ages_its_cache_like_the_others():
    """With 2 warm batches: batches 1, 2, 3 with samples, then 1 again, is cold (evicted)
    in a group that had samples of all three; a group without samples of batch 2 must
    not still hold batch 1 (its blocks would not fit the other groups' on a new grid)."""
    from helpers import batch, dense_net
    from lptrain.mgrit.exchange import SerialExchange
    from lptrain.train.data_parallel import DataParallelOracle
    from lptrain.train.oracles import Batch

    net, theta = dense_net(layers=4)
    x, y = batch(net, n=3)
    groups = []
    for _ in range(2):
        inner = SimultaneousOracle(net, SerialExchange(), MGRITOptions(levels=2, cfactor0=2),
                                   warm_batches=2, mini_batches=True)
        groups.append(DataParallelOracle(inner, SerialExchange()))
    for key, holds in ((1, [True, True]), (2, [True, False]), (3, [True, True])):
        for oracle, has in zip(groups, holds):
            n = 3 if has else 0
            oracle.begin(Batch(x[:n], y[:n], key, 6))
            if has:
                oracle.gradient(oracle.value(theta))
    caches = [oracle.inner.warm.cache for oracle in groups]
    assert list(caches[0]) == list(caches[1]) == [2, 3]
    assert caches[1][2] == (None, None)


@pytest.mark.parametrize("kind", ["dense", "conv"])
def test_a_solvers_states_go_to_other_grids_and_back(kind):
    """Real warm starts (dense states hold samples at axis 1, conv states at 0), saved
    compact (the C-point rows): to every grid and back gives them again; the forward
    blocks of layer rank j are its C-point rows [lo, hi) of the one-rank states."""
    from helpers import batch, conv_net, dense_net
    from lptrain.mgrit.exchange import SerialExchange
    from lptrain.train.oracles import Batch

    net, theta = (dense_net if kind == "dense" else conv_net)(layers=8)
    x, y = batch(net, n=6)
    options = MGRITOptions(levels=2, cfactor0=2)
    oracle = SimultaneousOracle(net, SerialExchange(), options)
    oracle.begin(Batch(x, y, 0))
    oracle.gradient(oracle.value(theta))
    state = oracle.state_dict()
    assert state["warm_rows"] == C_POINTS
    assert torch.equal(state["cache"][0][1], oracle.warm.cache[0][0][0:9:2])
    axis = 1 + net.batch_axis
    samples = (lambda key: torch.arange(6))

    def lay(grid):
        return layout(grid, options.hierarchy(8, grid.layer), 6)
    one = lay(Grid(1, 1))
    for grid in (Grid(2, 1), Grid(1, 2), Grid(4, 1), Grid(2, 3)):
        moved = [regrid(one, lay(grid), r, samples, [(0, state)], oracle, axis)
                 for r in range(grid.size)]
        for r, st in enumerate(moved):
            (_, fwd, _), = st["cache"]
            lo, hi = lay(grid).c_points().rows("fwd", grid.coords(r)[0])
            s_lo, s_hi = lay(grid).shards[grid.coords(r)[1]]
            want = state["cache"][0][1][lo:hi].narrow(axis, s_lo, s_hi - s_lo)
            assert torch.equal(fwd, want), (grid, r)
        back = regrid(lay(grid), one, 0, samples, enumerate(moved), oracle, axis)
        for a, b in zip(state["cache"][0][1:], back["cache"][0][1:]):
            torch.testing.assert_close(b, a, rtol=1e-15, atol=0)


def _compact_cache(lay, rank, samples, keys, axis=1):
    """A mini-batch simultaneous oracle's state: only the C-point rows of its blocks."""
    hier = OPTIONS.hierarchy(N, lay.grid.layer)
    cps = {"fwd": list(hier.levels[0].cpoints), "adj": list(hier.reversed().levels[0].cpoints)}
    layer = lay.grid.coords(rank)[0]
    state = _cache(lay, rank, samples, keys, axis)
    for entry in state["cache"]:
        for i, kind in enumerate(KINDS, start=1):
            lo, hi = lay.rows(kind, layer)
            if entry[i] is not None:
                entry[i] = entry[i][[c - lo for c in cps[kind] if lo <= c < hi]]
    return {**state, "warm_rows": C_POINTS}


@pytest.mark.parametrize("batches", sorted(BATCHES))
def test_compact_blocks_go_to_other_grids_as_compact_blocks(batches):
    """The C-point rows of every block, moved: the C-point rows of the new grid's blocks
    (compact rows counted among the C-points: Layout.c_points)."""
    samples, keys = BATCHES[batches], KEYS[batches]
    for a, b in itertools.product(GRIDS, GRIDS):
        old, new = _layout(a), _layout(b)
        saved = {r: _compact_cache(old, r, samples, keys) for r in range(a.size)}
        for r in range(a.size):          # the layout's compact rows are the blocks' rows
            assert fits(old, r, samples, saved[r], SimultaneousOracle)
        for rank in range(b.size):
            states = ((r, saved[r]) for r in sources(old, new, rank))
            got = regrid(old, new, rank, samples, states, SimultaneousOracle)
            want = _compact_cache(new, rank, samples, keys)
            assert got["warm_rows"] == C_POINTS
            for (_, *g), (_, *w) in zip(got["cache"], want["cache"]):
                for x, y in zip(g, w):
                    assert (x is None and y is None) or \
                        torch.allclose(x, y, rtol=1e-15, atol=0), (a, b, rank)
    assert _layout(Grid(2, 1)).c_points().fwd == ((0, 4), (4, 9))
    mixed = _cache(_layout(Grid(2, 1)), 1, BATCHES["full"], [0])
    first = _compact_cache(_layout(Grid(2, 1)), 0, BATCHES["full"], [0])
    with pytest.raises(ValueError, match="rank 1's warm starts hold all rows, the first "
                                         "rank's c-points"):
        regrid(_layout(Grid(2, 1)), _layout(Grid(1, 1)), 0, BATCHES["full"],
               [(0, first), (1, mixed)], SimultaneousOracle)
