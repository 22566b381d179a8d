"""The speedup model: iterations recorded from the real code, their costs, the simulation.

Recorded counts are compared with the steps a numeric run of the same oracle takes
(tests/helpers.py's Counting around its propagators); predictions with sums worked out
by hand from the record and given costs.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import lptrain.train.oracles  # noqa: F401  (at collection: h5py's first import runs uname)
from helpers import Counting
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.options import MGRITOptions
from lptrain.model_perf import costs as kc
from lptrain.model_perf import record as rec_mod
from lptrain.model_perf.predict import Collecting, Counts, Machine, Model
from lptrain.model_perf.scripted import ScriptedExchange
from lptrain.model_perf.record import (DATA, LAYER, Allreduce, Glue, Kernel, Recv, Send,
                                       record_iteration)
from lptrain.model_perf.simulate import FREE_LINK, Link, ScheduleError, simulate
from lptrain.parallel.grid import Grid

FORWARD = ("apply", "apply_save", "apply_plus", "apply_save_plus")
ADJOINT = ("vjp_saved", "vjp_and_g")
OPTS = MGRITOptions(levels=3, cfactor0=2, cfactor=2, tol=1e-9, max_iter=30)


def _steps(ops, names) -> int:
    """States advanced by the kernels `names` in a rank's ops."""
    return sum(op.states * op.calls for op in ops if isinstance(op, Kernel) and op.name in names)


def _calls(ops, name) -> int:
    return sum(op.calls for op in ops if isinstance(op, Kernel) and op.name == name)


def _numeric(mode, net, theta, x, y, opts):
    """A real second optimizer iteration on one rank: (forward steps, adjoint steps,
    forward cycles, adjoint cycles), counted by Counting around the solvers'
    propagators."""
    oracle = rec_mod.iteration_oracle(net, mode, opts, SerialExchange())
    terms = getattr(oracle, "terms", oracle)
    counted = {}
    for name, solver in (("fwd", terms.lp.fwd), ("adj", terms.lp.adj)):
        def solve(prop, *args, _solve=solver.solve, _name=name, **kw):
            counted[_name] = Counting(prop)
            res = _solve(counted[_name], *args, **kw)
            counted[_name + "_cycles"] = res.iterations
            return res
        solver.solve = solve
    for k in range(2):
        ev = rec_mod.value_of(oracle, theta * (1 + 0.1 * k), x, y)
        rec_mod.gradient_of(oracle, ev)
    return (counted["fwd"].total(), counted["adj"].total(), counted["fwd_cycles"],
            counted["adj_cycles"])


@pytest.mark.parametrize("mode", ["mgrit", "simultaneous"])
def test_recorded_steps_are_those_of_a_numeric_iteration(mode):
    from helpers import batch, dense_net
    net, theta = dense_net(layers=16, T=2.0)
    x, y = batch(net)
    fwd, adj, kf, ka = _numeric(mode, net, theta, x, y, OPTS)
    assert kf >= 1 and ka >= 1
    one = record_iteration(net, mode, OPTS, 1, 1, kf, ka)
    assert _steps(one.value[0], FORWARD) == fwd
    assert _steps(one.gradient[0], ADJOINT) == adj
    # the solvers' steps as their observer (the recorder) was told: the same states
    assert sum(one.steps[0][0].values()) == fwd and sum(one.steps[1][0].values()) == adj
    assert len(one.steps[0][0]) == OPTS.levels
    # the same work over the layer ranks: every point is relaxed by its one owner
    for size in (2, 4):
        many = record_iteration(net, mode, OPTS, size, 1, kf, ka)
        assert sum(_steps(ops, FORWARD) for ops in many.value) == fwd
        assert sum(_steps(ops, ADJOINT) for ops in many.gradient) == adj


@pytest.mark.parametrize("mode", ["serial", "simultaneous"])
def test_the_record_s_messages_and_sums_are_what_a_real_iteration_tells_its_observer(mode):
    # the oracles of a real one-rank iteration (2 data groups seen by one) with a Recorder
    # as observer report the sums the zero-cost record holds, in the same order
    from dataclasses import replace

    from helpers import batch, dense_net
    net, theta = dense_net(layers=16, T=2.0)
    x, y = batch(net)
    opts = replace(OPTS, control="fixed", fwd_iters=2, adj_iters=1, adaptive=False)
    want = record_iteration(net, mode, opts, 1, 2, 2, 1, batch=x.shape[0])
    seen = rec_mod.Recorder()
    oracle = rec_mod.iteration_oracle(net, mode, opts, SerialExchange(), SerialExchange(),
                                      False, seen, seen.over_data())
    for kept in (False, True):
        seen.begin(kept)
        ev = rec_mod.value_of(oracle, theta, x, y)
        value, value_steps = seen.end()
        seen.begin(kept)
        rec_mod.gradient_of(oracle, ev)
        gradient, gradient_steps = seen.end()
    talk = (Send, Recv, Allreduce)
    for got, recorded in ((value, want.value[0]), (gradient, want.gradient[0])):
        assert [op for op in got if isinstance(op, talk)] == \
            [op for op in recorded if isinstance(op, talk)]
        assert not any(isinstance(op, Kernel) for op in got)   # a real network reports none
    assert (value_steps, gradient_steps) == (want.steps[0][0], want.steps[1][0])
    assert any(op.group == DATA for op in gradient if isinstance(op, Allreduce))


