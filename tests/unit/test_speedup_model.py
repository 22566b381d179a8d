"""The speedup model: schedules that match the solver, hand-counted critical paths, costs.

Step counts use unit costs (every step 1, messages free) unless a test says otherwise.
"""
from __future__ import annotations

import importlib.util
import math
import queue
import threading
from pathlib import Path

import pytest
import torch

from lptrain.mgrit.levels import LevelOps
from lptrain.mgrit.options import MGRITOptions
from lptrain.mgrit.solver import MGRIT, CycleOptions
from lptrain.model_perf import modes, predict, schedule
from lptrain.model_perf.schedule import (ADJOINT, COLD, FIRST, FORWARD, FRESH, LINEARIZE,
                                         WEIGHTS, Allreduce, Recv, Send, Step, hierarchy_for,
                                         iteration_schedule, max_ranks, mirrored,
                                         solve_schedule, total_steps)
from lptrain.model_perf.simulate import (FREE_LINK, Link, ScheduleError, StepCosts,
                                         critical_steps, simulate)

TINY = MGRITOptions(levels=2, cfactor0=2, cfactor=2, min_coarse=2, nrelax0=0)
PAPER_3A = MGRITOptions(levels=3, cfactor0=4, cfactor=4, nrelax0=0, nrelax=1)


def unit_machine() -> predict.Machine:
    return predict.Machine(StepCosts(1.0, 1.0, 1.0), FREE_LINK)


# -- hand counts ---------------------------------------------------------------------------
def test_one_level_on_one_rank_is_n_serial_steps():
    opts = MGRITOptions(levels=1)
    sched = solve_schedule(hierarchy_for(13, opts, 1), opts, iterations=3)
    assert total_steps(sched) == critical_steps(sched) == 13
    w = modes.Workload(13, 10, 80, 8)
    assert critical_steps(modes.serial_value(1, w)) == 13


def test_one_level_pipelines_through_the_ranks():
    # 1 level on 3 ranks: each rank steps its own layers after its left neighbour: N in all
    opts = MGRITOptions(levels=1)
    sched = solve_schedule(hierarchy_for(12, opts, 3), opts, iterations=1)
    assert critical_steps(sched) == 12
    assert [sum(isinstance(op, Send) for op in ops) for ops in sched] == [1, 1, 0]


# N = 8, cfactor 2, 2 levels (level 1: fine points 0,2,4,6,8 = 4 coarse steps, solved
# serially), F-relaxation only (nrelax0 = 0).
# P = 1, first iteration without skip_first_down (solver order):
#   F-relax level 0 (F-points 1,3,5,7)                         4
#   restrict: c_steps at C-points 2,4,6,8                       4
#             coarse Φ^Δ(v) at coarse points 1..4 (_coarse_phis) 4
#   allreduce; serial solve of level 1                          4
#   correct; F-relax level 0                                    4
#   ... which takes the next check's c_steps (C-points 2,4,6,8)  4   -> 24
# later iteration: the first F-relax is skipped (fresh), the residual was taken by the
# last F-relax, and the coarse level still holds its last solution: g_j += r_j, no Φ^Δ
# (FusedLevelOps._rhs_update); its own F-relax takes the next residual   -> 12
# cold first iteration (skip_first_down): serial 4 + F-relax 4 + next c_steps 4 -> 12
# P = 2: rank 0 owns fine 0..3 (coarse 0,1), rank 1 fine 4..8 (coarse 2,3,4).
#   F-relax: both 2 steps, t = 2. c_steps: rank 0 sends u_3, steps C-point 2 (t = 3);
#   rank 1 receives (t = 2), steps 4, 6, 8 (t = 5). coarse Φ^Δ: rank 0 sends v_1, steps
#   coarse 1 (t = 4); rank 1 receives, steps 2, 3, 4 (t = 8). allreduce: t = 8.
#   serial solve: rank 0 steps coarse 1 (t = 9), sends; rank 1 steps 2, 3, 4 (t = 12).
#   F-relax taking the next residual: rank 0 F-points 1, 3 and C-point 2 (t = 12), sends
#   u_3; rank 1 F-points 5, 7, C-points 6, 8, then the received 4 -> 17.
#   Fresh: no c_steps; coarse Φ^Δ messages only; allreduce t = 0; serial solve rank 0
#   t = 1, rank 1 t = 4; F-relax rank 0 t = 4, rank 1 4 + 4 + 1 -> 9.
#   Cold: serial solve rank 0 t = 1, rank 1 1 + 3 = 4; F-relax rank 1 -> 9.
@pytest.mark.parametrize("size,first,fresh,cold", [(1, 24, 12, 12), (2, 17, 9, 9)])
def test_tiny_critical_path_matches_hand_count(size, first, fresh, cold):
    hier = hierarchy_for(8, TINY, size)
    got = [critical_steps(iteration_schedule(hier, TINY, w)) for w in (FIRST, FRESH, COLD)]
    assert got == [first, fresh, cold]


