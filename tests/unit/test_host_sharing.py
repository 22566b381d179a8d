"""Ranks that share a host: kernel costs measured alone and with host_ranks copies at once
(costs.py), and what a prediction on P ranks charges (predict.Machine.on_host)."""
from __future__ import annotations

import json

import pytest

from lptrain.mgrit.options import MGRITOptions
from lptrain.model_perf import costs as kc
from lptrain.model_perf.predict import Machine, Model
from lptrain.model_perf.simulate import Link
from lptrain.parallel.grid import Grid

OPTS = MGRITOptions(levels=2, cfactor0=2, cfactor=2, fwd_iters=2, adj_iters=2)
NAMES = ("apply", "apply_save", "apply_plus", "apply_save_plus", "linearize", "vjp_saved",
         "vjp_and_g", "vjp_from_g", "act_vjp", "vjp_weights", "opening", "opening_vjp",
         "classify", "classify_grad", "regulariser", "regulariser_grad", "serial_forward",
         "serial_adjoint")


def _costs(batch: int, host_ranks: int, factor: float) -> kc.KernelCosts:
    """Made-up costs, the shared ones `factor` times the alone ones, no glue."""
    c = kc.KernelCosts(batch, glue=False, host_ranks=host_ranks)
    for i, name in enumerate(NAMES):
        for m in range(1, 17):
            c.full[(name, m)] = 1e-3 * (i + 1) * m
            c.one[(name, m)] = c.full[(name, m)] / 10
            if host_ranks > 1:
                c.shared_full[(name, m)] = factor * c.full[(name, m)]
                c.shared_one[(name, m)] = factor * c.one[(name, m)]
    return c


def test_a_rank_pays_the_costs_of_the_ranks_on_its_host():
    c = _costs(100, host_ranks=5, factor=1.4)
    key = ("apply", 3)
    assert c.on_host(1).full[key] == c.full[key] and c.on_host(1).one[key] == c.one[key]
    assert c.on_host(5).full[key] == pytest.approx(c.shared_full[key])
    assert c.on_host(64).full[key] == pytest.approx(c.shared_full[key])   # 5 per host
    assert c.on_host(3).full[key] == pytest.approx(1.2 * c.full[key])      # halfway
    assert c.on_host(3).call("apply", 3, 50.0) == pytest.approx(1.2 * c.call("apply", 3, 50.0))
    assert c.on_host(3).on_host(5).full[key] == c.on_host(3).full[key]     # applied once
    alone = _costs(100, host_ranks=1, factor=1.0)
    assert alone.on_host(8).full == alone.full


def test_a_kernel_beside_others_costs_no_less_than_alone():
    """Shared costs measured at 0.58-0.97 of the alone ones on a loaded host predicted
    2.22x on 2 ranks (data-parallel serial) and 4.09x on 4."""
    c = _costs(100, host_ranks=4, factor=0.6)
    assert c.on_host(4).full == c.full and c.on_host(2).one == c.one


def test_a_prediction_on_p_ranks_charges_min_p_host_ranks_at_once():
    from helpers import dense_net
    net, _ = dense_net(layers=8)
    model = Model(net, OPTS, batch=40)
    link = Link(0.0, 1e30)
    alone = Machine(_costs(40, 1, 1.0), link, optimizer=0.01)
    shared = Machine(_costs(40, 2, 1.5), link, optimizer=0.01, optimizer_shared=0.02)
    for mode in ("serial", "mgrit", "simultaneous"):
        one = model.grid_time(Grid(1, 1), mode, alone)
        assert model.grid_time(Grid(1, 1), mode, shared) == pytest.approx(one)
        grid = Grid(1, 2) if mode == "serial" else Grid(2, 1)
        two = model.grid_time(grid, mode, alone) - 0.01
        # messages are free: every kernel costs 1.5 times, the optimizer twice
        assert model.grid_time(grid, mode, shared) == pytest.approx(1.5 * two + 0.02)
    busy = model.busy("simultaneous", Grid(2, 1), shared, 2, 2)
    assert busy == pytest.approx([1.5 * (b - 0.01) + 0.02
                                  for b in model.busy("simultaneous", Grid(2, 1), alone, 2, 2)])


def test_the_optimizer_on_a_shared_host_and_its_pairs():
    m = Machine(_costs(10, 2, 1.0), Link(0.0, 1e30), optimizer=3.0, optimizer_per_pair=0.5,
                memory=4, optimizer_shared=4.5)
    two = m.on_host(2)    # each pair's share grows with the iteration
    assert two.optimizer == 4.5 and two.optimizer_per_pair == pytest.approx(0.75)
    assert two.optimizer_at(2) == pytest.approx(3.0)
    assert m.on_host(1).optimizer == 3.0 and m.on_host(1).optimizer_per_pair == 0.5