def test_serial_records_one_sweep_each_way_and_the_data_sums():
    from helpers import dense_net
    net, _ = dense_net(layers=7)
    r = record_iteration(net, "serial", OPTS, 1, 3)
    value, gradient = r.value[0], r.gradient[0]
    assert _calls(value, "apply_save") == 7 and _calls(value, "opening") == 1
    assert [_calls(gradient, k) for k in ("act_vjp", "vjp_from_g")] == [7] * 2
    # the dense weight products: one batched call on all 7 layers after the sweep
    assert [(op.states, op.calls) for op in gradient
            if isinstance(op, Kernel) and op.name == "vjp_weights"] == [(7, 1)]
    # loss, hits and the gradient are summed over the 3 data groups (the layer group of
    # one rank sums too, at no cost)
    sums = [op for ops in (value, gradient) for op in ops
            if isinstance(op, Allreduce) and op.group == DATA]
    assert [op.nbytes for op in sums][:2] == [8, 8]
    assert len(sums) == 3 and sums[-1].nbytes >= net.layout.size * 8


def test_messages_go_between_neighbouring_layer_ranks():
    from helpers import dense_net
    net, _ = dense_net(layers=16)
    r = record_iteration(net, "simultaneous", OPTS, 4, 1, 2, 2)
    for part in (r.value, r.gradient):
        for rank, ops in enumerate(part):
            peers = {op.peer for op in ops if isinstance(op, (Send, Recv))}
            assert peers and peers <= {rank - 1, rank + 1}
        sends = sum(isinstance(op, Send) for ops in part for op in ops)
        assert sends == sum(isinstance(op, Recv) for ops in part for op in ops)
    # forward states travel to the right, adjoints to the left (the mirrored hierarchy)
    assert all(op.peer == 1 for op in r.value[0] if isinstance(op, Send))
    assert any(op.peer == 2 for op in r.gradient[3] if isinstance(op, Send))


def test_a_scripted_stop_that_the_solver_does_not_take_is_reported(monkeypatch):
    from helpers import dense_net
    net, _ = dense_net(layers=16)
    def never(self, values):                    # every check: not converged
        self.checks += 1
        return [1.0] * len(values)
    monkeypatch.setattr(ScriptedExchange, "allreduce_sums", never)
    with pytest.raises(rec_mod.RecordingError, match="residual 31 and 31 times"):
        record_iteration(net, "mgrit", OPTS, 2, 1, 3, 3)


# -- predictions -------------------------------------------------------------------------------
def _fake_costs(batch: int) -> kc.KernelCosts:
    """Distinct made-up costs for every kernel: 1 sample t/10, `batch` samples t."""
    costs = kc.KernelCosts(batch)
    for i, name in enumerate(sorted(rec_mod_names())):
        for m in range(1, 17):
            costs.full[(name, m)] = 1e-3 * (i + 1) * m ** 0.9
            costs.one[(name, m)] = costs.full[(name, m)] / 10
    return costs


def rec_mod_names():
    return ("apply", "apply_save", "apply_plus", "apply_save_plus", "linearize", "vjp_saved",
            "vjp_and_g", "vjp_from_g", "act_vjp", "vjp_weights", "opening", "opening_vjp",
            "classify", "classify_grad", "regulariser", "regulariser_grad")


@pytest.mark.parametrize("mode", ["serial", "mgrit", "simultaneous"])
def test_one_rank_prediction_is_the_sum_of_its_recorded_kernel_costs(mode):
    from helpers import dense_net
    net, _ = dense_net(layers=12)
    model = Model(net, OPTS, batch=40)
    costs = _fake_costs(40)
    m = Machine(costs, Link(1e-3, 1e6))     # one rank: sums cost nothing
    r = model.record(mode, 1, 1, 3, 2)

    def total(ops):
        return sum(op.calls * costs.full[(op.name, op.states)] if isinstance(op, Kernel)
                   else op.seconds if isinstance(op, Glue) else 0.0
                   for ops_ in ops for op in ops_)
    assert any(isinstance(op, Glue) and op.seconds > 0 for op in r.value[0])
    want = 1.5 * total(r.value) + total(r.gradient)
    got = model.grid_time(Grid(1, 1), mode, m, Counts(1.5, 3, 2), (3, 2))
    assert got == pytest.approx(want, rel=1e-12)


def test_fractional_cycles_interpolate_between_records():
    from helpers import dense_net
    net, _ = dense_net(layers=12)
    model, m = Model(net, OPTS, batch=40), Machine(_fake_costs(40), FREE_LINK)
    t2, t3 = (model.grid_time(Grid(2, 1), "mgrit", m, Counts(1, k, k)) for k in (2, 3))
    assert model.grid_time(Grid(2, 1), "mgrit", m, Counts(1, 2.25, 2.25)) == \
        pytest.approx(t2 + 0.25 * (t3 - t2))
    assert t3 > t2


def test_data_groups_run_on_their_shard_and_pay_their_sums():
    from helpers import dense_net
    net, _ = dense_net(layers=12)
    model, costs = Model(net, OPTS, batch=41), _fake_costs(41)
    link = Link(1e-4, 1e7)
    r = model.record("serial", 1, 4)
    shard = 11                                   # ceil(41 / 4) samples
    kernels = sum(op.calls * costs.call(op.name, op.states, shard) if isinstance(op, Kernel)
                  else op.seconds if isinstance(op, Glue) else 0.0
                  for part in (r.value, r.gradient) for op in part[0])
    sums = sum(link.allreduce(op.nbytes, 4) for part in (r.value, r.gradient)
               for op in part[0] if isinstance(op, Allreduce) and op.group == DATA)
    got = model.grid_time(Grid(1, 4), "serial", Machine(costs, link))
    assert got == pytest.approx(kernels + sums, rel=1e-12)


