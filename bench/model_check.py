"""Predicted against measured time per iteration: the speedup model on 1 and 2 ranks.

    .venv/bin/python bench/model_check.py [OVERRIDES ...] [--iterations K] [--reps R]
                                          [--out DIR] [--cpu-only] [--one-rank]

First, in this process on one rank: the CPU time (this thread's, which other processes
on a shared machine do not inflate) of K real optimizer iterations of each mode (the
training oracle's value and gradient on the configured batch, as app.py builds it;
simultaneous at its fixed mgrit.fwd_iters / adj_iters), the median from the third on,
against the model's prediction for the same cycles per solve.  Then (unless --cpu-only)
runs `lptrain OVERRIDES mode=M train.iterations=K` for M in serial, mgrit, simultaneous
on 1 and 2 ranks (mgrit and simultaneous 2 × 1, serial 1 × 2), R times in turn (so a
change of load hits all alike), with OMP_NUM_THREADS=1; then predicts each run with
`lptrain-model`'s machinery (the kernels of its recorded iteration measured now, alone
and beside a copy per further core, and predicted both ways; each
iteration from its own trials and MGRIT cycles per solve, the median of those) and
prints one markdown row per mode and P: the median over the reps of each run's
iteration time (median step time, the first left out), the same for the 10th
percentile of its step times (the least loaded iterations), the prediction and the
ratios, and the load average around the runs.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
from common import mpi_env

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
    env = mpi_env(ranks)
    with open(out.with_suffix(".log"), "w") as log:
        subprocess.run(["timeout", "3000", *cmd], env=env, stdout=log, stderr=log,
                       check=True, cwd=ROOT)
    return load()


def step_quantile(path: Path, q: float) -> float:
    from lptrain.metrics import schema as s
    from lptrain.metrics.reader import read_metrics
    times = np.asarray(read_metrics(path / s.FILE_NAME).train[s.STEP_TIME])[1:]
    return float(np.quantile(times, q))


def _problem(overrides, flags):
    """The model's CLI arguments, options, network, θ, the first batch and the model."""
    from lptrain.data import load_dataset
    from lptrain.model_perf import cli, options
    args = options.parser().parse_args([*overrides, *flags])
    opts, _ = cli.compose(overrides)
    net, theta, batch = cli.build_network(opts)
    data = load_dataset(opts.dataset, opts.seed)
    x, y = data.x_train[:batch].to(theta.dtype), data.y_train[:batch]
    return args, opts, net, theta, x, y, cli.make_model(opts, net, theta, batch)


def cpu_check(overrides, iterations: int) -> list[tuple]:
    """[(mode, cycles, measured CPU seconds, predicted)] on one rank, in this process."""
    import dataclasses
    import time

    import torch

    from lptrain.mgrit.exchange import SerialExchange
    from lptrain.model_perf import cli, record
    from lptrain.model_perf.predict import Counts
    from lptrain.parallel.context import keep_freed_memory
    from lptrain.parallel.grid import Grid
    torch.set_num_threads(1)
    keep_freed_memory()
    args, opts, net, theta, x, y, model = _problem(overrides, ["--fresh"])
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


class _Hub:
    """Mailboxes and sums shared by in-process ranks (one thread each)."""

    def __init__(self, size: int):
        import queue
        import threading
        self.size = size
        self.boxes = {(a, b): queue.Queue() for a in range(size) for b in range(size)}
        self.barrier = threading.Barrier(size, timeout=3000)
        self.values: list = [None] * size


class _ThreadExchange:
    """An exchange between the threads of a _Hub (blocking waits use no CPU)."""

    def __init__(self, hub: _Hub, rank: int, mirror: bool = False):
        self.hub, self.size, self.mirror, self.phys = hub, hub.size, mirror, rank
        self.rank = self._map(rank)

    def _map(self, r: int) -> int:
        return self.size - 1 - r if self.mirror else r

    def reversed(self):
        return _ThreadExchange(self.hub, self.phys, not self.mirror)

    def send(self, tensor, dest):
        self.hub.boxes[(self.phys, self._map(dest))].put(tensor.detach().clone())

    def recv(self, template, source):
        return self.hub.boxes[(self._map(source), self.phys)].get(timeout=3000)

    def wait(self):
        pass

    def _sum(self, value):
        self.hub.values[self.phys] = value
        self.hub.barrier.wait()
        total = sum(self.hub.values[1:], self.hub.values[0])
        self.hub.barrier.wait()
        return total

    def allreduce_sum(self, value):
        return float(self._sum(float(value)))

    def allreduce_sums(self, values):
        import numpy as np
        return self._sum(np.array(values, dtype=float)).tolist()

    def allreduce_tensor(self, tensor):
        return self._sum(tensor.clone())


