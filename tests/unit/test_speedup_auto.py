"""The speedup model as parallel.layer_ranks=auto's timer: the layer x data grid it
recommends from given costs, when the lptrain command installs it and asks it, and what
the run's plan says of the choice (test_speedup_model.py: the model itself).
"""
from __future__ import annotations

import pytest

import lptrain.train.oracles  # noqa: F401  (at collection: h5py's first import runs uname)
from helpers import fake_costs
from lptrain.mgrit.options import MGRITOptions
from lptrain.model_perf import costs as kc
from lptrain.model_perf.predict import Machine, Model
from lptrain.model_perf.simulate import FREE_LINK, Link, ScheduleError
from lptrain.parallel.grid import Grid

OPTS = MGRITOptions(levels=3, cfactor0=2, cfactor=2, tol=1e-9, max_iter=30)


# -- the automatic grid ------------------------------------------------------------------------
def _proportional(batch: int, per_call: float) -> kc.KernelCosts:
    """Costs whose per-call part is `per_call` of the full-batch time t (t·b/B for 0),
    without the records' glue."""
    costs = fake_costs(batch)
    costs.glue = False
    for key, t in costs.full.items():
        costs.one[key] = per_call * t + (1 - per_call) * t / batch
    return costs


def test_one_layer_rank_grid_is_the_data_parallel_time_of_a_one_rank_solve():
    from helpers import dense_net
    from lptrain.model_perf.grid import recommend
    net, _ = dense_net(layers=16)
    model = Model(net, OPTS, batch=64)
    m = Machine(_proportional(64, 0.0), FREE_LINK)
    t1 = model.grid_time(Grid(1, 1), "simultaneous", m)
    assert model.grid_time(Grid(1, 4), "simultaneous", m) == pytest.approx(t1 / 4, rel=1e-12)
    grid, times = recommend(4, "simultaneous", model, m)
    assert grid == Grid(1, 4) and set(times) == {Grid(1, 4), Grid(2, 2), Grid(4, 1)}


def test_per_call_costs_make_layer_ranks_pay_off_for_small_shards():
    from helpers import dense_net
    from lptrain.model_perf.grid import recommend
    net, _ = dense_net(layers=64)
    opts = MGRITOptions(levels=3, cfactor0=4, cfactor=4)
    link = Link(7e-6, 5e9)
    model = Model(net, opts, batch=16)
    g, times = recommend(16, "simultaneous", model, Machine(_proportional(16, 0.9), link))
    assert g.layer > 1 and times[g] < times[Grid(1, 16)]
    model = Model(net, opts, batch=100_000)
    g, times = recommend(16, "simultaneous", model, Machine(_proportional(100_000, 0.0), link))
    assert g == Grid(1, 16)


class _Timer:
    def __init__(self, times):
        self.times_, self.asked = times, []

    def times(self, grids):
        self.asked.append(list(grids))
        return {g: self.times_[g] for g in grids}


def test_auto_grid_asks_its_timer_only_when_there_is_a_choice():
    from lptrain.errors import LptrainError, RunFileError
    from lptrain.parallel.auto import DataParallelFirst, agreed_grid, auto_grid
    timer = _Timer({Grid(1, 4): 1.0, Grid(2, 2): 1.04, Grid(4, 1): 2.0})
    assert auto_grid([Grid(2, 2)], timer) == Grid(2, 2) and timer.asked == []
    # within 5 % of the fastest, the most layer ranks win
    assert auto_grid([Grid(1, 4), Grid(2, 2), Grid(4, 1)], timer) == Grid(2, 2)

    def broken():
        raise ScheduleError("no costs")
    assert agreed_grid([Grid(4, 1)], broken, None) == Grid(4, 1)
    with pytest.raises(LptrainError, match="^parallel.layer_ranks=auto: no costs$") as err:
        agreed_grid([Grid(1, 4), Grid(4, 1)], broken, None)
    assert err.value.exit_code == ScheduleError.exit_code     # its own, not exit 2

    def unreadable():
        raise RunFileError("costs.json: not JSON")
    with pytest.raises(LptrainError, match="^parallel.layer_ranks=auto: costs.json") as err:
        agreed_grid([Grid(1, 4), Grid(4, 1)], unreadable, None)
    assert err.value.exit_code == RunFileError.exit_code == 1
    # no timer installed (lptrain as a library): the data-parallel split
    assert auto_grid([Grid(1, 4), Grid(2, 2), Grid(4, 1)], DataParallelFirst()) == Grid(1, 4)


class _Ranks:
    """Rank `rank` of 2 whose bcast hands on rank 0's object (`zero` on rank 1)."""

    def __init__(self, rank, zero=None):
        self.rank, self.zero, self.sent = rank, zero, []

    def Get_size(self):
        return 2

    def Get_rank(self):
        return self.rank

    def bcast(self, obj, root=0):
        self.sent.append(obj)
        return obj if self.rank == 0 else self.zero