def test_kernel_costs_are_affine_in_the_shard():
    c = kc.KernelCosts(101, one={("apply", 2): 1.0}, full={("apply", 2): 11.0})
    assert c.call("apply", 2, 1) == 1.0 and c.call("apply", 2, 101) == 11.0
    assert c.call("apply", 2, 51) == pytest.approx(6.0)
    given = kc.given_costs(10, 2.0, 3.0, 5.0, overhead=1.0)
    assert given.call("apply_save", 4, 5) == pytest.approx(4 * 1.5)
    assert given.call("vjp_weights", 1, 10) == 5.0 and given.call("classify", 1, 10) == 0.0


def test_predictions_refuse_more_layer_ranks_than_intervals():
    from helpers import dense_net
    net, _ = dense_net(layers=12)
    model, m = Model(net, OPTS, batch=8), Machine(_fake_costs(8), FREE_LINK)
    assert model.max_layer == 6
    ok, too_many = model.predict_all([6, 7], m)
    assert ok.possible and ok.simultaneous > 0 and ok.fwd_iteration > 0
    assert not too_many.possible and too_many.serial > 0


def test_costs_are_kept_per_host_and_configuration(tmp_path, monkeypatch):
    from helpers import dense_net
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path))
    net, theta = dense_net(layers=4)
    calls = []

    def fake(net_, theta_, batch, kernels, device, neighbours=0):
        calls.append(set(kernels))
        return {(name, m, b): 1e-3 * b for name, m in kernels for b in (1, batch)}, {}
    monkeypatch.setattr("lptrain.model_perf.measure.measure_kernels", fake)
    want = {("apply", 1), ("vjp_saved", 2)}
    c1, _ = kc.measured(net, theta, 16, want, "cpu", 1)
    c2, note = kc.measured(net, theta, 16, want | {("linearize", 1)}, "cpu", 1)
    assert calls == [want, {("linearize", 1)}]          # only the missing one again
    assert "earlier" not in note and c2.full[("apply", 1)] == c1.full[("apply", 1)] == 0.016
    _, note = kc.measured(net, theta, 16, want, "cpu", 1)
    assert len(calls) == 2 and "earlier" in note
    kc.measured(net, theta, 32, want, "cpu", 1)         # another batch: another file
    assert len(calls) == 3 and len(list((tmp_path / "kernel_costs").iterdir())) == 2


def test_measured_kernels_run_the_networks_own_functions():
    from helpers import conv_net
    from lptrain.model_perf.measure import kernel_calls
    net, theta = conv_net()
    kinds = {(name, m) for name in rec_mod_names() for m in (1, 3)
             if m == 1 or name not in ("opening", "opening_vjp", "classify", "classify_grad",
                                       "regulariser", "regulariser_grad")}
    calls = kernel_calls(net, theta, 5, kinds)
    assert set(calls) == kinds
    for fn in calls.values():
        fn()


def test_measured_kernels_read_a_new_copy_of_every_input_each_call():
    """Inputs rotate through a pool of pool_bytes (beyond the cache), shared by the
    kernels of one shape: each call reads copies the last ones did not."""
    from helpers import dense_net
    from lptrain.model_perf import measure
    net, theta = dense_net(layers=4)
    state = math.prod(net.state_dims(10)) * theta.element_size()
    calls = measure.kernel_calls(net, theta, 10, {("vjp_saved", 1), ("apply_save", 1)},
                                 pool_bytes=5 * state)
    pool = calls[("vjp_saved", 1)].pool
    assert pool is calls[("apply_save", 1)].pool
    assert pool.u.shape[0] == 5
    pool.saved.zero_()
    for _ in range(5):
        calls[("apply_save", 1)]()           # writes one copy of saved per call
    assert all(pool.saved[i].abs().sum() > 0 for i in range(5))
    few = measure.kernel_calls(net, theta, 10, {("apply", 1)}, pool_bytes=5 * state,
                               max_copies=2)
    assert few[("apply", 1)].pool.u.shape[0] == 2


@pytest.mark.parametrize("text, size", [("32768K", 2 ** 25), ("1024K", 2 ** 24),
                                        ("256M", 2 ** 26), ("", 2 ** 25), (None, 2 ** 25)])
def test_cold_pools_hold_the_last_level_cache(tmp_path, text, size):
    from lptrain.model_perf.measure import cold_bytes
    path = tmp_path / "size"
    if text is not None:
        path.write_text(text + "\n")
    assert cold_bytes(str(path)) == size


# -- the discrete-event evaluation ---------------------------------------------------------
def _unit(op):
    return float(op.calls)


def test_message_arrives_after_latency_and_transfer():
    link = Link(latency=2.0, bandwidth=10.0)
    sched = [[Kernel("apply", 1, 3), Send(1, 5)],
             [Kernel("apply"), Recv(0, 5), Kernel("apply")]]
    tl = simulate(sched, _unit, link, state_bytes=10)
    assert tl.finish == (3.0, 3.0 + 2.0 + 5.0 + 1.0)   # recv at 10, then one kernel
    assert tl.compute == (3.0, 2.0)


def test_layer_sums_wait_for_all_and_data_sums_for_none():
    link = Link(latency=1.0, bandwidth=math.inf)
    sched = [[Kernel("apply", 1, k), Allreduce(8, LAYER)] for k in (1, 4, 2)]
    assert simulate(sched, _unit, link).finish == (8.0, 8.0, 8.0)   # 4 + 2·ceil(log2 3)
    sched = [[Kernel("apply", 1, k), Allreduce(8, DATA)] for k in (1, 4)]
    assert simulate(sched, _unit, link, data=4).finish == (5.0, 8.0)


