"""Compact warm starts (only the C-point rows of a rank's block) give the iterates of
full ones: a warm solve reads nothing else (mgrit/solver.py, train/oneshot.py)."""
import pytest
import torch

from helpers import batch, conv_net, dense_net
from lptrain.errors import SolverError
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.blocks import ALL_ROWS, C_POINTS
from lptrain.parallel.layer_parallel import LayerParallel
from lptrain.train.mgrit_oracle import MGRITOracle
from lptrain.train.oneshot import SimultaneousOracle
from lptrain.train.oracles import Batch
from lptrain.train.warm import WarmCache

NETS = {"dense": dense_net, "conv": conv_net}
OPTIONS = MGRITOptions(levels=3, cfactor0=4, cfactor=2)      # N = 16: C-points 0, 4, .., 16


def _with_stale_f_rows(states, rows):
    """`states` with every F row replaced by values no solve may use."""
    out = torch.full_like(states, 1e3)
    out[list(rows)] = states[list(rows)]
    return out


@pytest.mark.parametrize("kind", sorted(NETS))
def test_a_compact_warm_start_gives_the_full_ones_iterates(kind):
    net, theta = NETS[kind](layers=16)
    x, y = batch(net, n=5)
    lp = LayerParallel(net, OPTIONS, SerialExchange())
    assert lp.fwd.c_rows == (0, 4, 8, 12, 16) and lp.adj.c_rows == (0, 4, 8, 12, 16)
    fwd = lp.forward(theta, x, max_iter=2, tol=0.0)          # cold: the θ before a step
    ev = lp.evaluate(theta, fwd.states, y, 5, True)
    _, adj = lp.backward(theta, x, fwd.states, ev, max_iter=2, tol=0.0)
    full = {"fwd": fwd.states.clone(), "adj": adj.states.clone()}
    compact = {"fwd": lp.fwd.c_point_states(full["fwd"]),
               "adj": lp.adj.c_point_states(full["adj"])}
    assert compact["fwd"].shape == (5, *full["fwd"].shape[1:])
    assert compact["fwd"].is_contiguous()
    assert torch.equal(compact["adj"], full["adj"][0:17:4])
    step = theta + 0.01 * torch.randn(theta.shape, generator=torch.Generator().manual_seed(4),
                                      dtype=theta.dtype)

    def warm_solves(fwd_warm, adj_warm):
        f = lp.forward(step, x, warm=fwd_warm, max_iter=2, tol=0.0)
        e = lp.evaluate(step, f.states, y, 5, True)
        grad, a = lp.backward(step, x, f.states, e, warm=adj_warm, max_iter=2, tol=0.0)
        return f.states.clone(), f.history, a.states.clone(), a.history, grad

    want = warm_solves(full["fwd"].clone(), full["adj"].clone())
    stale = warm_solves(_with_stale_f_rows(full["fwd"], lp.fwd.c_rows),
                        _with_stale_f_rows(full["adj"], lp.adj.c_rows))
    got = warm_solves(compact["fwd"], compact["adj"])
    for result in (stale, got):
        for a, b in zip(result, want):
            assert a == b if isinstance(a, list) else torch.equal(a, b)
    assert want[1][0] < 1e3 and not torch.equal(want[0], full["fwd"])   # a real solve
    # a warm start is read, never written, but for u_0 (point 0, a C-point) at the new θ
    assert torch.equal(compact["fwd"][1:], full["fwd"][4:17:4])


def test_a_warm_start_of_another_size_is_refused():
    net, theta = dense_net(layers=16)
    x, _ = batch(net, n=3)
    lp = LayerParallel(net, OPTIONS, SerialExchange())
    res = lp.forward(theta, x, max_iter=1, tol=0.0)
    with pytest.raises(SolverError, match=r"warm start with 16 rows: this rank's block has "
                                          r"17 rows, 5 of them C-points"):
        lp.forward(theta, x, warm=res.states[:16].clone(), max_iter=1, tol=0.0)


