"""The optimizer's own arithmetic in the speedup model (model_perf/optimizer_cost.py).

The measurement must see the optimizer as a long run does (L-BFGS with its memory full,
no resets, the first trial accepted); the model must charge it once per iteration on
every rank, keep it per host and configuration, and leave it out where costs are given
and where grids are compared.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from lptrain.config.schema import AdamOptions, LBFGSOptions, SGDOptions
from lptrain.mgrit.options import MGRITOptions
from lptrain.model_perf import optimizer_cost as oc
from lptrain.model_perf.costs import KernelCosts, given_costs
from lptrain.model_perf.predict import Counts, Machine, Model
from lptrain.model_perf.simulate import Link
from lptrain.parallel.grid import Grid
from lptrain.train.optimizers import OPTIMIZERS

OPTS = MGRITOptions(levels=3, cfactor0=2, cfactor=2, tol=1e-9, max_iter=30)


def _theta(n: int = 400) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(3), dtype=torch.float64)


def test_lbfgs_against_the_free_oracle_runs_as_in_a_long_run():
    opts = LBFGSOptions(memory=5)
    optimizer, oracle, theta = OPTIMIZERS["lbfgs"](opts), oc.FreeOracle(_theta()), _theta()
    for k in range(oc.warm_iterations(opts) + 10):
        theta, info = optimizer.step(theta, oracle)
        assert (info.ls_trials, info.lbfgs_reset, info.lbfgs_skipped) == (1, 0, 0), k
        assert len(optimizer.mem) == min(k + 1, opts.memory)
    assert float(theta.norm()) > 1e-3 * float(_theta().norm())   # far from converged


@pytest.mark.parametrize("opts", [LBFGSOptions(memory=3), SGDOptions(momentum=0.9),
                                  AdamOptions()], ids=lambda o: o.name)
def test_every_optimizer_is_measured_without_touching_theta(opts):
    theta = _theta()
    cost = oc.seconds_per_iteration(opts, theta, kept=2)
    assert cost.seconds >= 0.0 and cost.per_pair >= 0.0
    assert cost.memory == getattr(opts, "memory", 0)
    assert torch.equal(theta, _theta())


def _costs(batch: int) -> KernelCosts:
    costs = KernelCosts(batch)
    for name in ("apply", "apply_save", "apply_plus", "apply_save_plus", "linearize",
                 "vjp_saved", "vjp_and_g", "vjp_from_g", "act_vjp", "vjp_weights",
                 "opening", "opening_vjp", "classify", "classify_grad", "regulariser",
                 "regulariser_grad", "serial_forward", "serial_adjoint"):
        for m in range(1, 17):
            costs.full[(name, m)] = 1e-3 * m
            costs.one[(name, m)] = 1e-4 * m
    return costs


@pytest.mark.parametrize("mode,grid", [("serial", Grid(1, 2)), ("simultaneous", Grid(2, 1)),
                                       ("mgrit", Grid(1, 1))])
def test_the_optimizer_is_charged_once_an_iteration_on_every_rank(mode, grid):
    from helpers import dense_net
    net, _ = dense_net(layers=8)
    model = Model(net, OPTS, batch=20)
    m = Machine(_costs(20), Link(1e-4, 1e8))
    charged = dataclasses.replace(m, optimizer=0.25)
    counts = Counts(trials=3.0, mgrit_fwd=2, mgrit_adj=2)
    assert model.grid_time(grid, mode, charged, counts) == pytest.approx(
        model.grid_time(grid, mode, m, counts) + 0.25, abs=1e-12)
    busy, busy_charged = (model.busy(mode, grid, x, 2, 2, trials=3.0) for x in (m, charged))
    assert busy_charged == pytest.approx([b + 0.25 for b in busy], abs=1e-12)


def test_grids_are_compared_without_the_optimizer_as_the_automatic_grid_does():
    from helpers import dense_net
    from lptrain.model_perf.grid import recommend
    net, _ = dense_net(layers=64)
    model = Model(net, MGRITOptions(levels=3, cfactor0=4, cfactor=4), batch=16)
    m = Machine(_costs(16), Link(7e-6, 5e9))
    grid, times = recommend(8, "simultaneous", model, m)
    heavy, heavy_times = recommend(8, "simultaneous", model, dataclasses.replace(m, optimizer=5.0))
    assert heavy == grid
    assert all(heavy_times[g] == pytest.approx(times[g] + 5.0) for g in times)


def test_the_cost_is_kept_per_host_and_configuration(tmp_path, monkeypatch):
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path))
    measured = []

    def fake(opts, theta, kept=oc.KEPT, host_ranks=1):
        measured.append(opts.memory)
        return oc.OptimizerCost(0.1 * len(measured), 0.01, opts.memory,
                                0.15 * len(measured) if host_ranks > 1 else None)
    monkeypatch.setattr(oc, "seconds_per_iteration", fake)
    theta = _theta()
    first = oc.OptimizerCost(0.1, 0.01, 4)
    assert oc.measured_optimizer(LBFGSOptions(memory=4), theta, 1) == (first, "measured now")
    assert oc.measured_optimizer(LBFGSOptions(memory=4), theta, 1) == (
        first, "kept, measured earlier")
    assert oc.measured_optimizer(LBFGSOptions(memory=6), theta, 1)[0].seconds == \
        pytest.approx(0.2)
    assert oc.measured_optimizer(LBFGSOptions(memory=4), _theta(500), 1)[0].seconds == \
        pytest.approx(0.3)
    assert oc.measured_optimizer(LBFGSOptions(memory=4), theta, 1, fresh=True) == (
        oc.OptimizerCost(pytest.approx(0.4), 0.01, 4), "measured now")
    # beside another rank: the kept cost has no shared part, so measured again, then kept;
    # a later alone question takes the same file's alone part
    shared = oc.OptimizerCost(pytest.approx(0.5), 0.01, 4, pytest.approx(0.75))
    assert oc.measured_optimizer(LBFGSOptions(memory=4), theta, 1, host_ranks=2) == (
        shared, "measured now")
    assert oc.measured_optimizer(LBFGSOptions(memory=4), theta, 1, host_ranks=2) == (
        shared, "kept, measured earlier")
    assert oc.measured_optimizer(LBFGSOptions(memory=4), theta, 1)[0].seconds == \
        pytest.approx(0.5)
    assert oc.measured_optimizer(LBFGSOptions(memory=4), theta, 1, host_ranks=3)[1] == \
        "measured now"
    assert measured == [4, 6, 4, 4, 4, 4]


def test_a_cost_kept_without_its_per_pair_part_is_measured_again(tmp_path, monkeypatch):
    import json

    from lptrain.model_perf.costs import cache_file
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path))
    opts, theta = LBFGSOptions(memory=4), _theta()
    path = cache_file(oc.optimizer_config(opts, theta, 1), "optimizer_costs")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"seconds": 0.5}))
    monkeypatch.setattr(oc, "seconds_per_iteration",
                        lambda opts, theta, kept=oc.KEPT, host_ranks=1:
                        oc.OptimizerCost(0.2, 0.02, 4))
    assert oc.measured_optimizer(opts, theta, 1) == (oc.OptimizerCost(0.2, 0.02, 4),
                                                     "measured now")


def test_an_iteration_with_fewer_pairs_costs_less_by_their_share():
    m = Machine(None, Link(0.0, 1e30), optimizer=3.0, optimizer_per_pair=0.5, memory=4)
    assert [m.optimizer_at(p) for p in (None, 4, 1, 0)] == [3.0, 3.0, 1.5, 1.0]


def test_on_p_ranks_each_recurses_over_its_part_of_the_pairs():
    """The recursion (0.5 a pair) splits over the ranks; the rest (1.0) does not; each dot
    product is a sum over the ranks and the direction's parts are joined."""
    link = Link(1e-3, 1e6)
    m = Machine(None, link, optimizer=3.0, optimizer_per_pair=0.5, memory=4,
                theta_bytes=8000, split_pairs=True)
    assert m.optimizer_at(None, 1) == m.optimizer_at(None) == 3.0
    sums, join = 10 * link.allreduce(8, 4), link.allreduce(2000, 4)
    assert m.optimizer_at(None, 4) == pytest.approx(1.0 + 2.0 / 4 + sums + join)
    assert m.optimizer_at(2, 4) == pytest.approx(1.0 + 1.0 / 4 + 6 * link.allreduce(8, 4)
                                                 + join)
    adam = Machine(None, link, optimizer=3.0)       # no memory: every rank takes it whole
    assert adam.optimizer_at(None, 4) == 3.0
    small = dataclasses.replace(m, split_pairs=False)   # θ below shards.LEAST: whole
    assert small.optimizer_at(None, 4) == 3.0


