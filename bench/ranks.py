"""Wall time of MGRIT solves and of optimizer steps on however many ranks this runs on.

    .venv/bin/mpiexec -n P .venv/bin/python bench/ranks.py [--layers 1024] [--batch 5000]

Measures (median of --reps) one forward MGRIT solve to a relative residual of
1e-9, one adjoint solve, one simultaneous step (2 + 1 iterations) and one
serial step (data parallel over the ranks).  Rank 0 prints one JSON line
and appends it to bench/results/ranks.jsonl.
"""
from __future__ import annotations

import argparse
import json
import time

from common import RESULTS, data, network
from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.context import make_exchange, world
from lptrain.parallel.layer_parallel import LayerParallel
from lptrain.train.objective import Objective
from lptrain.train.oneshot import SimultaneousOracle
from lptrain.train.oracles import Batch, SerialOracle


def median_time(comm, fn, reps):
    """Median over reps timed runs after one untimed run (buffers allocated, pages mapped)."""
    fn()
    times = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        comm.Barrier()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def step(oracle, theta, x, y):
    oracle.begin(Batch(x, y))
    ev = oracle.value(theta)
    oracle.gradient(ev)
    oracle.accept(ev)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=1024)
    p.add_argument("--batch", type=int, default=5000)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    comm = world()
    exchange = make_exchange(comm)
    net, theta = network(a.layers)
    x, y = data(a.batch)
    mgrit_opts = MGRITOptions(levels=3, cfactor0=4, cfactor=4, tol=0.0, rtol=1e-9, max_iter=30)
    lp = LayerParallel(net, mgrit_opts, exchange)
    fwd = lp.forward(theta, x)
    ev = lp.evaluate(theta, fwd.states, y, a.batch, True)
    row = {"ranks": comm.Get_size(), "layers": a.layers, "batch": a.batch,
           "fwd_iterations": fwd.iterations,
           "forward_solve_s": median_time(comm, lambda: lp.forward(theta, x), a.reps)}
    fwd = lp.forward(theta, x)
    row["adjoint_solve_s"] = median_time(
        comm, lambda: lp.backward(theta, x, fwd.states, ev), a.reps)
    sim = Objective(SimultaneousOracle(net, exchange,
                                       MGRITOptions(levels=3, cfactor0=4, cfactor=4)), net)
    step(sim, theta, x, y)
    row["simultaneous_step_s"] = median_time(comm, lambda: step(sim, theta, x, y), a.reps)
    ser = Objective(SerialOracle(net, exchange), net)
    row["serial_step_s"] = median_time(comm, lambda: step(ser, theta, x, y), a.reps)
    if comm.Get_rank() == 0:
        print(json.dumps(row))
        RESULTS.mkdir(exist_ok=True)
        with open(RESULTS / "ranks.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
