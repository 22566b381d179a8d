"""The example's network (bench/module_step.py) under torch.compile against eager.

    .venv/bin/python bench/compiled_net.py [--steps 8]

One process, one-shot LayerParallel (2 + 2 iterations, warm): the wall time of each
Adam step, the first ones including the compilation, eager and compiled (inductor) in
fresh networks; the median of the steps after the second, and how many lines the
compilation wrote to stderr is for the reader to count (run with 2> file).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from common import save
from module_step import batch, lp_net, stepper


def timed_steps(step, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--layers", type=int, default=16)
    a = p.parse_args()
    x, y = batch(100)
    rows = {}
    for name in ("eager", "compiled"):
        net = lp_net(a.layers, "one-shot")
        run = torch.compile(net) if name == "compiled" else net
        step = stepper(net, x, y, run)
        times = timed_steps(step, a.steps)
        rows[name] = {"first_s": times[0], "second_s": times[1],
                      "median_after_ms": 1e3 * statistics.median(times[2:])}
        print(f"| {name:8s} | {times[0]:7.2f} | {times[1]:7.2f} | "
              f"{rows[name]['median_after_ms']:7.1f} |")
    save("compiled_net", {"args": vars(a), "rows": rows})


if __name__ == "__main__":
    main()
