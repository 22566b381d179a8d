"""The sampling error of mini-batch gradients, the scale one-shot errors are compared with.

    .venv/bin/python bench/batch_noise.py "dataset=mnist" 0 100 300

Trains layer-serially with the configuration's optimizer and, at each listed
iteration, computes the exact gradient of every mini-batch and of the whole
training set at the same θ: prints the median and the 10 %/90 % quantiles of
‖g_B − g‖ / ‖g_B‖, the relative error a mini-batch gradient already carries
against the full one (docs/method.md §6 compares mgrit.grad_tol with it).
"""
from __future__ import annotations

import sys

import numpy as np

import common  # noqa: F401  (one thread, the allocator setting)
from common import MemoryWriter
from lptrain.app import build
from lptrain.config import compose
from lptrain.metrics.console import Console
from lptrain.train.loop import Batches, train
from lptrain.train.objective import Objective
from lptrain.train.oracles import Batch, SerialOracle


def gradients(oracle, theta, batches, data):
    """(full-batch gradient, [gradient of each mini-batch]) at θ."""
    def grad(batch):
        oracle.begin(batch)
        return oracle.gradient(oracle.value(theta))
    full = grad(Batch(data.x_train, data.y_train))
    parts = [grad(Batch(data.x_train[p], data.y_train[p], key)) for key, p in
             enumerate(batches.parts)]
    return full, parts


def main():
    overrides, points = sys.argv[1].split(), sorted(int(a) for a in sys.argv[2:])
    opts, _ = compose(["mode=serial", *overrides])
    ex, data, net, theta, oracle, opt = build(opts, None)
    batches = Batches(data.x_train, data.y_train, opts.train.batch_size, opts.seed)
    exact, done = Objective(SerialOracle(net, ex), net), 0
    for k in points:
        if k > done:
            opts.train.iterations = k - done
            theta, _ = train(theta, opt, oracle, data, opts, MemoryWriter(),
                             Console(False, 1), ex)
            done = k
        full, parts = gradients(exact, theta, batches, data)
        rel = np.array([float((g - full).norm() / g.norm()) for g in parts])
        q10, q50, q90 = np.quantile(rel, [0.1, 0.5, 0.9])
        print(f"{sys.argv[1]} iteration {k}: {len(parts)} batches, ‖g_B − g‖/‖g_B‖ median "
              f"{q50:.3f} (10 % {q10:.3f}, 90 % {q90:.3f})", flush=True)


if __name__ == "__main__":
    main()