def test_a_steps_failure_while_auto_times_is_the_runs_error_not_autos():
    """A user's step that failed in the timed kernels was said as a configuration error
    of auto (`parallel.layer_ranks=auto: cannot handle batch 5000`, exit 2, no type, no
    traceback log); it is raised as it is, on rank 0, and the others stop with it."""
    from lptrain.errors import LptrainError
    from lptrain.parallel import auto
    grids = [Grid(1, 2), Grid(2, 1)]
    own = RuntimeError("cannot handle batch 5000")

    def failing():
        raise own
    with pytest.raises(RuntimeError, match="^cannot handle batch 5000$"):
        auto.agreed_grid(grids, failing, None)
    agreed_grid, RankZeroFailed, zero = auto.agreed_grid, auto.RankZeroFailed, _Ranks(0)
    with pytest.raises(RuntimeError) as err:
        agreed_grid(grids, failing, zero)
    assert err.value is own and zero.sent == [(None, None, True)]
    with pytest.raises(RankZeroFailed, match="^rank 0 failed while parallel.layer_ranks"):
        agreed_grid(grids, failing, _Ranks(1, zero.sent[0]))
    refused = ("parallel.layer_ranks=auto: no costs", 2)
    with pytest.raises(LptrainError, match="^parallel.layer_ranks=auto: no costs$") as err:
        agreed_grid(grids, failing, _Ranks(1, (None, refused, False)))
    assert err.value.exit_code == 2
    assert agreed_grid(grids, failing, _Ranks(1, (Grid(2, 1), None, False))) == Grid(2, 1)


def test_the_lptrain_command_installs_the_model_for_auto(monkeypatch):
    from lptrain import job_run
    from lptrain.model_perf.grid import MeasuredTimer
    from lptrain.parallel import auto
    from lptrain.parallel.auto import DataParallelFirst
    monkeypatch.setattr(auto, "_factory", None)
    assert isinstance(auto.timer_for(None, None, "mgrit"), DataParallelFirst)
    timer = job_run.model_timer("opts", "net", "mgrit")
    assert isinstance(timer, MeasuredTimer) and (timer.opts, timer.mode) == ("opts", "mgrit")


class _Comm:
    """Rank 0 of 4 on one node (all preflight.plan asks of a communicator)."""

    def Get_size(self):
        return 4

    def Get_rank(self):
        return 0

    def allreduce(self, value, op=None):
        return value

    def bcast(self, value, root=0):
        return value

    def allgather(self, value):           # every rank as this one (the step's trial)
        return [value] * self.Get_size()


def test_an_explicit_grid_starts_without_the_speedup_model(monkeypatch):
    from lptrain import preflight
    from lptrain.config import compose
    from lptrain.parallel.context import Node
    monkeypatch.setattr(preflight, "node_of", lambda comm: Node(0, 4, 4))

    from lptrain.parallel import auto

    def no_model(*args, **kw):
        raise AssertionError("the speedup model was consulted")
    monkeypatch.setattr(auto, "_factory", no_model)
    for overrides in (["mode=simultaneous", "parallel.layer_ranks=2"],
                      ["mode=mgrit", "parallel.data_ranks=4"], ["mode=serial"]):
        opts, _ = compose(overrides)
        assert preflight.plan(opts, _Comm()).grid.size == 4
    opts, _ = compose(["mode=simultaneous"])                  # auto: a choice of three
    with pytest.raises(AssertionError, match="^the speedup model was consulted$"):
        preflight.plan(opts, _Comm())


def test_the_plan_says_how_auto_chose_the_grid(monkeypatch):
    """The run's title and notes did not say that the split was chosen, nor from what:
    two launches could differ without a word (an unwritable cache, below)."""
    from lptrain import preflight
    from lptrain.config import compose
    from lptrain.parallel import auto
    from lptrain.parallel.context import Node
    monkeypatch.setattr(preflight, "node_of", lambda comm: Node(0, 4, 4))
    timer = _Timer({Grid(1, 4): 1.0, Grid(2, 2): 0.5, Grid(4, 1): 0.7})
    timer.note = "times kept on this host"
    monkeypatch.setattr(auto, "_factory", lambda *a: timer)
    plan = preflight.plan(compose(["mode=simultaneous"])[0], _Comm())
    assert plan.grid == Grid(2, 2) and plan.auto
    assert plan.notes == ["auto split 2 x 2: predicted 0.5 s/it; next best 4 x 1: 0.7 s/it",
                          "  times kept on this host"]
    plan = preflight.plan(compose(["mode=simultaneous", "parallel.layer_ranks=4"])[0],
                          _Comm())
    assert (plan.grid, plan.auto, plan.notes) == (Grid(4, 1), False, [])


