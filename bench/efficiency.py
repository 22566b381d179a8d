"""Parallel efficiency on P ranks against 1: an MGRIT forward iteration, a one-shot training
step and a data-parallel serial step, in wall and CPU seconds.

    .venv/bin/python bench/efficiency.py [--config default peaks_deep] [--ranks 2]
        [--rounds 5] [--reps 5] [--per-layer-weights]

The driver launches `mpiexec -n 1` and `mpiexec -n P` of this script in turn, --rounds
times (the order flips every round, so that a change of the shared machine's load reaches
both alike). Each launch builds what lptrain builds for a configuration
(bench/simultaneous_step.py's CONFIGS, mgrit.control=fixed), times --reps of each
quantity after one untimed run, the quantities taking turns, and prints one JSON line.

    forward iteration   one MGRIT iteration of a forward solve (resumed, so no set-up)
    one-shot step       value + gradient of mode=simultaneous (fwd_iters + adj_iters)
    serial step         value + gradient of mode=serial, the batch split over the ranks

Efficiency = t_1 / (P · t_P) from the medians over the rounds: wall seconds (barrier to
barrier), CPU seconds (the sum over the ranks) and compute CPU seconds (the same less the
CPU time inside MPI calls, where MPICH spins while it waits). On a machine shared with
other jobs the wall efficiency mostly says how often a rank waited for a descheduled
partner; the compute efficiency says how much work the split adds (per-call costs that
do not shrink with a shard, recomputed steps). Per rank the exchange's clock gives the
wall seconds in communication calls and in waiting for messages.

The driver also times, in its own process, the serial step on the whole batch and on a
P-th of it (shard efficiency t(B) / (P · t(B/P)), CPU seconds, alternating): the
data-parallel step's efficiency without MPI, the other ranks' load or shared caches,
with the dense adjoint's weight products batched and per layer. --per-layer-weights takes the dense serial adjoint's weight
products layer by layer, as before they were batched (model/serial.py), for an A/B.
Results go to bench/results/efficiency[-per-layer].json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import mpi_env, save

HERE = Path(__file__).resolve()
MPIEXEC = Path(sys.executable).parent / "mpiexec"
QUANTITIES = ("forward iteration", "one-shot step", "serial step")


# -- one launch (under mpiexec) ---------------------------------------------------------
def measure(name: str, reps: int, per_layer: bool = False) -> dict | None:
    """This launch's medians of every quantity; the row on rank 0, None elsewhere."""
    from simultaneous_step import configured
    from lptrain.model.steps import DenseSteps
    DenseSteps.WEIGHTS_AFTER_SWEEP = not per_layer
    from lptrain.parallel.context import make_exchange, world
    from lptrain.parallel.layer_parallel import LayerParallel
    from lptrain.train.objective import Objective
    from lptrain.train.oneshot import SimultaneousOracle
    from lptrain.train.oracles import Batch, SerialOracle
    comm = world()
    mpi_cpu = MPICpu()
    exchange = make_exchange(mpi_cpu.wrap(comm))
    net, theta, x, y, mgrit, _ = configured(name, None, None)
    lp = LayerParallel(net, mgrit, exchange)
    lp.forward(theta, x, max_iter=2, tol=0.0)
    oneshot = Objective(SimultaneousOracle(net, exchange, mgrit), net)
    serial = Objective(SerialOracle(net, exchange), net)

    def step(oracle):
        oracle.begin(Batch(x, y))
        ev = oracle.value(theta)
        oracle.gradient(ev)
        oracle.accept(ev)
    runs = {"forward iteration": lambda: lp.forward(theta, x, max_iter=1, tol=0.0,
                                                    resume=True),
            "one-shot step": lambda: step(oneshot), "serial step": lambda: step(serial)}
    samples = {q: [] for q in QUANTITIES}
    for rep in range(reps + 1):
        for q in QUANTITIES:
            row = _timed(comm, exchange.clock, mpi_cpu, runs[q])
            if rep:                       # the first run allocates buffers and pages
                samples[q].append(row)
    rows = comm.gather(samples, root=0)
    if comm.Get_rank() != 0:
        return None
    out = {"config": name, "ranks": comm.Get_size(), "layers": net.opts.layers,
           "batch": x.shape[0], "levels": mgrit.levels, "fwd_iters": mgrit.fwd_iters,
           "adj_iters": mgrit.adj_iters, "threads": _threads()}
    for q in QUANTITIES:
        med = {key: [statistics.median(s[key] for s in rank[q]) for rank in rows]
               for key in ("cpu", "mpi_cpu", "comm", "wait")}
        out[q] = {"wall": statistics.median(s["wall"] for s in rows[0][q]), **med}
    return out