def test_lbfgs_s_measured_pairs_cost_what_its_recursion_costs():
    """On a parameter vector large enough to time (400,000 float64): a pair's share is
    positive and at most the whole iteration's over the memory."""
    cost = oc.seconds_per_iteration(LBFGSOptions(memory=6), _theta(400_000), kept=3)
    assert cost.memory == 6 and 0.0 < cost.per_pair <= cost.seconds / 6
    optimizer = OPTIMIZERS["lbfgs"](LBFGSOptions(memory=6))
    assert oc.per_pair(optimizer, _theta()) == 0.0          # no pairs yet


def test_given_costs_leave_the_optimizer_uncharged():
    from types import SimpleNamespace

    from lptrain.model_perf import cli
    opts = SimpleNamespace(optimizer=LBFGSOptions())
    m = Machine(given_costs(10, 1e-3, 1e-3, 1e-3), Link(0.0, 1e30))
    got, note = cli.with_optimizer(SimpleNamespace(fresh=False), opts, m, _theta())
    assert got.optimizer == 0.0 and note == "optimizer lbfgs: not charged (given costs)"


def test_the_pairs_of_each_iteration_are_replayed_from_its_metrics_rows():
    from lptrain.model_perf.runs import lbfgs_pairs
    opts = LBFGSOptions(memory=3)
    optimizer, oracle, theta = OPTIMIZERS["lbfgs"](opts), oc.FreeOracle(_theta()), _theta()
    held, rows = [], {"iteration": [], "lbfgs_reset": [], "lbfgs_skipped": [],
                      "step_size": []}
    for k in range(6):
        held.append(len(optimizer.mem))
        theta, info = optimizer.step(theta, oracle)
        for key, value in zip(rows, (k + 1, info.lbfgs_reset, info.lbfgs_skipped,
                                     info.step_size)):
            rows[key].append(value)
    assert list(lbfgs_pairs(rows, 3)) == held == [0, 1, 2, 3, 3, 3]
    # a skipped pair, a reset (a failed search: the new pair alone), a step of 0
    rows = {"iteration": list(range(1, 9)), "lbfgs_skipped": [0, 1, 0, 0, 0, 0, 0, 0],
            "lbfgs_reset": [0, 0, 0, 1, 0, 1, 0, 0],
            "step_size": [1, 1, 1, 1, 1, 0, 1, 1]}
    assert list(lbfgs_pairs(rows, 3)) == [0, 1, 1, 2, 1, 2, 0, 1]