def test_shared_costs_are_kept_beside_the_alone_ones(tmp_path, monkeypatch):
    from helpers import dense_net
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path))
    net, theta = dense_net(layers=4)
    calls = []

    def fake(net_, theta_, batch, kernels, device, neighbours=0, progress=None):
        calls.append((set(kernels), neighbours))
        alone = {(name, m, b): 1e-3 * b for name, m in kernels for b in (1, batch)}
        return alone, {k: 2 * t for k, t in alone.items()} if neighbours else {}
    monkeypatch.setattr("lptrain.model_perf.measure.measure_kernels", fake)
    want = {("apply", 1), ("vjp_saved", 2)}
    c, _ = kc.measured(net, theta, 16, want, "cpu", 1)                 # alone only
    assert calls == [(want, 0)] and c.host_ranks == 1 and not c.shared_full
    c, note = kc.measured(net, theta, 16, want, "cpu", 1, host_ranks=2)
    assert calls[-1] == (want, 1) and "2 at once" in note               # all again, beside one
    assert c.shared_full[("apply", 1)] == 2 * c.full[("apply", 1)] == 0.032
    c, note = kc.measured(net, theta, 16, want, "cpu", 1, host_ranks=2)
    assert len(calls) == 2 and "earlier" in note and c.host_ranks == 2
    c, _ = kc.measured(net, theta, 16, want | {("linearize", 1)}, "cpu", 1)   # auto's question
    assert calls[-1] == ({("linearize", 1)}, 0) and c.host_ranks == 1 and not c.shared_full
    kept = json.loads(next((tmp_path / "kernel_costs").iterdir()).read_text())
    assert kept["host_ranks"] == 2 and len(kept["kernels"]) == 3       # one file, shared kept
    c, _ = kc.measured(net, theta, 16, want, "cpu", 1, host_ranks=2)
    assert len(calls) == 3 and c.shared_full[("vjp_saved", 2)] == 0.032
    # was a KeyError on linearize, kept alone only (lptrain-model after a run's auto split)
    assert c.on_host(2).full[("vjp_saved", 2)] == 0.032
    assert c.on_host(2).full[("linearize", 1)] == c.full[("linearize", 1)]
    c, _ = kc.measured(net, theta, 16, want, "cpu", 1, host_ranks=4)   # another count: anew
    assert calls[-1] == (want, 3)


def test_the_load_kernels_were_timed_under_is_kept_and_told(tmp_path, monkeypatch, capsys):
    """`lptrain-model --measured` compared with runs 2-4x off on a busy host and said
    nothing of the load (held-out, stop 64): the load average before timing is kept with
    the costs, and a busy one is told on stderr and in speedup_model.md's sources."""
    from types import SimpleNamespace

    from helpers import dense_net
    from lptrain.model_perf import cli
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path))
    net, theta = dense_net(layers=4)
    monkeypatch.setattr("lptrain.model_perf.measure.measure_kernels",
                        lambda n, t, batch, kernels, device, neighbours=0, progress=None: (
                            {(k, m, b): 1e-3 for k, m in kernels for b in (1, batch)}, {}))
    loads = iter([0.2, 5.25, 0.1])
    monkeypatch.setattr(kc.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    args = SimpleNamespace(step_time=None, adjoint_time=None, fresh=False, host_ranks=1,
                           threads=1)
    model = SimpleNamespace(net=net, batch=16)
    c, note = cli.kernel_costs(args, model, theta, {("apply", 1)}, "cpu")
    assert c.load == 0.2 and "load average" not in note + capsys.readouterr().err
    c, note = cli.kernel_costs(args, model, theta, {("apply", 1), ("apply", 2)}, "cpu")
    assert c.load == 5.25 and "; timed at a load average of 5.2 from other" in note
    assert "load average at 5.2" in capsys.readouterr().err
    c, note = cli.kernel_costs(args, model, theta, {("apply", 1)}, "cpu")   # kept: told again
    assert c.load == 5.25 and "load average at 5.2" in capsys.readouterr().err
    args.fresh = True                               # timed anew on an idle host: forgotten
    c, note = cli.kernel_costs(args, model, theta, {("apply", 1)}, "cpu")
    assert c.load == 0.1 and capsys.readouterr().err.count("load average") == 0