def _timed(comm, clock, mpi_cpu, fn) -> dict:
    """Wall seconds of fn() between barriers; this rank's CPU seconds (read before the
    closing barrier: its spinning is not fn's), those inside MPI calls, and the clock's
    communication and waiting seconds."""
    comm.Barrier()
    c0, w0, m0 = clock.comm, clock.wait, mpi_cpu.seconds
    t0, p0 = time.perf_counter(), time.process_time()
    fn()
    cpu = time.process_time() - p0
    comm.Barrier()
    return {"wall": time.perf_counter() - t0, "cpu": cpu, "mpi_cpu": mpi_cpu.seconds - m0,
            "comm": clock.comm - c0, "wait": clock.wait - w0}


class MPICpu:
    """CPU seconds this process spends inside MPI calls: those of a wrapped communicator
    and MPI.Request.Waitall (which the exchange looks up at every wait)."""

    def __init__(self):
        from mpi4py import MPI
        self.seconds = 0.0
        counted = self._counted(MPI.Request.Waitall)

        class Request:
            Waitall = staticmethod(counted)
        MPI.Request = Request

    def _counted(self, fn):
        def call(*args, **kw):
            p0 = time.process_time()
            try:
                return fn(*args, **kw)
            finally:
                self.seconds += time.process_time() - p0
        return call

    def wrap(self, comm):
        """`comm` with every method call's CPU time counted."""
        owner = self

        class Counted:
            def __getattr__(self, name):
                attr = getattr(comm, name)
                return owner._counted(attr) if callable(attr) else attr
        return Counted()


def _threads() -> int:
    import torch
    return torch.get_num_threads()


# -- the driver --------------------------------------------------------------------------
def launch(ranks: int, name: str, reps: int, timeout: int, extra: list) -> dict:
    """One `mpiexec -n ranks` launch of this script's worker; its JSON row and the load."""
    env = mpi_env(ranks)
    cmd = ["timeout", str(timeout), str(MPIEXEC), "-n", str(ranks), sys.executable,
           str(HERE), "--worker", name, "--reps", str(reps), *extra]
    load0 = os.getloadavg()[0]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"efficiency: {' '.join(cmd)} failed ({done.returncode}): "
                 f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["load"] = (load0 + os.getloadavg()[0]) / 2
    return row


def shard_efficiency(name: str, ranks: int, reps: int) -> dict:
    """The serial step's CPU seconds on the batch and on its first shard of `ranks`, in
    this process, alternating, for the batched and the per-layer weight products."""
    from simultaneous_step import configured
    from lptrain.mgrit.exchange import SerialExchange
    from lptrain.model.steps import DenseSteps
    from lptrain.parallel.grid import shard
    from lptrain.train.objective import Objective
    from lptrain.train.oracles import Batch, SerialOracle
    net, theta, x, y, _, _ = configured(name, None, None)
    hi = shard(x.shape[0], ranks, 0)[1]
    parts = {"batch": (x, y), "shard": (x[:hi], y[:hi])}
    oracles = {k: Objective(SerialOracle(net, SerialExchange()), net) for k in parts}
    cpu = {(k, v): [] for k in parts for v in (True, False)}
    for rep in range(reps + 1):
        for batched in (True, False):
            DenseSteps.WEIGHTS_AFTER_SWEEP = batched
            for k, (xs, ys) in parts.items():
                o = oracles[k]
                p0 = time.process_time()
                o.begin(Batch(xs, ys))
                ev = o.value(theta)
                o.gradient(ev)
                o.accept(ev)
                if rep:
                    cpu[(k, batched)].append(time.process_time() - p0)
    DenseSteps.WEIGHTS_AFTER_SWEEP = True
    out = {}
    for batched, label in ((True, "batched"), (False, "per-layer")):
        t, ts = (statistics.median(cpu[(k, batched)]) for k in parts)
        out[label] = {"batch_cpu": t, "shard_cpu": ts, "efficiency": t / (ranks * ts)}
    return out