def test_receive_without_send_is_reported():
    with pytest.raises(ScheduleError, match="rank 0 blocked"):
        simulate([[Recv(1)], []], _unit, FREE_LINK)


def test_collecting_costs_name_every_kernel_a_prediction_charges():
    from helpers import dense_net
    net, _ = dense_net(layers=12)
    model = Model(net, OPTS, batch=8)
    probe = Machine(Collecting(), FREE_LINK)
    assert model.grid_time(Grid(2, 2), "simultaneous", probe) == 0.0
    r = model.record("simultaneous", 2, 2, OPTS.fwd_iters, OPTS.adj_iters)
    assert probe.costs.kernels == r.kernels()


# -- the command -------------------------------------------------------------------------------
def _no_measuring(monkeypatch, tmp_path):
    """Kept costs under tmp_path, made up where missing (the auto column's); the timer
    lptrain-model installs for it is uninstalled after the test."""
    from lptrain.parallel import auto
    monkeypatch.setattr(auto, "_factory", None)
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path / "cache"))

    def fake(net, theta, batch, kernels, device, neighbours=0):
        alone = {(name, m, b): 1e-4 * m * b for name, m in kernels for b in (1, batch)}
        return alone, {key: 1.5 * t for key, t in alone.items()} if neighbours else {}
    monkeypatch.setattr("lptrain.model_perf.measure.measure_kernels", fake)


def test_command_writes_table_plot_and_compares_a_measured_run(tmp_path, monkeypatch,
                                                               capsys):
    import yaml
    _no_measuring(monkeypatch, tmp_path)

    from lptrain.metrics import schema as ms
    from lptrain.metrics.writer import open_writer
    from lptrain.model_perf import cli
    _, cfg = cli.compose(["experiment=peaks_paper", "dataset.grid=32"])
    run = tmp_path / "run" / ms.FILE_NAME
    run.parent.mkdir()
    attrs = {ms.MODE: "serial", ms.WORLD_SIZE: 1, ms.SEED: 0, ms.CONFIG: yaml.safe_dump(cfg)}
    with open_writer(run, attrs, enabled=True) as writer:
        for k in (1, 2, 3):   # the first iteration is left out; median of 0.18 s
            writer.log_train(iteration=k, step_time=0.5 if k == 1 else 0.18, ls_trials=1)
    # a run of another depth: its own row, not beside these lines (was averaged in)
    deeper = tmp_path / "deeper" / ms.FILE_NAME
    deeper.parent.mkdir()
    deep_cfg = {**cfg, "network": {**cfg["network"], "layers": 60}}
    with open_writer(deeper, {**attrs, ms.CONFIG: yaml.safe_dump(deep_cfg)},
                     enabled=True) as writer:
        for k in (1, 2, 3):
            writer.log_train(iteration=k, step_time=0.9, ls_trials=1)
    out = tmp_path / "model"
    titles = []
    monkeypatch.setattr(cli, "plot", lambda *a: titles.append(a[5]) or a[2])
    args = ["experiment=peaks_paper", "dataset.grid=32", "--step-time", "1e-3",
            "--adjoint-time", "1e-3", "--latency", "0", "--bandwidth", "1e30", "--ranks",
            "1,2,16", "--measured", str(run.parent), str(deeper.parent), "--paper",
            "--out", str(out)]
    assert cli.main(args) == 0
    text = (out / "speedup_model.md").read_text()
    # the plot names what it models (was the command alone)
    assert titles == ["lptrain-model experiment=peaks_paper dataset.grid=32\npeaks: dense, "
                      "N = 30, batch 5000, float64 on cpu; MGRIT 2 levels, cfactor 2 / 2"]
    # N = 30 with c = 2: 15 C-intervals, so P = 16 is refused
    assert "| 16 |" in text and "not possible (P > 15 C-intervals)" in text
    # serial on one rank: 30 forward steps, 30 adjoint steps and 30 weight products of 1 ms
    assert "speedups over serial on 1 rank (0.09 s)" in text
    assert "| serial | 1 | 0.18 | 0.09 | 0.50 |" in text
    assert "| serial 1x1 0.18 |" in text     # the measured column of the P = 1 row
    # the terminal: the same numbers in 80 columns, and where the files are
    captured = capsys.readouterr()
    shown = captured.out
    # while it works, what it is doing (it had been silent for minutes on peaks_deep)
    assert captured.err.splitlines() == [
        "lptrain-model: recording the modes on P = 1 to 16 (minutes for a deep network)",
        *(f"lptrain-model: P = {p} recorded ({i} of 3)" for i, p in enumerate((1, 2, 16), 1))]
    assert all(len(line) <= 80 for line in captured.err.splitlines())
    assert "speedup over serial on 1 rank (0.09 s)" in shown
    # each measured run named (a sweep's jobs could not be told apart)
    assert "run  serial 1x1: 0.18 s measured, 0.09 s predicted (0.50)" in shown.splitlines()
    assert any(line.startswith("deeper  serial 1x1: ") for line in shown.splitlines())
    assert f"full report: {out / 'speedup_model.md'}" in shown
    assert all(len(line) <= 80 for line in shown.splitlines() if str(tmp_path) not in line)


