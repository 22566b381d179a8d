"""The conv adjoint's two forms (model/conv_ops.py) A/B on a configuration's evaluations.

    OMP_NUM_THREADS=1 .venv/bin/python bench/conv_ops.py [--config mnist] [--reps 5]

One process, one batch (the configuration's first mini-batch), value + gradient of the
serial oracle and of the simultaneous one (its fixed iterations), the reference and the
fast form taking turns evaluation by evaluation; prints median wall and CPU seconds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from simultaneous_step import CONFIGS, configured
from lptrain.mgrit.exchange import SerialExchange
from lptrain.model.conv_ops import CONV_OPS
from lptrain.model.steps import ConvSteps
from lptrain.train.oneshot import SimultaneousOracle
from lptrain.train.oracles import Batch, SerialOracle


def evaluate(oracle, theta, x, y) -> tuple[float, float]:
    """(wall, CPU) seconds of one value + gradient."""
    t0, c0 = time.perf_counter(), time.process_time()
    oracle.begin(Batch(x, y))
    oracle.gradient(oracle.value(theta))
    return time.perf_counter() - t0, time.process_time() - c0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="mnist", choices=sorted(CONFIGS))
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    net, theta, x, y, mgrit, _ = configured(a.config, None, None)
    oracles = {"serial": SerialOracle(net, SerialExchange()),
               "simultaneous": SimultaneousOracle(net, SerialExchange(), mgrit)}
    for oracle in oracles.values():
        evaluate(oracle, theta, x, y)                   # warm-up, first warm start
    times = {}
    for _ in range(a.reps):
        for form in CONV_OPS:
            ConvSteps.conv_ops = CONV_OPS[form]
            for name, oracle in oracles.items():
                times.setdefault((form, name), []).append(evaluate(oracle, theta, x, y))
    print(f"{a.config}, load {os.getloadavg()[0]:.1f}:")
    for (form, name), ts in times.items():
        print(f"  {form:9s} {name:12s} wall {statistics.median(t for t, _ in ts):.3f} s, "
              f"CPU {statistics.median(c for _, c in ts):.3f} s")


if __name__ == "__main__":
    main()