def _oracle(net, warm_batches=4):
    options = MGRITOptions(levels=3, cfactor0=4, cfactor=2, fwd_iters=1, adj_iters=1)
    return SimultaneousOracle(net, SerialExchange(), options, warm_batches, mini_batches=True)


class FullCache(WarmCache):
    """Warm starts kept as copies of all rows."""

    def store(self, key, fwd=None, adj=None):
        super().store(key, None if fwd is None else fwd.clone(),
                      None if adj is None else adj.clone())


class FullCopies(SimultaneousOracle):
    """The reference: mini-batch warm starts kept as copies of all rows."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.warm = FullCache(self.warm.capacity)


@pytest.mark.parametrize("kind", sorted(NETS))
def test_one_shot_mini_batch_training_is_unchanged_by_compact_warm_starts(kind):
    """Three epochs of gradient steps over 3 batches: every batch warm from its epoch-old
    states; the objectives and gradients equal those of full copies bitwise."""
    net, theta0 = NETS[kind](layers=16)
    x, y = batch(net, n=12)
    runs = []
    for cls in (SimultaneousOracle, FullCopies):
        oracle = cls(net, SerialExchange(), _oracle(net).mgrit, 4, mini_batches=True)
        theta, trace = theta0.clone(), []
        for _ in range(3):
            for key in range(3):
                part = slice(4 * key, 4 * key + 4)
                oracle.begin(Batch(x[part], y[part], key, 12))
                ev = oracle.value(theta)
                trace.append(ev.point.objective)
                grad = oracle.gradient(ev)
                oracle.accept(ev)
                theta = theta - 0.5 * grad
        runs.append((trace, theta, oracle))
    (got, theta_got, compact), (want, theta_want, full) = runs
    assert got == want and torch.equal(theta_got, theta_want)
    assert len(set(want)) == len(want)        # the parameters moved every step
    for (f, a), (ff, fa) in zip(compact.warm.cache.values(), full.warm.cache.values()):
        assert f.shape[0] == 5 and ff.shape[0] == 17
        assert torch.equal(f, ff[0:17:4]) and torch.equal(a, fa[0:17:4])


def test_a_checkpoint_of_full_blocks_loads_compact():
    """A state written before warm starts were compact (all rows, no `warm_rows`) is cut
    to its C-points on load; the state written next says so."""
    net, theta = dense_net(layers=16)
    x, y = batch(net, n=4)
    old = FullCopies(net, SerialExchange(), _oracle(net).mgrit, 4, mini_batches=True)
    old.begin(Batch(x, y, 0, 4))
    old.gradient(old.value(theta))
    state = old.state_dict()
    del state["warm_rows"]
    assert SimultaneousOracle.warm_rows(state) == ALL_ROWS
    new = _oracle(net)
    new.load_state_dict(state)
    (fwd, adj), = new.warm.cache.values()
    old_fwd, old_adj = old.warm.cache[0]
    assert torch.equal(fwd, old_fwd[0:17:4]) and torch.equal(adj, old_adj[0:17:4])
    assert new.state_dict()["warm_rows"] == C_POINTS
    full_batch = SimultaneousOracle(net, SerialExchange(), _oracle(net).mgrit)
    assert full_batch.state_dict()["warm_rows"] == C_POINTS


@pytest.mark.parametrize("cls", [MGRITOracle, SimultaneousOracle])
def test_a_full_batch_checkpoint_is_compact_and_continues_the_run(cls):
    """A full-batch oracle keeps the solvers' buffers (all rows) and saves only their
    C-point rows, 1 / cfactor0 of them; one loaded from that state evaluates the next θ
    as the saving one does, bitwise (a cold start would not)."""
    net, theta = dense_net(layers=16)
    x, y = batch(net, n=5)
    saving = cls(net, SerialExchange(), OPTIONS)
    saving.begin(Batch(x, y, 0))
    saving.accept(ev := saving.value(theta))
    saving.gradient(ev)
    state = saving.state_dict()
    assert cls.warm_rows(state) == C_POINTS
    (key, fwd, adj), = cls.warm_entries(state)
    kept = saving.warm.get(0)
    assert key == 0 and kept[0].shape[0] == 17 and fwd.shape[0] == 5
    assert torch.equal(fwd, kept[0][0:17:4]) and torch.equal(adj, kept[1][0:17:4])
    loaded = cls(net, SerialExchange(), OPTIONS)
    loaded.load_state_dict(state)
    step = theta + 0.05 * torch.randn(theta.shape, dtype=theta.dtype,
                                      generator=torch.Generator().manual_seed(8))
    results = []
    for oracle in (saving, loaded, cls(net, SerialExchange(), OPTIONS)):   # the last cold
        oracle.begin(Batch(x, y, 0))
        ev = oracle.value(step)
        grad = oracle.gradient(ev)
        oracle.accept(ev)
        results.append((ev.point.objective, grad.tolist(),
                        oracle.stats.fwd_history + oracle.stats.adj_history))
    assert results[0] == results[1] and results[2][2] != results[0][2]


def test_the_least_recently_stored_batch_is_dropped():
    """Capacity 2: batches 1, 2, then 1 again (its forward states only: the adjoint's are
    kept), then 3 drops batch 2, the one stored longest ago."""
    cache = WarmCache(2)
    cache.store(1, "f1", "a1")
    cache.store(2, "f2", "a2")
    cache.store(1, "f1'")
    cache.store(3, "f3", "a3")
    assert not cache.holds(2) and cache.holds(1) and cache.holds(3)
    assert cache.get(1) == ("f1'", "a1") and list(cache.cache) == [1, 3]


class FreshBlocks(WarmCache):
    """The plain version: every compact copy in a new block."""

    def _block(self, kept):
        return None


@pytest.mark.parametrize("capacity", [4, 2])
def test_kept_blocks_are_rewritten_not_replaced(capacity):
    """A batch's compact warm starts are written into the blocks it held, or (capacity 2
    of 3 batches: one dropped at every store) into a dropped batch's: the iterates of
    new blocks at every store, bitwise, with no new block after the first epoch (new
    ones had fragmented the heap: RSS 0.6 GB past the kept states on MNIST)."""
    net, theta0 = dense_net(layers=16)
    x, y = batch(net, n=12)
    runs = []
    for cache in (WarmCache, FreshBlocks):
        oracle = _oracle(net, capacity)
        oracle.warm = cache(capacity, oracle.lp, keep_compact=True)
        theta, trace, blocks = theta0.clone(), [], []
        for epoch in range(3):
            for key in range(3):
                part = slice(4 * key, 4 * key + 4)
                oracle.begin(Batch(x[part], y[part], key, 12))
                ev = oracle.value(theta)
                grad = oracle.gradient(ev)
                oracle.accept(ev)
                trace.append((ev.point.objective, oracle.stats.fwd_history,
                              oracle.stats.adj_history))
                theta = theta - 0.5 * grad
                blocks.append({t.data_ptr() for kept in oracle.warm.cache.values()
                               for t in kept})
        runs.append((trace, theta, blocks))
    (got, theta_got, reused), (want, theta_want, fresh) = runs
    assert got == want and torch.equal(theta_got, theta_want)
    first = set().union(*reused[:3])
    assert set().union(*reused[3:]) <= first          # no block made after the first epoch
    assert not set().union(*fresh[3:]) <= set().union(*fresh[:3])    # the plain version's are


def test_a_block_of_another_form_is_not_written():
    """A kept block whose form differs (another batch size) is left alone: a new one."""
    net, theta = dense_net(layers=16)
    x, _ = batch(net, n=5)
    lp = LayerParallel(net, OPTIONS, SerialExchange())
    states = lp.forward(theta, x, max_iter=1, tol=0.0).states
    other = torch.zeros((5, states.shape[1] + 1, *states.shape[2:]), dtype=states.dtype)
    got = lp.fwd.c_point_states(states, other)
    assert got.data_ptr() != other.data_ptr() and not other.any()
    assert torch.equal(got, states[0:17:4])
    same = torch.empty_like(got)
    assert lp.fwd.c_point_states(states, same).data_ptr() == same.data_ptr()
    assert torch.equal(same, got)