def test_measured_runs_are_named_below_their_common_directory():
    from types import SimpleNamespace as NS

    from lptrain.model_perf.summary import measured_lines, run_names
    assert run_names(["/s/0/metrics.h5", "/s/1/metrics.h5", "/s/a/b/metrics.h5"]) == \
        ["0", "1", "a/b"]
    assert run_names(["/x/run/metrics.h5"]) == ["run"]
    assert run_names(["/x/run/metrics.h5", "/x/run/metrics.h5"]) == ["run", "run"]
    long = NS(path="/s/" + "d" * 60 + "/metrics.h5", mode="simultaneous", ranks=2, layer=2,
              iteration_time=0.5)
    short = NS(path="/s/0/metrics.h5", mode="serial", ranks=1, layer=1, iteration_time=0.25)
    lines = measured_lines([(long, 0.25, "", []), (short, None, "", [])])
    assert lines[:3] == ["d" * 60, "    simultaneous 2x1: 0.5 s measured, 0.25 s predicted "
                         "(0.50)", "0  serial 1x1: 0.25 s measured, - predicted (-)"]
    assert all(len(line) <= 80 for line in lines)
    # a run of another config with figures of many digits: was one line of 81 characters
    slow = NS(path="/s/" + "e" * 60 + "/metrics.h5", mode="simultaneous", ranks=1, layer=1,
              iteration_time=0.02883)
    lines = measured_lines([(slow, 0.1342, "", ["dataset.name='mnist'"])])
    assert lines[1:3] == ["    simultaneous 1x1: 0.02883 s measured, 0.1342 s predicted (4.65),",
                          "      other config"]
    assert all(len(line) <= 80 for line in lines)


def test_command_reports_a_bad_override(capsys):
    from lptrain.model_perf import cli
    assert cli.main(["network.layers=-3", "--step-time", "1", "--adjoint-time", "1"]) == 2
    assert "network.layers" in capsys.readouterr().err


def test_command_refuses_half_given_costs(capsys, tmp_path):
    """Both refusals came after the model had recorded every P (minutes on a deep
    network), --out's as '[Errno 17] File exists'."""
    from lptrain.model_perf import cli
    assert cli.main(["--step-time", "1e-3", "--ranks", "1"]) == 2
    assert capsys.readouterr().err == (
        "lptrain-model: error: --step-time and --adjoint-time go together (with "
        "--weight-time, --overhead); give both or neither\n")     # nothing recorded
    (tmp_path / "file.txt").write_text("mine")
    assert cli.main(["--step-time", "1e-3", "--adjoint-time", "1e-3", "--latency", "0",
                     "--bandwidth", "1e9", "--out", str(tmp_path / "file.txt")]) == 2
    assert capsys.readouterr().err == (f"lptrain-model: error: --out {tmp_path}/file.txt: "
                                       f"a file; name a directory for the model's report\n")


GIVEN = ["--step-time", "1e-3", "--adjoint-time", "1e-3", "--ranks", "1"]


@pytest.mark.parametrize("args, fragment", [
    (["--step-time", "-1", "--adjoint-time", "1e-4"], "--step-time -1.0: need a finite "
                                                      "number above 0"),
    (["--step-time", "nan", "--adjoint-time", "1e-4"], "--step-time nan"),
    (["--step-time", "0", "--adjoint-time", "0"], "--step-time 0.0"),
    ([*GIVEN, "--latency", "1e-6", "--bandwidth", "0"], "--bandwidth 0.0"),
    ([*GIVEN, "--latency", "-1", "--bandwidth", "1e9"], "--latency -1.0"),
    ([*GIVEN, "--latency", "1e-6"], "--latency and --bandwidth go together"),
    ([*GIVEN, "--trials", "0"], "--trials 0.0: need a finite number at least 1"),
    ([*GIVEN, "--threads", "0"], "--threads 0"),
    ([*GIVEN, "--mgrit-iters", "0,0"], "--mgrit-iters '0,0': need at least 1 cycle"),
    ([*GIVEN, "--weight-time", "-1"], "--weight-time -1.0"),
])
def test_command_refuses_numbers_no_machine_has_in_one_line(capsys, args, fragment):
    """They gave 'max() arg is an empty sequence', a ZeroDivisionError traceback, or a
    prediction without its forward sweep (--trials 0)."""
    from lptrain.model_perf import cli
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err


def test_overrides_may_follow_the_options(tmp_path, monkeypatch, capsys):
    from lptrain.model_perf import cli
    _no_measuring(monkeypatch, tmp_path)
    monkeypatch.setattr(cli, "plot", lambda *a: a[2])
    import yaml
    from lptrain.metrics import schema as ms
    from lptrain.metrics.writer import open_writer
    run = tmp_path / "run" / ms.FILE_NAME
    run.parent.mkdir()
    attrs = {ms.MODE: "serial", ms.WORLD_SIZE: 1, ms.SEED: 0, ms.CONFIG: yaml.safe_dump({})}
    with open_writer(run, attrs, enabled=True) as writer:
        for k in (1, 2, 3):
            writer.log_train(iteration=k, step_time=0.1, ls_trials=1)
    # after --measured (nargs="+") too: it took mgrit.levels=2 for a path
    args = ["network.layers=32", *GIVEN, "--latency", "0", "--bandwidth", "1e30",
            "--out", str(tmp_path / "m"), "--measured", str(run.parent), "mgrit.levels=2"]
    assert cli.main(args) == 0
    assert "MGRIT: 2 levels with 32 / 8 steps" in (tmp_path / "m" / "speedup_model.md").read_text()


