"""Cost of one simultaneous (one-shot) optimizer step against one serial step.

    .venv/bin/python bench/simultaneous_step.py [--layers 1024] [--batch 5000] [--reps 9]
        [--fwd-iters 2] [--adj-iters 2] [--level-ops fused|plain]
        [--coarse-weights average|inject]
    .venv/bin/python bench/simultaneous_step.py --config default peaks_deep ... [--reps 5]

Serial step: exact forward + backward + L-BFGS update.  Simultaneous step:
mgrit.fwd_iters forward and mgrit.adj_iters adjoint MGRIT iterations (the
defaults; 3 levels, cfactor 4, F-relaxation on the finest level, FCF on the
coarse ones), warm-started, + the same update.  Prints the ratio, the count of
steps the schedule performs, and where the time goes.

With --config the network, data (its first mini-batch, or all of it), θ₀, MGRIT
options and optimizer are those lptrain builds for a named configuration (CONFIGS:
the default run, experiment=peaks_deep, the three *_paper experiments, dataset=mnist's
recipe), with mgrit.control=fixed (the cost of the given iterations, no calibration).
Wall and CPU seconds are medians over the alternating steps.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch

from common import Counting, data, network, save
from lptrain.config.schema import LBFGSOptions
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.options import COARSE_WEIGHTS, LEVEL_OPS, MGRITOptions
from lptrain.train.optimizers import LBFGS, OPTIMIZERS
from lptrain.train.objective import Objective
from lptrain.train.oneshot import SimultaneousOracle
from lptrain.train.oracles import Batch, SerialOracle


# named configurations of --config: lptrain overrides (mnist_paper on 500 images: its
# full batch of 5000 float64 images would take minutes per step)
CONFIGS = {
    "default": [],
    "peaks_deep": ["experiment=peaks_deep"],
    "peaks_paper": ["experiment=peaks_paper"],
    "indian_pines_paper": ["experiment=indian_pines_paper"],
    "mnist_paper": ["experiment=mnist_paper", "dataset.n_train=500", "dataset.n_val=100"],
    "mnist": ["dataset=mnist"],
}


def run_steps(oracles, theta, x, y, reps, make_opt=lambda: LBFGS(LBFGSOptions()), cpu=None):
    """Median seconds per line-search trial of an optimizer step, for each oracle.

    The oracles take turns step by step, so that drifts of the machine (a
    shared host's memory bandwidth varies by 10-20 % over minutes) reach both
    alike.  `cpu`, a list, receives the median CPU seconds of each oracle.
    """
    state = []
    for oracle in oracles:
        opt = make_opt()
        oracle.begin(Batch(x, y))
        th, _ = opt.step(theta, oracle)          # warm-up (and first warm start)
        state.append([opt, th])
    times, cpus = [[] for _ in oracles], [[] for _ in oracles]
    for _ in range(reps):
        for k, oracle in enumerate(oracles):
            opt, th = state[k]
            oracle.begin(Batch(x, y))
            t0, c0 = time.perf_counter(), time.process_time()
            state[k][1], info = opt.step(th, oracle)
            trials = max(info.ls_trials, 1)
            times[k].append((time.perf_counter() - t0) / trials)
            cpus[k].append((time.process_time() - c0) / trials)
    if cpu is not None:
        cpu[:] = [statistics.median(c) for c in cpus]
    return [statistics.median(t) for t in times]


def configured(name: str, fwd_iters: int | None, adj_iters: int | None):
    """(net, θ₀, x, y, MGRIT options, optimizer factory) lptrain builds for CONFIGS[name]."""
    from lptrain.app import build
    from lptrain.config import compose
    opts, _ = compose(["mode=simultaneous", *CONFIGS[name]])
    _, data, net, theta, _, _ = build(opts, None)
    n = opts.train.batch_size or data.x_train.shape[0]
    mgrit = dataclasses.replace(opts.mgrit, control="fixed", calibrate_every=0,
                                fwd_iters=fwd_iters or opts.mgrit.fwd_iters,
                                adj_iters=adj_iters or opts.mgrit.adj_iters)

    def make_opt():
        return OPTIMIZERS[opts.optimizer.name](opts.optimizer, total=opts.train.iterations)
    return net, theta, data.x_train[:n], data.y_train[:n], mgrit, make_opt


def compare(name: str, a) -> dict:
    """One configuration's serial and simultaneous step, alternating, and the count."""
    net, theta, x, y, mgrit, make_opt = configured(name, a.fwd_iters, a.adj_iters)
    sim = SimultaneousOracle(net, SerialExchange(), mgrit)
    cpu = []
    serial, simul = run_steps([Objective(SerialOracle(net, SerialExchange()), net),
                               Objective(sim, net)], theta, x, y, a.reps, make_opt, cpu)
    steps, _ = count_steps(sim, theta, x, y, net.opts.layers)
    row = {"config": name, "layers": net.opts.layers, "batch": x.shape[0],
           "dtype": str(theta.dtype).split(".")[-1], "fwd_iters": mgrit.fwd_iters,
           "adj_iters": mgrit.adj_iters, "serial_s": serial, "simultaneous_s": simul,
           "ratio": simul / serial, "serial_cpu_s": cpu[0], "simultaneous_cpu_s": cpu[1],
           "cpu_ratio": cpu[1] / cpu[0], "steps_per_N": steps,
           "load": os.getloadavg()[0]}
    print(f"{name} (N={row['layers']}, batch {row['batch']}, {row['dtype']}, "
          f"{mgrit.fwd_iters}+{mgrit.adj_iters}): serial {serial:.3f} s "
          f"({cpu[0]:.3f} CPU s), simultaneous {simul:.3f} s ({cpu[1]:.3f} CPU s), ratio "
          f"{row['ratio']:.2f} (CPU {row['cpu_ratio']:.2f}); steps forward "
          f"{steps['forward']:.2f} N + adjoint {steps['adjoint']:.2f} N; load "
          f"{row['load']:.1f}", flush=True)
    return row


def count_steps(sim, theta, x, y, layers: int):
    """Steps per N of one evaluation (forward, adjoint), from the solvers themselves,
    and the same by step length (1 = a finest-level step)."""
    counts = {}
    originals = {}
    for which, solver in (("forward", sim.lp.fwd), ("adjoint", sim.lp.adj)):
        orig = originals[which] = solver.solve

        def counted(prop, *args, _orig=orig, _which=which, **kw):
            c = Counting(prop)
            counts[_which] = c
            return _orig(c, *args, **kw)
        solver.solve = counted
    sim.begin(Batch(x, y))
    sim.gradient(sim.value(theta))
    sim.lp.fwd.solve, sim.lp.adj.solve = originals["forward"], originals["adjoint"]
    fine = {k: {length: n for length, n in c.steps.items()} for k, c in counts.items()}
    return {k: c.total() / layers for k, c in counts.items()}, fine


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=1024)
    p.add_argument("--batch", type=int, default=5000)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--fwd-iters", type=int, help=f"default: the configuration's, else "
                   f"{MGRITOptions.fwd_iters}")
    p.add_argument("--adj-iters", type=int, help=f"default: the configuration's, else "
                   f"{MGRITOptions.adj_iters}")
    p.add_argument("--level-ops", default=MGRITOptions.level_ops, choices=LEVEL_OPS)
    p.add_argument("--coarse-weights", default=MGRITOptions.coarse_weights,
                   choices=COARSE_WEIGHTS)
    p.add_argument("--config", nargs="+", choices=sorted(CONFIGS),
                   help="lptrain's own configurations instead of the benchmark network")
    a = p.parse_args()
    if a.config:
        rows = [compare(name, a) for name in a.config]
        save("simultaneous_step_configs", {"rows": rows})
        return
    net, theta = network(a.layers)
    x, y = data(a.batch)
    mgrit_opts = MGRITOptions(levels=3, cfactor0=4, cfactor=4, nrelax0=0, nrelax=1,
                              fwd_iters=a.fwd_iters or MGRITOptions.fwd_iters,
                              adj_iters=a.adj_iters or MGRITOptions.adj_iters,
                              level_ops=a.level_ops, coarse_weights=a.coarse_weights,
                              control="fixed")   # the cost of the given iterations
    sim = SimultaneousOracle(net, SerialExchange(), mgrit_opts)
    serial, simul = run_steps([Objective(SerialOracle(net, SerialExchange()), net),
                               Objective(sim, net)], theta, x, y, a.reps)
    # the breakdown of one evaluation (one forward and one adjoint solve), over reps of them
    for solver in (sim.lp.fwd, sim.lp.adj):
        solver.timers.clear()
    t0 = time.perf_counter()
    for _ in range(a.reps):
        sim.begin(Batch(x, y))
        sim.gradient(sim.value(theta))
    evaluation = (time.perf_counter() - t0) / a.reps
    timers = {f"{kind} level {lvl} ({which})": t / a.reps
              for which, solver in (("forward", sim.lp.fwd), ("adjoint", sim.lp.adj))
              for (lvl, kind), t in sorted(solver.timers.items())}
    timers["rest of the evaluation (gradient assembly, loss, ...)"] = \
        evaluation - sum(timers.values())
    # the schedule's own count of steps, from the solver itself
    steps, fine = count_steps(sim, theta, x, y, a.layers)
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