def test_tiny_solves_chain_their_iterations():
    # on one rank, 2 cycles of a warm solve (skip_first_down is for cold starts only):
    # first 24 + fresh 12, the last F-relax taking the residual of the returned states;
    # converged after 2 cycles instead: the check that stopped it (its c_steps taken
    # before, no coarse Φ^Δ); cold: 12 + 12; cold without skip_first_down: 24 + 12
    hier = hierarchy_for(8, TINY, 1)
    assert critical_steps(solve_schedule(hier, TINY, 2)) == 36
    assert critical_steps(solve_schedule(hier, TINY, 2, converged=True)) == 36
    assert critical_steps(solve_schedule(hier, TINY, 2, cold=True)) == 24
    no_skip = MGRITOptions(levels=2, cfactor0=2, min_coarse=2, skip_first_down=False)
    assert critical_steps(solve_schedule(hier, no_skip, 2)) == 36


def test_v_cycle_cost_against_method_3a():
    # docs/method.md §4: N = 1024, c = 4, 3 levels, F on level 0, FCF on level 1: 2.5 N per
    # V-cycle (level 0: F .75 + residual .25 + F .75; level 1: FCF .4375 + residual
    # .0625 + F .1875; coarsest .0625).  Our FAS also steps the coarse propagator on the
    # injected values of levels 1 and 2 for the right-hand side: + .25 N + .0625 N.  An
    # iteration's last F-relaxation also takes the residual of the next check: + .25 N.
    N, hier = 1024, hierarchy_for(1024, PAPER_3A, 1)
    first = critical_steps(iteration_schedule(hier, PAPER_3A, FIRST))
    assert first == (2.5 + 0.3125 + 0.25) * N
    # later iterations skip the first level-0 F-relaxation (.75 N) and their residual
    # (taken) and reuse the level-1 rhs at level 1's F-points (Φ^Δ only at its C-points:
    # − .1875 N); a cold first one skips every down relaxation: coarsest .0625 + F level 1
    # .1875 + F level 0 .75 = N, + .25 N
    assert critical_steps(iteration_schedule(hier, PAPER_3A, FRESH)) == first - 1.1875 * N
    assert critical_steps(iteration_schedule(hier, PAPER_3A, COLD)) == 1.25 * N


