"""Where the ranks of an MGRIT solve wait: blocked seconds by the solver function that waited.

    .venv/bin/mpiexec -n 2 .venv/bin/python bench/waiting.py [--config peaks_deep]
        [--iters 10] [--reps 3]

Runs forward MGRIT iterations (resumed, as bench/efficiency.py's) and one-shot steps of a
configuration (bench/simultaneous_step.py's CONFIGS) with the exchange's receive and wait
calls timed by their caller (the mgrit/ or parallel/ function that blocked), and prints,
per rank, the wall seconds of the runs and the share of them blocked in each caller's
receives (`caller:recv`) and in its waits for its own sends to complete (`caller:wait`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict


HELPERS = ("_recv", "_send")     # the solver's one-line message helpers: their callers count


def attribute(exchange, table):
    """Time `exchange`'s (and its mirror's) recv and wait by the calling function."""
    for name in ("recv", "wait"):
        original = getattr(type(exchange), name)

        def timed(self, *args, _original=original, _name=name, **kw):
            frame = sys._getframe(1)
            while frame.f_code.co_name in HELPERS:
                frame = frame.f_back
            caller = frame.f_code.co_name
            t0 = time.perf_counter()
            try:
                return _original(self, *args, **kw)
            finally:
                table[f"{caller}:{_name}"] += time.perf_counter() - t0
        setattr(type(exchange), name, timed)


def main():
    from simultaneous_step import configured
    from lptrain.parallel.context import make_exchange, world
    from lptrain.parallel.layer_parallel import LayerParallel
    from lptrain.train.objective import Objective
    from lptrain.train.oneshot import SimultaneousOracle
    from lptrain.train.oracles import Batch
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="peaks_deep")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    comm = world()
    exchange = make_exchange(comm)
    net, theta, x, y, mgrit, _ = configured(a.config, None, None)
    lp = LayerParallel(net, mgrit, exchange)
    lp.forward(theta, x, max_iter=2, tol=0.0)
    oneshot = Objective(SimultaneousOracle(net, exchange, mgrit), net)

    def step():
        oneshot.begin(Batch(x, y))
        ev = oneshot.value(theta)
        oneshot.gradient(ev)
        oneshot.accept(ev)
    step()
    runs = {"forward iteration": lambda: lp.forward(theta, x, max_iter=1, tol=0.0,
                                                    resume=True), "one-shot step": step}
    tables = {q: defaultdict(float) for q in runs}
    wall = dict.fromkeys(runs, 0.0)
    current = defaultdict(float)
    attribute(exchange, current)
    for _ in range(a.reps):
        for q, fn in runs.items():
            for _ in range(a.iters if q == "forward iteration" else 1):
                comm.Barrier()
                current.clear()
                t0 = time.perf_counter()
                fn()
                wall[q] += time.perf_counter() - t0
                for k, v in current.items():
                    tables[q][k] += v
    rows = comm.gather({q: {"wall": wall[q], "blocked": dict(tables[q])} for q in runs},
                       root=0)
    if comm.Get_rank() == 0:
        for q in runs:
            for r, row in enumerate(rows):
                w = row[q]["wall"]
                parts = sorted(row[q]["blocked"].items(), key=lambda kv: -kv[1])
                print(json.dumps({"quantity": q, "rank": r, "wall_s": round(w, 4),
                                  "blocked_share": {k: round(v / w, 4) for k, v in parts}}))


if __name__ == "__main__":
    main()