def test_a_run_too_short_to_time_is_named_not_dropped(tmp_path, capsys):
    import yaml
    from lptrain.metrics import schema as ms
    from lptrain.metrics.writer import open_writer
    from lptrain.model_perf import cli
    run = tmp_path / "short" / ms.FILE_NAME
    run.parent.mkdir()
    attrs = {ms.MODE: "serial", ms.WORLD_SIZE: 1, ms.SEED: 0, ms.CONFIG: yaml.safe_dump({})}
    with open_writer(run, attrs, enabled=True) as writer:
        writer.log_train(iteration=1, step_time=0.5, ls_trials=1)
    assert cli.load_runs([run.parent]) == []
    assert f"{run}: fewer than 2 iterations" in capsys.readouterr().err


def test_a_measured_run_resumed_on_another_rank_count_counts_its_latest_ranks(tmp_path):
    from lptrain.metrics import schema as ms
    from lptrain.metrics.writer import open_writer
    from lptrain.model_perf.runs import load_run, mismatch
    path = tmp_path / ms.FILE_NAME
    attrs = {ms.MODE: "mgrit", ms.WORLD_SIZE: 2, ms.SEED: 0, ms.CONFIG: "seed: 0\n",
             ms.THREADS: 1}
    with open_writer(path, attrs, enabled=True) as writer:
        for k in (1, 2, 3):
            writer.log_train(iteration=k, step_time=1.0, ls_trials=1)
            writer.log_timing(k, [1.0] * 2, [0.0] * 2, [0.0] * 2)
    with open_writer(path, {**attrs, ms.WORLD_SIZE: 1, ms.THREADS: 2}, True, 3) as writer:
        for k in (4, 5, 6):      # on one rank: the first of these is left out too
            writer.log_train(iteration=k, step_time=0.5 if k == 4 else 2.0, ls_trials=1)
            writer.log_timing(k, [1.0], [0.0], [0.0])
    run = load_run(path)
    assert (run.ranks, run.iteration_time, run.threads) == (1, 2.0, 2)
    # one rank on two cores runs two threads: not the one-thread ranks the model times
    # (make scaling's P = 1 run measured 0.24 s against 0.43 predicted, before it set
    # OMP_NUM_THREADS=1)
    assert mismatch(run, {"seed": 0}, threads=1) == ["threads=2 (model 1)"]
    assert mismatch(run, {"seed": 0}, threads=2) == []