def test_one_rank_simultaneous_step_counts_against_method_3a():
    # §3a: 2 forward + 1 adjoint warm cycles with the fresh-F skip and stored σ′.  A warm
    # solve relaxes before its first residual (skip_first_down is for cold starts), so
    # its first cycle is a full one: forward 3.0625 N (V-cycle 2.5 N, FAS Φ^Δ .3125 N,
    # the next residual .25 N) + fresh 1.875 N = 4.9375 N; adjoint (linear: no Φ^Δ)
    # 2.5 N + the residual of the returned states .25 N = 2.75 N; N weight VJPs.
    N = 1024
    opts = MGRITOptions(levels=3, cfactor0=4, cfactor=4, nrelax0=0, nrelax=1, fwd_iters=2,
                        adj_iters=1)
    w = modes.Workload(N, 100, 0, 0)

    def count(costs):
        m = predict.Machine(costs, FREE_LINK)
        return predict.parallel_time(1, w, opts, m, 2, 1, converged=False)
    assert count(StepCosts(forward=1.0, adjoint=0.0, weights=0.0)) == 4.9375 * N
    assert count(StepCosts(forward=0.0, adjoint=1.0, weights=0.0)) == 2.75 * N
    assert count(StepCosts(forward=0.0, adjoint=0.0, weights=1.0)) == N
    # serial: N steps + N VJPs + N weight products: 6.5 N / 3 N on one rank
    ser = predict.serial_time(1, w, unit_machine())
    assert ser == 3 * N
    assert count(StepCosts(1.0, 1.0, 1.0)) / ser == pytest.approx(8.6875 / 3)


# -- invariants ------------------------------------------------------------------------------
CONFIGS = [dict(levels=2, cfactor0=2, cfactor=2, min_coarse=2, nrelax0=0),
           dict(levels=3, cfactor0=4, cfactor=2, nrelax0=1, nrelax=1),
           dict(levels=4, cfactor0=2, cfactor=3, min_coarse=1, cycle="F"),
           dict(levels=3, cfactor0=3, cfactor=2, nrelax=0, skip_first_down=False)]


def _per_level(sched):
    out: dict = {}
    for ops in sched:
        for op in ops:
            if isinstance(op, Step):
                out[op.level] = out.get(op.level, 0) + op.count
    return out


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("which", [FIRST, FRESH, COLD])
def test_total_steps_per_level_do_not_depend_on_ranks(cfg, which):
    opts, N = MGRITOptions(**cfg), 29
    ref = _per_level(iteration_schedule(hierarchy_for(N, opts, 1), opts, which))
    for size in range(2, max_ranks(N, opts) + 1):
        sched = iteration_schedule(hierarchy_for(N, opts, size), opts, which)
        assert _per_level(sched) == ref, size
        assert critical_steps(sched) >= total_steps(sched) / size


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_messages_go_to_the_next_rank_with_points(cfg):
    opts, N = MGRITOptions(**cfg), 29
    for size in range(2, max_ranks(N, opts) + 1):
        hier = hierarchy_for(N, opts, size)
        for r, ops in enumerate(solve_schedule(hier, opts, 2, cold=True, converged=True)):
            for op in ops:
                if isinstance(op, (Send, Recv)):
                    lo, hi = sorted((r, op.peer))
                    gap = [hier.ranges[op.level][q] for q in range(lo + 1, hi)]
                    assert op.peer != r and all(a == b for a, b in gap), (size, r, op)
                    if op.level == 0:
                        assert op.peer == r + (1 if isinstance(op, Send) else -1)


def test_adjoint_messages_run_right_to_left():
    hier = hierarchy_for(16, TINY, 4)
    sched = mirrored(solve_schedule(hier.reversed(), TINY, 1, cost=ADJOINT))
    sends = [(r, op.peer) for r, ops in enumerate(sched) for op in ops
             if isinstance(op, Send) and op.level == 0]
    assert sends and all(peer == r - 1 for r, peer in sends)
    assert critical_steps(sched) == critical_steps(solve_schedule(hier, TINY, 1))


def test_critical_path_shrinks_with_ranks_down_to_the_coarse_solve():
    N, opts = 1024, PAPER_3A
    paths = [critical_steps(iteration_schedule(hierarchy_for(N, opts, p), opts, FRESH))
             for p in (1, 4, 16, 64, 256)]
    assert all(a > b for a, b in zip(paths, paths[1:]))
    assert paths[-1] >= N // 16   # the coarsest level (64 steps) stays sequential