def efficiencies(ones: list[dict], manys: list[dict]) -> dict:
    """Per quantity: medians over the rounds, wall and CPU efficiency, per-rank shares."""
    P = manys[0]["ranks"]
    out = {}
    for q in QUANTITIES:
        w1 = statistics.median(r[q]["wall"] for r in ones)
        wP = statistics.median(r[q]["wall"] for r in manys)
        c1 = statistics.median(sum(r[q]["cpu"]) for r in ones)
        cP = statistics.median(sum(r[q]["cpu"]) for r in manys)
        k1 = statistics.median(_compute(r[q]) for r in ones)
        kP = statistics.median(_compute(r[q]) for r in manys)
        per_rank = {key: [statistics.median(r[q][key][k] for r in manys) for k in range(P)]
                    for key in ("cpu", "mpi_cpu", "comm", "wait")}
        out[q] = {"wall_1": w1, f"wall_{P}": wP, "wall_efficiency": w1 / (P * wP),
                  "cpu_1": c1, f"cpu_{P}": cP, "cpu_efficiency": c1 / cP,
                  "compute_1": k1, f"compute_{P}": kP, "compute_efficiency": k1 / kP,
                  f"per_rank_{P}": per_rank}
    return out


def _compute(row: dict) -> float:
    """CPU seconds outside MPI calls, summed over the ranks."""
    return sum(row["cpu"]) - sum(row["mpi_cpu"])


def table(name: str, eff: dict, P: int, load: float) -> str:
    """The efficiencies as text: seconds at 1 and P ranks (wall; CPU and compute CPU
    summed over the ranks) and P-rank wall ms in communication / waiting per rank."""
    lines = [f"{name} (load {load:.1f}):",
             f"  {'':17s} {'wall 1':>7s} {f'wall {P}':>7s} {'eff':>4s}  {'CPU 1':>7s} "
             f"{f'CPU {P}':>7s} {'eff':>4s}  {'comp 1':>7s} {f'comp {P}':>7s} {'eff':>4s}"
             f"  comm/wait ms"]
    for q, e in eff.items():
        pr = e[f"per_rank_{P}"]
        shares = " ".join(f"{1e3 * c:.0f}/{1e3 * w:.0f}" for c, w in zip(pr["comm"], pr["wait"]))
        lines.append(f"  {q:17s} {e['wall_1']:7.4f} {e[f'wall_{P}']:7.4f} "
                     f"{e['wall_efficiency']:4.2f}  {e['cpu_1']:7.4f} {e[f'cpu_{P}']:7.4f} "
                     f"{e['cpu_efficiency']:4.2f}  {e['compute_1']:7.4f} "
                     f"{e[f'compute_{P}']:7.4f} {e['compute_efficiency']:4.2f}  {shares}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", nargs="+", default=["default", "peaks_deep"])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--timeout", type=int, default=600, help="seconds per launch")
    p.add_argument("--per-layer-weights", action="store_true")
    p.add_argument("--worker", metavar="CONFIG", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        row = measure(a.worker, a.reps, a.per_layer_weights)
        if row is not None:
            print(json.dumps(row), flush=True)
        return
    results, extra = [], ["--per-layer-weights"] if a.per_layer_weights else []
    for name in a.config:
        rows = {1: [], a.ranks: []}
        for k in range(a.rounds):
            for ranks in ((1, a.ranks) if k % 2 == 0 else (a.ranks, 1)):
                rows[ranks].append(launch(ranks, name, a.reps, a.timeout, extra))
        eff = efficiencies(rows[1], rows[a.ranks])
        load = statistics.median(r["load"] for r in rows[1] + rows[a.ranks])
        print(table(name, eff, a.ranks, load), flush=True)
        shards = shard_efficiency(name, a.ranks, a.rounds * a.reps)
        print("  serial step on one process, batch / shard CPU s: " + ", ".join(
            f"{k} {v['batch_cpu']:.4f} / {v['shard_cpu']:.4f} = {v['efficiency']:.2f}"
            for k, v in shards.items()), flush=True)
        results.append({"config": name, **{k: rows[1][0][k] for k in
                                           ("layers", "batch", "levels", "fwd_iters",
                                            "adj_iters", "threads")},
                        "rounds": a.rounds, "reps": a.reps, "load": load,
                        "efficiency": eff, "serial_shard": shards, "launches": rows[1] + rows[a.ranks]})
    name = "efficiency" + ("-per-layer" if a.per_layer_weights else "")
    print(f"saved {save(name, {'ranks': a.ranks, 'rows': results})}")


if __name__ == "__main__":
    main()