def two_rank_check(overrides, iterations: int) -> list[tuple]:
    """[(mode, cycles, per-rank CPU seconds measured, per-rank predicted)] of 2 ranks
    run as threads of this process (mgrit and simultaneous 2 × 1, serial 1 × 2)."""
    import dataclasses
    import threading
    import time

    import torch

    from lptrain.mgrit.exchange import SerialExchange
    from lptrain.model_perf import cli, record
    from lptrain.parallel.grid import Grid, shard
    args, opts, net, theta, x, y, model = _problem(overrides, [])
    rows = []
    for mode in MODES:
        mgrit = dataclasses.replace(opts.mgrit, control="fixed", adaptive=False)
        hub, cpu, cycles = _Hub(2), [[], []], [None, None]

        def rank(r):
            torch.set_num_threads(1)
            ex = _ThreadExchange(hub, r)
            if mode == "serial":
                lo, hi = shard(x.shape[0], 2, r)
                oracle = record.iteration_oracle(net, mode, mgrit, SerialExchange(), ex)
                xs, ys = x[lo:hi], y[lo:hi]
            else:
                oracle, xs, ys = record.iteration_oracle(net, mode, mgrit, ex), x, y
            for k in range(iterations):
                t0 = time.thread_time()
                ev = record.value_of(oracle, theta * (1 + 0.01 * k), xs, ys)
                record.gradient_of(oracle, ev)
                cpu[r].append(time.thread_time() - t0)
            stats = oracle.record() or {}
            cycles[r] = (stats.get("fwd_iterations", 1), stats.get("adj_iterations", 1))
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        grid = Grid(1, 2) if mode == "serial" else Grid(2, 1)

        def predict(m, mode=mode, grid=grid, c=cycles[0]):
            return model.busy(mode, grid, m, *c)
        m, _ = cli.machine(args, model, theta, opts.device, cli.measure.DEFAULT_LINK, predict)
        measured = [statistics.median(c[2:]) for c in cpu]
        if mode == "serial":       # one layer group recorded: both ranks alike
            rows.append((mode, cycles[0], measured, predict(m) * 2))
        else:
            rows.append((mode, cycles[0], measured, predict(m)))
    return rows


def predictions(overrides, dirs) -> tuple[dict, str]:
    """{run dir: (measured iteration time, predicted, predicted with every cost measured
    alone)} and the model's cost note (costs measured now, alone and beside as many
    neighbours as this host has cores, as lptrain-model measures them)."""
    from lptrain.model_perf import cli, options
    from lptrain.model_perf.runs import load_run, predict_run
    args = options.parser().parse_args([*overrides, "--fresh"])
    link, _, _ = cli.link(args)
    opts, _ = cli.compose(overrides)
    net, theta, batch = cli.build_network(opts)
    model = cli.make_model(opts, net, theta, batch)
    runs = {d: load_run(d / "metrics.h5") for d in dirs}
    m, note = cli.machine(args, model, theta, opts.device, link,
                          lambda probe: [predict_run(r, model, probe) for r in runs.values()])
    m, optimizer_note = cli.with_optimizer(args, opts, m, theta)
    alone = m.on_host(1)
    note = f"{note}; {optimizer_note}"
    return {d: (r.iteration_time, predict_run(r, model, m)[0], predict_run(r, model, alone)[0])
            for d, r in runs.items()}, note


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("model_check"))
    p.add_argument("--cpu-only", action="store_true", help="only the CPU-time checks")
    p.add_argument("--one-rank", action="store_true", help="only the one-rank CPU check")
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
    if a.one_rank:
        return 0
    print("\ntwo ranks as threads of this process, CPU time of each rank")
    print("| configuration | mode | cycles fwd + adj | measured CPU rank 0, 1 [s] "
          "| predicted rank 0, 1 [s] | predicted / measured |")
    print("|---|---|---|---:|---:|---:|")
    for mode, (kf, ka), cpu, pred in two_rank_check(a.overrides, a.iterations):
        cyc = "-" if mode == "serial" else f"{kf} + {ka}"
        ratio = ", ".join(f"{p / c:.2f}" for p, c in zip(pred, cpu))
        print(f"| {label} | {mode} | {cyc} | {cpu[0]:.4g}, {cpu[1]:.4g} "
              f"| {pred[0]:.4g}, {pred[1]:.4g} | {ratio} |")
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
          "| predicted / measured | predicted / p10 | costs alone: predicted / measured |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (mode, ranks), ds in dirs.items():
        med = statistics.median(preds[d][0] for d in ds)
        p10 = statistics.median(step_quantile(d, 0.1) for d in ds)
        pred = statistics.median(preds[d][1] for d in ds)
        alone = statistics.median(preds[d][2] for d in ds)
        print(f"| {label} | {mode} | {ranks} | {med:.4g} | {p10:.4g} | {pred:.4g} "
              f"| {pred / med:.2f} | {pred / p10:.2f} | {alone / med:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