# -- the schedule is what the solver does --------------------------------------------------------
class _Hub:
    """Mailboxes and a barrier shared by in-process ranks (one thread each)."""

    def __init__(self, size):
        self.size = size
        self.boxes = {(a, b): queue.Queue() for a in range(size) for b in range(size)}
        self.barrier = threading.Barrier(size, timeout=10)
        self.values = [0.0] * size


class _RecordingExchange:
    """The solver's exchange interface, logging (kind, peer) per call."""

    def __init__(self, hub, rank, log):
        self.hub, self.rank, self.size, self.log = hub, rank, hub.size, log

    def send(self, tensor, dest):
        self.log.append(("send", dest))
        self.hub.boxes[(self.rank, dest)].put(tensor.clone())

    def recv(self, template, source):
        self.log.append(("recv", source))
        return self.hub.boxes[(source, self.rank)].get(timeout=10)

    def wait(self):
        pass

    def allreduce_sums(self, values):
        self.log.append(("allreduce",))
        self.hub.values[self.rank] = list(values)
        self.hub.barrier.wait()
        total = [sum(col) for col in zip(*self.hub.values)]
        self.hub.barrier.wait()
        return total


class _CountingPropagator:
    """Φ(u) = 1.1 u + 1 for any step; logs the states each call advances."""

    def __init__(self, log):
        self.log = log

    def step(self, u, start, stop, out=None, **_):
        self.log.append(("step", 1))
        return _into(1.1 * u + 1.0, out)

    def step_many(self, U, starts, stops, out=None, **_):
        self.log.append(("step", len(starts)))
        return _into(1.1 * U + 1.0, out)


def _into(y, out):
    if out is None:
        return y
    out.copy_(y)
    return out


def _merged(events):
    out = []
    for e in events:
        if e[0] == "step" and out and out[-1][0] == "step":
            out[-1] = ("step", out[-1][1] + e[1])
        else:
            out.append(e)
    return out


def _signature(ops):
    kinds = {Send: "send", Recv: "recv"}
    return _merged([("step", op.count) if isinstance(op, Step) else ("allreduce",)
                    if isinstance(op, Allreduce) else (kinds[type(op)], op.peer)
                    for op in ops])


def _run_solver(hier, opts, cold, max_iter, tol, linear):
    """Each rank's logged events and the solve result, all ranks in threads."""
    hub, logs, results = _Hub(hier.size), [[] for _ in range(hier.size)], {}
    cyc = CycleOptions(opts.nrelax0, opts.nrelax, opts.cycle, opts.skip_first_down,
                       linear=linear)

    def rank_main(r):
        solver = MGRIT(hier, _RecordingExchange(hub, r, logs[r]), cyc)
        lo, hi = hier.ranges[0][r]
        template = torch.zeros(3, dtype=torch.float64)
        warm = None if cold else torch.full((hi - lo, 3), 0.5, dtype=torch.float64)
        u0 = torch.ones(3, dtype=torch.float64) if lo == 0 else None
        try:
            results[r] = solver.solve(_CountingPropagator(logs[r]), template, u0, warm,
                                      max_iter=max_iter, tol=tol)
        except Exception as exc:  # reported by the main thread
            results[r] = exc
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(hier.size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    errors = [v for v in results.values() if isinstance(v, Exception)]
    assert not errors and len(results) == hier.size, errors
    return [_merged(log) for log in logs], results[0]


SOLVER_CASES = [(cfg, size, cold, max_iter, tol)
                for cfg in CONFIGS for size in (1, 2, 5)
                for cold, max_iter, tol in ((True, 2, 0.0), (False, 3, 0.0),
                                            (True, 3, 1e30), (False, 2, 1e30))]


@pytest.mark.parametrize("cfg,size,cold,max_iter,tol", SOLVER_CASES, ids=str)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "adjoint"])
def test_schedule_replays_the_solver(cfg, size, cold, max_iter, tol, reverse):
    # the adjoint runs the linear solver on the mirrored hierarchy (LayerParallel)
    opts = MGRITOptions(**cfg)
    hier = hierarchy_for(23, opts, size)
    hier = hier.reversed() if reverse else hier
    logs, res = _run_solver(hier, opts, cold, max_iter, tol, linear=reverse)
    stopped = res.iterations < max_iter       # at a tolerance check, not out of cycles
    sched = solve_schedule(hier, opts, res.iterations, cold, stopped, linear=reverse)
    assert [_signature(ops) for ops in sched] == logs