def test_a_measured_run_s_early_iterations_pay_for_the_pairs_they_had(tmp_path):
    from helpers import dense_net
    from lptrain.metrics import schema as ms
    from lptrain.metrics.writer import open_writer
    from lptrain.model_perf.runs import load_run, predict_run
    net, _ = dense_net(layers=8)
    model = Model(net, OPTS, batch=20)
    m = Machine(_costs(20), Link(1e-4, 1e8), optimizer=1.0, optimizer_per_pair=0.1,
                memory=8)
    path = tmp_path / ms.FILE_NAME
    attrs = {ms.MODE: "serial", ms.WORLD_SIZE: 1, ms.SEED: 0,
             ms.CONFIG: "optimizer:\n  name: lbfgs\n  memory: 8\n"}
    with open_writer(path, attrs, enabled=True) as writer:
        for k in range(1, 8):      # iterations 2..7 held 1..6 pairs: median 3.5
            writer.log_train(iteration=k, step_time=1.0, ls_trials=1, lbfgs_reset=0,
                             lbfgs_skipped=0, step_size=1.0)
    run = load_run(path)
    assert [w.pairs for w in run.work] == [1, 2, 3, 4, 5, 6]
    pred, _ = predict_run(run, model, m)
    full = model.grid_time(Grid(1, 1), "serial", m)
    assert pred == pytest.approx(full - 0.1 * (8 - 3.5), rel=1e-12)
