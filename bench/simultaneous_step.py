"""Cost of one simultaneous (one-shot) optimizer step against one serial step.

    .venv/bin/python bench/simultaneous_step.py [--layers 1024] [--batch 5000] [--reps 9]
        [--fwd-iters 2] [--adj-iters 2] [--level-ops fused|plain]
        [--coarse-weights average|inject]

Serial step: exact forward + backward + L-BFGS update.  Simultaneous step:
mgrit.fwd_iters forward and mgrit.adj_iters adjoint MGRIT iterations (the
defaults; 3 levels, cfactor 4, F-relaxation on the finest level, FCF on the
coarse ones), warm-started, + the same update.  Prints the ratio, the count of
steps the schedule performs, and where the time goes.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from common import data, network, save
from counting import Counting
from lptrain.config.schema import LBFGSOptions
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.options import COARSE_WEIGHTS, LEVEL_OPS, MGRITOptions
from lptrain.train.optimizers import LBFGS
from lptrain.train.oneshot import SimultaneousOracle
from lptrain.train.oracles import Batch, SerialOracle


def run_steps(oracles, theta, x, y, reps):
    """Median seconds per line-search trial of an L-BFGS step, for each oracle.

    The oracles take turns step by step, so that drifts of the machine (a
    shared host's memory bandwidth varies by 10-20 % over minutes) reach both
    alike.
    """
    state = []
    for oracle in oracles:
        opt = LBFGS(LBFGSOptions())
        oracle.begin(Batch(x, y))
        th, _ = opt.step(theta, oracle)          # warm-up (and first warm start)
        state.append([opt, th])
    times = [[] for _ in oracles]
    for _ in range(reps):
        for k, oracle in enumerate(oracles):
            opt, th = state[k]
            oracle.begin(Batch(x, y))
            t0 = time.perf_counter()
            state[k][1], info = opt.step(th, oracle)
            times[k].append((time.perf_counter() - t0) / max(info.ls_trials, 1))
    return [statistics.median(t) for t in times]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=1024)
    p.add_argument("--batch", type=int, default=5000)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--fwd-iters", type=int, default=MGRITOptions.fwd_iters)
    p.add_argument("--adj-iters", type=int, default=MGRITOptions.adj_iters)
    p.add_argument("--level-ops", default=MGRITOptions.level_ops, choices=LEVEL_OPS)
    p.add_argument("--coarse-weights", default=MGRITOptions.coarse_weights,
                   choices=COARSE_WEIGHTS)
    a = p.parse_args()
    net, theta = network(a.layers)
    x, y = data(a.batch)
    mgrit_opts = MGRITOptions(levels=3, cfactor0=4, cfactor=4, nrelax0=0, nrelax=1,
                              fwd_iters=a.fwd_iters, adj_iters=a.adj_iters,
                              level_ops=a.level_ops, coarse_weights=a.coarse_weights,
                              control="fixed")   # the cost of the given iterations
    sim = SimultaneousOracle(net, SerialExchange(), mgrit_opts)
    serial, simul = run_steps([SerialOracle(net, SerialExchange()), sim], theta, x, y, a.reps)
    # the breakdown of one evaluation (one forward and one adjoint solve), over reps of them
    for solver in (sim.lp.fwd, sim.lp.adj):
        solver.timers.clear()
    t0 = time.perf_counter()
    for _ in range(a.reps):
        sim.begin(Batch(x, y))
        sim.value(theta)
        sim.gradient()
    evaluation = (time.perf_counter() - t0) / a.reps
    timers = {f"{kind} level {lvl} ({which})": t / a.reps
              for which, solver in (("forward", sim.lp.fwd), ("adjoint", sim.lp.adj))
              for (lvl, kind), t in sorted(solver.timers.items())}
    timers["rest of the evaluation (gradient assembly, loss, ...)"] = \
        evaluation - sum(timers.values())
    # the schedule's own count of steps, from the solver itself
    counts = {}
    for which in ("forward", "adjoint"):
        solver = sim.lp.fwd if which == "forward" else sim.lp.adj
        orig = solver.solve

        def counted(prop, *args, _orig=orig, _which=which, **kw):
            c = Counting(prop)
            counts[_which] = c
            return _orig(c, *args, **kw)
        solver.solve = counted
    sim.begin(Batch(x, y))
    sim.value(theta)
    sim.gradient()
    fine = {k: {length: n for length, n in c.steps.items()} for k, c in counts.items()}
    steps = {k: c.total() / a.layers for k, c in counts.items()}
    ratio = simul / serial
    print(f"N={a.layers}: serial step {serial:.3f} s, simultaneous step {simul:.3f} s, "
          f"ratio {ratio:.2f}")
    print(f"schedule: forward {steps['forward']:.2f} N steps, adjoint "
          f"{steps['adjoint']:.2f} N steps")
    print(f"one evaluation (value + gradient) {evaluation:.3f} s:")
    for k, t in timers.items():
        print(f"  {k:36s} {t:.3f} s")
    save(f"simultaneous_step_N{a.layers}", {"layers": a.layers, "batch": a.batch,
                                            "serial_s": serial, "simultaneous_s": simul,
                                            "ratio": ratio, "evaluation_s": evaluation,
                                            "steps_per_N": steps,
                                            "steps_by_length": fine, "breakdown_s": timers})


if __name__ == "__main__":
    main()