# -- recorded from the solver itself ----------------------------------------------------------
def _counting_wrapper():
    """bench/counting.py's Counting (bench/ is not a package)."""
    path = Path(__file__).resolve().parents[2] / "bench" / "counting.py"
    spec = importlib.util.spec_from_file_location("bench_counting", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Counting


def _step_lengths(hier):
    """{level: fine steps per step} (uniform levels: N a multiple of every level's spacing)."""
    return {l: abs(lv.points[1] - lv.points[0]) for l, lv in enumerate(hier.levels)}


def test_recorded_steps_per_level_are_those_of_a_numeric_solve():
    # a real network on one rank, its propagators wrapped by bench's step counter: a cold
    # fixed forward solve of 3 cycles and a cold adjoint solve to tolerance
    from helpers import batch, dense_net
    from lptrain.mgrit.exchange import SerialExchange
    from lptrain.parallel.layer_parallel import LayerParallel
    Counting = _counting_wrapper()
    opts = MGRITOptions(levels=3, cfactor0=2, cfactor=2, nrelax0=0, nrelax=1, tol=0.0,
                        adj_tol=1e-9, adj_max_iter=40)
    net, theta = dense_net(layers=32, T=2.0)
    x, y = batch(net)
    lp = LayerParallel(net, opts, SerialExchange())
    counts = {}
    for name, solver in (("forward", lp.fwd), ("adjoint", lp.adj)):
        def counted(prop, *args, _solve=solver.solve, _name=name, **kw):
            counts[_name] = Counting(prop)
            return _solve(counts[_name], *args, **kw)
        solver.solve = counted
    res = lp.forward(theta, x, max_iter=3)
    _, ares = lp.backward(theta, x, res.states, lp.evaluate(theta, res.states, y, 16, True))
    assert res.iterations == 3 and ares.converged and 1 < ares.iterations < 40
    for name, hier, solved, linear in (("forward", lp.hier, res, False),
                                       ("adjoint", lp.rev, ares, True)):
        sched = solve_schedule(hier, opts, solved.iterations, cold=True,
                               converged=solved.converged, linear=linear)
        length = _step_lengths(hier)
        assert {length[l]: n for l, n in _per_level(sched).items()} == counts[name].steps, name


def test_a_one_step_interval_counts_on_the_level_that_steps_it():
    # N = 23, c = 2: the last interval of level 0 is one step, so level 1's last step is
    # the same pair of layers; FIRST on one rank: level 0 F 11 + C 12 + F 11 + C 12,
    # level 1 Φ^Δ 12 + serial 12
    hier = hierarchy_for(23, TINY, 1)
    assert _per_level(iteration_schedule(hier, TINY, FIRST)) == {0: 46, 1: 24}


def test_a_solve_of_no_cycles_is_the_residual_of_its_states():
    # nothing relaxed before it, so its C-steps are its own (4 C-points on N = 8)
    sched = solve_schedule(hierarchy_for(8, TINY, 1), TINY, 0)
    assert total_steps(sched) == 4 and isinstance(sched[0][-1], Allreduce)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_later_cycles_repeat_the_fresh_iteration(cfg):
    # iterations come from solves of 1 and 2 cycles; a solve of 4 is FIRST + 3 FRESH and
    # the closing residual (taken by the last F-relaxation with nrelax0 = 0)
    opts = MGRITOptions(**cfg)
    for size in (1, 3):
        hier = hierarchy_for(29, opts, size)
        closing = 0 if opts.nrelax0 == 0 else total_steps(solve_schedule(hier, opts, 0))
        first, fresh = (total_steps(iteration_schedule(hier, opts, w)) for w in (FIRST, FRESH))
        assert total_steps(solve_schedule(hier, opts, 4)) == first + 3 * fresh + closing


@pytest.fixture
def fresh_recordings():
    """Schedules recorded after the test's changes to the solver, and none kept after it."""
    schedule.clear_cache()
    yield
    schedule.clear_cache()


def test_a_change_to_the_solver_changes_the_schedule(monkeypatch, fresh_recordings):
    # were the coarsest solve done twice, every cycle would show it: 4 more level-1 steps
    # on N = 8 with c = 2, and twice its messages on 2 ranks
    hier = hierarchy_for(8, TINY, 2)
    before = iteration_schedule(hier, TINY, FRESH)
    coarse_solve = LevelOps.coarse_solve      # (FusedLevelOps calls it too)

    def twice(self, lv):
        coarse_solve(self, lv)
        coarse_solve(self, lv)
    monkeypatch.setattr(LevelOps, "coarse_solve", twice)
    schedule.clear_cache()
    after = iteration_schedule(hier, TINY, FRESH)
    assert _per_level(after)[1] == _per_level(before)[1] + 4
    assert _per_level(after)[0] == _per_level(before)[0]

    def level1_messages(sched):
        return sum(isinstance(op, (Send, Recv)) and op.level == 1 for ops in sched for op in ops)
    assert level1_messages(after) == level1_messages(before) + 2   # rank 0 → rank 1, again


# -- the discrete-event evaluation ---------------------------------------------------------
def test_message_arrives_after_latency_and_transfer():
    link = Link(latency=2.0, bandwidth=10.0)
    sched = [[Step(FORWARD, 3), Send(1, 50)], [Step(FORWARD, 1), Recv(0, 50), Step(FORWARD, 1)]]
    tl = simulate(sched, StepCosts(1.0, 1.0, 1.0), link)
    assert tl.finish == (3.0, 3.0 + 2.0 + 5.0 + 1.0)   # recv at 10, then one step
    assert tl.compute == (3.0, 2.0)


def test_allreduce_waits_for_all_and_costs_log_p_latencies():
    link = Link(latency=1.0, bandwidth=math.inf)
    sched = [[Step(FORWARD, k), Allreduce()] for k in (1, 4, 2)]
    tl = simulate(sched, StepCosts(1.0, 1.0, 1.0), link)
    assert tl.finish == (8.0, 8.0, 8.0)      # 4 + 2·1·ceil(log2 3)


def test_receive_without_send_is_reported():
    with pytest.raises(ScheduleError, match="rank 0 blocked"):
        simulate([[Recv(1, 8)], []], StepCosts(1.0, 1.0, 1.0), FREE_LINK)


def test_step_cost_splits_overhead_and_batch_share():
    # a call costs overhead + share·(t − overhead) per state, times the stacking ratio
    stack = ((FORWARD, ((2, 1.5), (8, 3.0))),)
    costs = StepCosts(forward=1.0, adjoint=0.5, weights=0.2, overhead=0.1,
                      overheads=((ADJOINT, 0.3),), stacking=stack)
    assert costs.time(Step(FORWARD, 4, calls=4, share=0.5)) == pytest.approx(4 * 0.55)
    assert costs.time(Step(ADJOINT, 2, calls=2, share=0.5)) == pytest.approx(2 * 0.4)
    # 4 states in one call: ratio halfway (in log m) between 1.5 at m = 2 and 3 at m = 8
    assert costs.time(Step(FORWARD, 4, calls=1)) == pytest.approx(4 * 2.25)
    assert costs.time(Step(FORWARD, 32, calls=2)) == pytest.approx(32 * 3.0)
    assert costs.per_step(LINEARIZE) == 1.0 and costs.per_step(WEIGHTS) == 0.2


def test_data_parallel_serial_splits_the_batch():
    # N = 10, batch 8 on 4 ranks: share 1/4; value: 10 forward calls, gradient: 10
    # adjoint calls + 10 weight products in one call; each state costs
    # 0.1 + 0.9 / 4 (overhead 0.1); the sums cost 2·ceil(log2 4)·(α + bytes/β) each
    costs = StepCosts(forward=1.0, adjoint=1.0, weights=1.0, overhead=0.1)
    m = predict.Machine(costs, Link(0.01, 1e4))
    w = modes.Workload(10, 8, 64, 100)
    value = 10 * (0.1 + 0.9 / 4) + 2 * 4 * (0.01 + 8 / 1e4)
    gradient = 20 * (0.1 + 0.9 / 4) + 4 * (0.01 + 100 / 1e4)
    assert predict.serial_time(4, w, m, trials=2) == pytest.approx(2 * value + gradient)


def test_predict_refuses_more_ranks_than_intervals():
    w = modes.Workload(30, 100, 800, 80)
    opts = MGRITOptions(levels=10, cfactor0=2, cfactor=2, min_coarse=10)
    assert max_ranks(30, opts) == 15
    ok, too_many = predict.predict_all([15, 16], w, opts, unit_machine())
    assert ok.possible and ok.simultaneous > 0 and not too_many.possible
    assert too_many.serial > 0


# -- the command -------------------------------------------------------------------------------
def test_command_writes_table_plot_and_compares_a_measured_run(tmp_path):
    import yaml

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
    out = tmp_path / "model"
    args = ["experiment=peaks_paper", "dataset.grid=32", "--step-time", "1e-3",
            "--adjoint-time", "1e-3", "--latency", "0", "--bandwidth", "1e30", "--ranks", "1,2,16",
            "--measured", str(run.parent), "--paper", "--out", str(out)]
    assert cli.main(args) == 0
    text = (out / "speedup_model.md").read_text()
    assert (out / "speedup_model.png").stat().st_size > 0
    # N = 30 with c = 2: 15 C-intervals, so P = 16 is refused
    assert "| 16 |" in text and "not possible (P > 15 C-intervals)" in text
    # serial on one rank: 30 forward + 30 adjoint steps + 30 weight products of 1 ms
    assert "speedups over serial on 1 rank (0.09 s)" in text
    assert "| serial | 1 | 0.18 | 0.09 | 0.50 |" in text
    assert "| serial 0.18 |" in text     # the measured column of the P = 1 row


def test_command_reports_a_bad_override(capsys):
    from lptrain.model_perf import cli
    assert cli.main(["network.layers=-3", "--step-time", "1", "--adjoint-time", "1"]) == 2
    assert "network.layers" in capsys.readouterr().err


def test_a_measured_run_resumed_on_another_rank_count_counts_its_latest_ranks(tmp_path):
    from lptrain.metrics import schema as ms
    from lptrain.metrics.writer import open_writer
    from lptrain.model_perf.runs import load_run
    path = tmp_path / ms.FILE_NAME
    attrs = {ms.MODE: "mgrit", ms.WORLD_SIZE: 2, ms.SEED: 0, ms.CONFIG: "seed: 0\n"}
    with open_writer(path, attrs, enabled=True) as writer:
        for k in (1, 2, 3):
            writer.log_train(iteration=k, step_time=1.0, ls_trials=1)
            writer.log_timing(k, [1.0] * 2, [0.0] * 2, [0.0] * 2)
    with open_writer(path, {**attrs, ms.WORLD_SIZE: 1}, True, 3) as writer:
        for k in (4, 5, 6):      # on one rank: the first of these is left out too
            writer.log_train(iteration=k, step_time=0.5 if k == 4 else 2.0, ls_trials=1)
            writer.log_timing(k, [1.0], [0.0], [0.0])
    run = load_run(path)
    assert (run.ranks, run.iteration_time) == (1, 2.0)