# -- the automatic grid ------------------------------------------------------------------------
def _proportional(batch: int, per_call: float) -> kc.KernelCosts:
    """Costs whose per-call part is `per_call` of the full-batch time t (t·b/B for 0),
    without the records' glue."""
    costs = _fake_costs(batch)
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
    from lptrain import cli
    from lptrain.model_perf.grid import MeasuredTimer
    from lptrain.parallel import auto
    from lptrain.parallel.auto import DataParallelFirst
    monkeypatch.setattr(auto, "_factory", None)
    assert isinstance(auto.timer_for(None, None, "mgrit"), DataParallelFirst)
    timer = cli._model_timer("opts", "net", "mgrit")
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
                        lambda net, theta, batch, kernels, device, neighbours=0: (
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


def test_lptrain_model_prints_the_split_auto_takes(tmp_path, monkeypatch):
    # both from this host's kept costs (here made up, and kept under tmp_path)
    from lptrain.data.base import dataset_sizes
    from lptrain.model_perf import cli
    from lptrain.preflight import auto_grid
    _no_measuring(monkeypatch, tmp_path)
    # each record also times its own glue: zero here, or the two sides see different loads
    monkeypatch.setattr("lptrain.model_perf.record.time.thread_time", lambda: 0.0)
    over = ["network.layers=64", "dataset.n_train=60"]
    # the costs auto decides on: measured alone (no forked neighbours in this tier)
    assert cli.main([*over, "--ranks", "4,8", "--host-ranks", "1", "--out", str(tmp_path)]
                    ) == 0
    text = (tmp_path / "speedup_model.md").read_text().split("## Layer x data split")[1]
    opts, _ = cli.compose(over)
    net, _, _ = cli.build_network(opts)
    for p in (4, 8):
        row = next(line for line in text.splitlines() if line.startswith(f"| {p} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        for col, mode in ((1, "mgrit"), (3, "simultaneous")):
            g = auto_grid(opts, dataset_sizes(opts.dataset), net, p, mode)
            assert cells[col] == f"{g.layer} x {g.data}", (p, mode, row)
            assert cells[col + 1].startswith(cells[col]), row     # the same costs


def test_busy_time_is_the_makespan_on_one_rank_and_splits_over_two():
    from helpers import dense_net
    net, _ = dense_net(layers=12)
    model, m = Model(net, OPTS, batch=40), Machine(_fake_costs(40), Link(1e-3, 1e6))
    one = model.busy("simultaneous", Grid(1, 1), m, 2, 2, trials=1.5)
    assert one == [pytest.approx(model.grid_time(Grid(1, 1), "simultaneous", m, Counts(1.5),
                                                 (2, 2)), rel=1e-12)]
    two = model.busy("simultaneous", Grid(2, 1), m, 2, 2, trials=1.5)
    assert len(two) == 2 and max(two) < one[0] < sum(two) * 1.5


def test_a_measured_run_is_predicted_iteration_by_iteration(tmp_path):
    """Iterations of unequal work (the controller's 2 or 3 cycles, a second trial): the
    prediction compared with the median time is the median of each iteration's own
    prediction, not the prediction at the run's mean counts."""
    from helpers import dense_net
    from lptrain.metrics import schema as ms
    from lptrain.metrics.writer import open_writer
    from lptrain.model_perf.runs import Work, load_run, predict_run
    net, _ = dense_net(layers=12)
    model, m = Model(net, OPTS, batch=40), Machine(_fake_costs(40), FREE_LINK)
    path = tmp_path / ms.FILE_NAME
    attrs = {ms.MODE: "simultaneous", ms.WORLD_SIZE: 1, ms.SEED: 0, ms.CONFIG: "seed: 0\n"}
    # (trials, forward cycles of the iteration, adjoint cycles); the first is left out
    plan = [(1, 9, 9), (1, 2, 2), (2, 6, 3), (1, 2, 2), (1, 3, 3), (1, 2, 2), (1, 3, 3),
            (1, 3, 3)]
    with open_writer(path, attrs, enabled=True) as writer:
        for k, (trials, fwd, adj) in enumerate(plan, start=1):
            writer.log_train(iteration=k, step_time=float(k), ls_trials=trials)
            writer.log_mgrit(iteration=k, fwd_iterations=fwd // trials, fwd_total=fwd,
                             adj_iterations=adj, adj_total=adj)
    run = load_run(path)
    assert run.work == (Work(1, 2, 2), Work(2, 3, 3), Work(1, 2, 2), Work(1, 3, 3),
                        Work(1, 2, 2), Work(1, 3, 3), Work(1, 3, 3))
    t22, t33 = (model.grid_time(Grid(1, 1), "simultaneous", m, Counts(1), (k, k))
                for k in (2, 3))
    pred, note = predict_run(run, model, m)
    assert pred == pytest.approx(t33, rel=1e-12)   # 4 of the 7 iterations are 3 + 3
    at_means = model.grid_time(Grid(1, 1), "simultaneous", m, Counts(run.trials),
                               (run.fwd, run.adj))
    assert at_means < 0.99 * t33 and t22 < at_means
    assert "3 kinds of iteration" in note


def test_an_iteration_with_a_repeated_evaluation_is_charged_it(tmp_path):
    """A one-shot evaluation taken again (mgrit/refined) was charged as one trial with
    the accepted point's adjoint only: the first try's gradient went uncounted, in each
    iteration's prediction and in the run's means."""
    from lptrain.metrics import schema as ms
    from lptrain.metrics.writer import open_writer
    from lptrain.model_perf.runs import Work, load_run
    path = tmp_path / ms.FILE_NAME
    attrs = {ms.MODE: "simultaneous", ms.WORLD_SIZE: 1, ms.SEED: 0, ms.CONFIG: "seed: 0\n"}
    with open_writer(path, attrs, enabled=True) as writer:
        for k, (trials, fwd, adj, adj_all, again) in enumerate(
                [(1, 2, 2, 2, 0), (1, 8, 6, 8, 1), (2, 6, 3, 3, 0)], start=1):
            writer.log_train(iteration=k, step_time=float(k), ls_trials=trials)
            writer.log_mgrit(iteration=k, fwd_iterations=6, fwd_total=fwd,
                             adj_iterations=adj, adj_total=adj_all, refined=again)
    run = load_run(path)
    assert run.work == (Work(2, 4, 8), Work(2, 3, 3))
    # the run's means (the curves for other P, the note) count the repeat alike
    assert (run.trials, run.fwd, run.adj) == (2.0, 3.5, 5.5)


def test_simultaneous_cycles_come_from_measured_runs_where_there_are_some():
    """mgrit.control=error plans the one-shot cycles; the curve for every P takes what
    the measured simultaneous runs took, else the options' fixed fwd_iters / adj_iters."""
    from types import SimpleNamespace

    from helpers import dense_net
    from lptrain.model_perf import cli
    from lptrain.model_perf.runs import MeasuredRun
    net, _ = dense_net(layers=12)
    model, m = Model(net, OPTS, batch=40), Machine(_fake_costs(40), FREE_LINK)
    args = SimpleNamespace(trials=None, mgrit_iters=None)

    def run(mode, fwd, adj):
        return MeasuredRun(Path("x"), mode, 1, 1.0, 1.0, fwd, adj, {})
    cnt, note = cli.counts(args, [run("simultaneous", 2.5, 3.0), run("simultaneous", 3.5, 3.0),
                                  run("mgrit", 6.0, 4.0)])
    assert cnt.simultaneous(OPTS) == (3.0, 3.0) and (cnt.mgrit_fwd, cnt.mgrit_adj) == (6, 4)
    assert "simultaneous cycles: mean of measured simultaneous runs" in note
    assert model.grid_time(Grid(2, 1), "simultaneous", m, cnt) == \
        model.grid_time(Grid(2, 1), "simultaneous", m, Counts(), (3.0, 3.0))
    bare, _ = cli.counts(args, [])
    assert bare.simultaneous(OPTS) == (OPTS.fwd_iters, OPTS.adj_iters)


def test_only_runs_of_the_modelled_configuration_give_the_counts():
    """Runs of another dataset given with --measured were flagged 'other config' in
    the comparison, yet their cycles and trials set every predicted P."""
    from types import SimpleNamespace

    from helpers import dense_net
    from lptrain.model_perf import cli
    from lptrain.model_perf.runs import MeasuredRun
    net, _ = dense_net(layers=12)
    model = Model(net, OPTS, batch=40)
    cfg = {"network": {"name": "dense", "width": 4}, "dataset": {"name": "peaks"},
           "optimizer": {"name": "lbfgs"}}
    ours = MeasuredRun(Path("a"), "simultaneous", 1, 1.0, 1.0, 2.0, 2.0, cfg)
    other = MeasuredRun(Path("b"), "simultaneous", 1, 1.0, 3.0, 6.0, 6.0,
                        {**cfg, "dataset": {"name": "mnist"}})
    adam = MeasuredRun(Path("c"), "simultaneous", 1, 1.0, 1.0, 6.0, 6.0,
                       {**cfg, "optimizer": {"name": "adam"}})
    assert cli.of_config([ours, other, adam], model, cfg) == [ours]
    cnt, note = cli.counts(SimpleNamespace(trials=None, mgrit_iters=None), [ours], 1)
    assert cnt.simultaneous(OPTS) == (2.0, 2.0) and cnt.trials == 1.0
    assert note.endswith("1 measured run of another config not counted")


def test_the_plots_title_wraps_a_long_command_inside_the_figure():
    """The title is the command, which a custom step's overrides make long."""
    from helpers import title_inside
    from lptrain.model_perf.predict import Prediction
    from lptrain.model_perf.report import figure
    command = "lptrain-model " + " ".join(f"+network.step.option_{i}=${{network.width}}"
                                          for i in range(8))
    fig = figure([Prediction(1, 1.0, 2.0, 1.5), Prediction(2, 0.5, 1.0, 0.8)], 1.0,
                 title=command)
    assert title_inside(fig)
    assert fig.get_suptitle().replace("\n", " ") == command
    fig = figure([Prediction(1, 1.0, 2.0, 1.5)], 1.0, title="a\nb")    # lines kept
    assert fig.get_suptitle() == "a\nb"


def test_the_plot_keeps_measured_runs_apart_by_split_and_baseline():
    """Runs of 1 x 2 and 2 x 1 were averaged into one circle on the P x 1 line; measured
    speedups were over the predicted serial time (a measured serial run on one rank sat
    at 0.43 over itself); --paper starred all three datasets; log ticks read 4×10⁻¹."""
    from lptrain.model_perf.predict import Prediction
    from lptrain.model_perf.report import figure
    preds = [Prediction(1, 1.0, 2.0, 1.5), Prediction(2, 0.5, 1.0, 0.8)]
    measured = {("serial", 1, "1x1"): [2.0], ("simultaneous", 2, "2x1"): [1.0],
                ("simultaneous", 2, "1x2"): [4.0]}
    fig = figure(preds, 1.0, measured, paper=True, dataset="peaks")
    ax_t, ax_s = fig.axes
    points = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata()),
                               ln.get_markerfacecolor()) for ln in ax_t.lines}
    assert points["simultaneous (measured)"][:2] == ([2], [1.0])
    simul = points["simultaneous (measured, other split)"]
    assert simul[:2] == ([2], [4.0]) and simul[2] == "none"
    speedups = sorted((float(x), float(y)) for ln in ax_s.lines if ln.get_marker() == "o"
                      for x, y in zip(ln.get_xdata(), ln.get_ydata()))
    # over the measured serial run (2 s): itself 1, the 2 x 1 run 2, the 1 x 2 run 0.5
    assert speedups == [(1.0, 1.0), (2.0, 0.5), (2.0, 2.0)]
    # the speedup panel's legend names its measured points too (it had none)
    named = [t.get_text() for t in ax_s.get_legend().get_texts()]
    assert "simultaneous (measured)" in named and "serial (measured)" in named
    stars = [ln.get_label() for ln in ax_s.lines if ln.get_marker() == "*"]
    assert stars == ["paper: Peaks 6.0× on 256 cores"]
    fig.canvas.draw()            # its P is a tick of the speedup panel (it had none)
    assert [t.get_text() for t in ax_s.get_xticklabels()] == ["1", "2", "256"]
    fig.canvas.draw()
    labels = [t.get_text() for t in ax_t.get_xticklabels() + ax_s.get_yticklabels()]
    assert "×10" not in "".join(labels) and "^" not in "".join(labels), labels
    # the legends below the axes (inside, one covered a line and a measured point), and
    # every P labelled (a P of 3 had no tick)
    for ax in (ax_t, ax_s):
        legend, box = ax.get_legend().get_window_extent(), ax.get_window_extent()
        assert legend.y1 <= box.y0
    odd = figure([Prediction(p, 1.0 / p, 2.0 / p, 1.5 / p) for p in (1, 2, 3, 4)], 1.0)
    odd.canvas.draw()
    assert [t.get_text() for t in odd.axes[0].get_xticklabels()] == ["1", "2", "3", "4"]
    # within a decade the y axes keep labels (0.035-0.08 s had none)
    narrow = figure([Prediction(1, 0.08, 0.07, 0.06), Prediction(2, 0.05, 0.04, 0.035)], 0.08)
    narrow.canvas.draw()
    for ax in narrow.axes:
        lo, hi = ax.get_ylim()
        shown = [t for t, v in zip(ax.get_yticklabels(), ax.get_yticks()) if lo <= v <= hi]
        assert len([t for t in shown if t.get_text()]) >= 2, [t.get_text() for t in shown]


def test_a_key_the_configuration_lacks_is_named_with_hydras_reason(capsys):
    """`lptrain-model foo=1` said only Hydra's first line, 'Could not override 'foo'.'"""
    from lptrain.model_perf import cli
    assert cli.main(["foo=1", "--ranks", "1"]) == 2
    assert capsys.readouterr().err == ("lptrain-model: error: foo: no such key (lptrain "
                                       "--cfg job shows them)\n")