def test_a_split_chosen_within_the_tie_says_it_is_not_the_fastest():
    """The note called the faster split 'next best' when the tie rule chose the other."""
    from lptrain.parallel.auto import Recorded, auto_grid
    timer = Recorded(_Timer({Grid(1, 2): 0.030, Grid(2, 1): 0.031}))
    chosen = auto_grid([Grid(1, 2), Grid(2, 1)], timer)
    assert chosen == Grid(2, 1)
    assert timer.notes(chosen) == ["auto split 2 x 1: predicted 0.031 s/it",
                                   "  (1 x 2: 0.03 s/it; within 5% of the fastest, the most "
                                   "layer ranks win)"]


def test_a_cache_that_cannot_be_written_is_said(tmp_path, monkeypatch):
    from lptrain.config import compose
    from lptrain.model.network import ResNet
    from lptrain.data.base import dataset_sizes
    from lptrain.model_perf.grid import MeasuredTimer
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path / "file" / "cache"))
    monkeypatch.setattr("lptrain.model_perf.measure.measure_kernels",
                        lambda net, theta, batch, kernels, device, neighbours=0, progress=None: (
                            {(n, m, b): 1e-4 * m * b for n, m in kernels for b in (1, batch)},
                            {}))
    opts, _ = compose(["mode=simultaneous", "network.layers=8", "dataset.n_train=100"])
    sizes = dataset_sizes(opts.dataset)
    timer = MeasuredTimer(opts, ResNet(opts.network, sizes.feature_shape, sizes.n_classes),
                          "simultaneous")
    timer.times([Grid(1, 2), Grid(2, 1)])
    assert timer.note.startswith(f"this host's kernels timed now; not kept ("
                                 f"{tmp_path / 'file' / 'cache'} cannot be written: ")
    assert timer.note.endswith("each start predicts them again and may choose another "
                               "split")
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path / "cache"))
    timer.times([Grid(1, 2), Grid(2, 1)])
    assert timer.note == "this host's kernels timed now; kept for the next start"
    # another configuration of the same network: its kernels were timed (held-out: the
    # console said they were timed again)
    from dataclasses import replace
    other = MeasuredTimer(replace(opts, mgrit=replace(opts.mgrit, fwd_iters=3)),
                          timer.net, "simultaneous")
    other.times([Grid(1, 2), Grid(2, 1)])
    assert other.note == ("predicted now from this host's kernel costs, kept earlier; "
                          "kept for the next start")
    timer.times([Grid(1, 2), Grid(2, 1)])
    assert timer.note == "times kept on this host"
    # the cycles the times assume: mgrit's were nowhere (2-3x the measured time)
    # (held-out: the error-controlled run took 3 + 3 where the line said 2 + 2 flatly)
    assert timer.assumed == ("2 + 2 cycles a solve assumed (mgrit.fwd_iters + adj_iters; "
                             "the error control varies them)")
    timer.opts = replace(opts, mgrit=replace(opts.mgrit, control="fixed"))
    assert timer.assumed == "2 + 2 cycles a solve (mgrit.fwd_iters + adj_iters)"
    timer.mode = "mgrit"
    assert timer.assumed == "5 + 5 cycles a solve assumed (to tolerance)"
    # one level: a solve is a serial sweep (held-out: 3 layers said 5 + 5 assumed)
    timer.opts = replace(opts, mgrit=replace(opts.mgrit, levels=1))
    assert timer.assumed == "one MGRIT level: each solve is one serial sweep"


def test_kept_glue_is_taken_only_by_a_record_of_the_same_ops(tmp_path, monkeypatch):
    from helpers import dense_net
    from lptrain.model_perf.kept_glue import KeptGlue
    from lptrain.model_perf.record import Glue, glue_of
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path))
    net, _ = dense_net(layers=12)
    model = Model(net, OPTS, batch=8, glue=KeptGlue({"net": 12}))
    first = model.record("mgrit", 2, 1, 2, 2)
    assert any(isinstance(op, Glue) for op in first.value[0])
    assert model.glue.note == "glue timed now" and model.glue.save() is None
    kept = KeptGlue({"net": 12})
    again = Model(net, OPTS, batch=8, glue=kept).record("mgrit", 2, 1, 2, 2)
    assert (kept.reused, kept.timed, kept.note) == (1, 0, "glue kept")
    assert again == first and glue_of(again) == glue_of(first)
    # the code now does something else for the same key: its glue is timed anew
    kept.records["mgrit/2/1/2/2"]["ops"] = "another"
    Model(net, OPTS, batch=8, glue=kept).record("mgrit", 2, 1, 2, 2)
    assert (kept.reused, kept.timed, kept.note) == (1, 1, "glue partly kept")


def test_a_cache_entry_that_cannot_be_written_is_named(tmp_path, monkeypatch):
    """A folder where a cache file goes was said as the cache's root being unwritable."""
    from lptrain.model_perf.costs import keep_json
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path))
    entry = tmp_path / "grid_times" / "host.json"
    entry.mkdir(parents=True)
    assert keep_json(entry, {"a": 1}) == f"{entry} cannot be written: Is a directory"
    assert sorted(p.name for p in entry.parent.iterdir()) == ["host.json"]   # no part left
    assert keep_json(tmp_path / "grid_times" / "other.json", {"a": 1}) is None
