"""Predicted against measured time per iteration: the speedup model on 1 and 2 ranks.

    .venv/bin/python bench/model_check.py [OVERRIDES ...] [--iterations K] [--reps R]
                                          [--out DIR] [--cpu-only]

First, in this process on one rank: the CPU time (this thread's, which other processes
on a shared machine do not inflate) of K real optimizer iterations of each mode (the
training oracle's value and gradient on the configured batch, as app.py builds it;
simultaneous at its fixed mgrit.fwd_iters / adj_iters), the median from the third on,
against the model's prediction for the same cycles per solve.  Then (unless --cpu-only)
runs `lptrain OVERRIDES mode=M train.iterations=K` for M in serial, mgrit, simultaneous
on 1 and 2 ranks (mgrit and simultaneous 2 × 1, serial 1 × 2), R times in turn (so a
change of load hits all alike), with OMP_NUM_THREADS=1; then predicts each run with
`lptrain-model`'s machinery (the kernels of its recorded iteration measured now, its own
trials and MGRIT cycles per solve) and prints one markdown row per mode and P: the
median over the reps of each run's iteration time (median step time, the first left
out), the same for the 10th percentile of its step times (the least loaded iterations),
the prediction and the ratios, and the load average around the runs.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"
MODES = ("serial", "mgrit", "simultaneous")


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def run(overrides, mode: str, ranks: int, iterations: int, out: Path) -> float:
    """One lptrain run into `out`; returns the 1-minute load average after it."""
    grid = f"parallel.layer_ranks={1 if mode == 'serial' else ranks}"
    cmd = [str(BIN / "mpiexec"), "-n", str(ranks), str(BIN / "lptrain"), *overrides,
           f"mode={mode}", grid, f"train.iterations={iterations}", "eval_every=100000",
           f"hydra.run.dir={out}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
    with open(out.with_suffix(".log"), "w") as log:
        subprocess.run(["timeout", "3000", *cmd], env=env, stdout=log, stderr=log,
                       check=True, cwd=ROOT)
    return load()


def step_quantile(path: Path, q: float) -> float:
    from lptrain.metrics import schema as s
    from lptrain.metrics.reader import read_metrics
    times = np.asarray(read_metrics(path / s.FILE_NAME).train[s.STEP_TIME])[1:]
    return float(np.quantile(times, q))


def cpu_check(overrides, iterations: int) -> list[tuple]:
    """[(mode, cycles, measured CPU seconds, predicted)] on one rank, in this process."""
    import dataclasses
    import time

    import torch

    from lptrain.data import load_dataset
    from lptrain.mgrit.exchange import SerialExchange
    from lptrain.model_perf import cli, record
    from lptrain.model_perf.predict import Counts
    from lptrain.parallel.context import keep_freed_memory
    from lptrain.parallel.grid import Grid
    torch.set_num_threads(1)
    keep_freed_memory()
    args = cli.parser().parse_args([*overrides, "--fresh"])
    opts, _ = cli.compose(overrides)
    net, theta, batch = cli.build_network(opts)
    data = load_dataset(opts.dataset, opts.seed)
    x, y = data.x_train[:batch].to(theta.dtype), data.y_train[:batch]
    model = cli.make_model(opts, net, theta, batch)
    rows = []
    for mode in MODES:
        mgrit = dataclasses.replace(opts.mgrit, control="fixed", adaptive=False)
        oracle = record.iteration_oracle(net, mode, mgrit, SerialExchange())
        cpu = []
        for k in range(iterations):
            t0 = time.thread_time()
            ev = record.value_of(oracle, theta * (1 + 0.01 * k), x, y)
            record.gradient_of(oracle, ev)
            cpu.append(time.thread_time() - t0)
        stats = oracle.record() or {}
        cycles = (stats.get("fwd_iterations", 1), stats.get("adj_iterations", 1))

        def predict(m, mode=mode, cycles=cycles):
            return model.grid_time(Grid(1, 1), mode, m, Counts(), cycles)
        m, _ = cli.machine(args, model, theta, opts.device, cli.measure.DEFAULT_LINK, predict)
        rows.append((mode, cycles, statistics.median(cpu[2:]), predict(m)))
    return rows


def predictions(overrides, dirs) -> tuple[dict, str]:
    """{run dir: (measured iteration time, predicted)} and the model's cost note."""
    from lptrain.model_perf import cli
    from lptrain.model_perf.runs import load_run, predict_run
    args = cli.parser().parse_args([*overrides, "--fresh"])
    link, _, _ = cli.link(args)
    opts, _ = cli.compose(overrides)
    net, theta, batch = cli.build_network(opts)
    model = cli.make_model(opts, net, theta, batch)
    runs = {d: load_run(d / "metrics.h5") for d in dirs}
    m, note = cli.machine(args, model, theta, opts.device, link,
                          lambda probe: [predict_run(r, model, probe) for r in runs.values()])
    return {d: (r.iteration_time, predict_run(r, model, m)[0]) for d, r in runs.items()}, note


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("model_check"))
    p.add_argument("--cpu-only", action="store_true", help="only the one-rank CPU check")
    a = p.parse_args()
    label = " ".join(a.overrides) or "default"
    before = load()
    rows = cpu_check(a.overrides, a.iterations)
    print(f"one rank, CPU time; load average (1 min) {before:.1f} before, {load():.1f} after")
    print("| configuration | mode | cycles fwd + adj | measured CPU [s] | predicted [s] "
          "| predicted / measured |")
    print("|---|---|---|---:|---:|---:|")
    for mode, (kf, ka), cpu, pred in rows:
        cyc = "-" if mode == "serial" else f"{kf} + {ka}"
        print(f"| {label} | {mode} | {cyc} | {cpu:.4g} | {pred:.4g} | {pred / cpu:.2f} |")
    if a.cpu_only:
        return 0
    loads, dirs = [load()], {}
    for rep in range(a.reps):
        for mode in MODES:
            for ranks in (1, 2):
                d = a.out / f"{mode}_{ranks}_{rep}"
                d.parent.mkdir(parents=True, exist_ok=True)
                loads.append(run(a.overrides, mode, ranks, a.iterations, d))
                dirs.setdefault((mode, ranks), []).append(d)
    loads.append(load())
    preds, note = predictions(a.overrides, [d for ds in dirs.values() for d in ds])
    loads.append(load())
    print(f"costs: {note}; load average (1 min) {min(loads):.1f}–{max(loads):.1f}, "
          f"median {statistics.median(loads):.1f}")
    print("| configuration | mode | P | measured [s] | p10 [s] | predicted [s] "
          "| predicted / measured | predicted / p10 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (mode, ranks), ds in dirs.items():
        med = statistics.median(preds[d][0] for d in ds)
        p10 = statistics.median(step_quantile(d, 0.1) for d in ds)
        pred = statistics.median(preds[d][1] for d in ds)
        print(f"| {label} | {mode} | {ranks} | {med:.4g} | {p10:.4g} | {pred:.4g} "
              f"| {pred / med:.2f} | {pred / p10:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
