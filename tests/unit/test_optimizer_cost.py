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
    seconds = oc.seconds_per_iteration(opts, theta, kept=2)
    assert seconds >= 0.0
    assert torch.equal(theta, _theta())


def _costs(batch: int) -> KernelCosts:
    costs = KernelCosts(batch)
    for name in ("apply", "apply_save", "apply_plus", "apply_save_plus", "linearize",
                 "vjp_saved", "vjp_and_g", "vjp_from_g", "act_vjp", "vjp_weights",
                 "opening", "opening_vjp", "classify", "classify_grad", "regulariser",
                 "regulariser_grad"):
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

    def fake(opts, theta, kept=oc.KEPT):
        measured.append(opts.memory)
        return 0.1 * len(measured)
    monkeypatch.setattr(oc, "seconds_per_iteration", fake)
    theta = _theta()
    assert oc.measured_optimizer(LBFGSOptions(memory=4), theta, 1) == (0.1, "measured now")
    assert oc.measured_optimizer(LBFGSOptions(memory=4), theta, 1) == (
        0.1, "kept, measured earlier")
    assert oc.measured_optimizer(LBFGSOptions(memory=6), theta, 1)[0] == pytest.approx(0.2)
    assert oc.measured_optimizer(LBFGSOptions(memory=4), _theta(500), 1)[0] == \
        pytest.approx(0.3)
    assert oc.measured_optimizer(LBFGSOptions(memory=4), theta, 1, fresh=True) == (
        pytest.approx(0.4), "measured now")
    assert measured == [4, 6, 4, 4]


def test_given_costs_leave_the_optimizer_uncharged():
    from types import SimpleNamespace

    from lptrain.model_perf import cli
    opts = SimpleNamespace(optimizer=LBFGSOptions())
    m = Machine(given_costs(10, 1e-3, 1e-3, 1e-3), Link(0.0, 1e30))
    got, note = cli.with_optimizer(SimpleNamespace(fresh=False), opts, m, _theta())
    assert got.optimizer == 0.0 and note == "optimizer lbfgs: not charged (given costs)"
