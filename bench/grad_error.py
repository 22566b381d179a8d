"""The one-shot gradient error estimate against the true error, along a training run.

    .venv/bin/python bench/grad_error.py "seed=9 train.iterations=100 mgrit.control=fixed"

Runs mode=simultaneous with the overrides and, at every accepted gradient,
computes the exact gradient layer-serially: prints the median true relative
error ‖g̃ − g‖/‖g‖, the median estimate (mgrit/grad_error, docs/method.md §6),
the median ratio estimate / true and the correlation of their logarithms, how often the
estimate lay below the true error, and how many gradients missed mgrit.grad_tol.
"""
from __future__ import annotations

import statistics
import sys

import numpy as np

import common  # noqa: F401  (one thread, the allocator setting)
from common import MemoryWriter
from lptrain.app import build
from lptrain.config import compose
from lptrain.metrics.console import Console
from lptrain.train.loop import train
from lptrain.train.objective import Objective
from lptrain.train.oracles import SerialOracle


def main():
    opts, _ = compose(["mode=simultaneous", *sys.argv[1].split()])
    ex, data, net, theta, oracle, opt = build(opts, None)
    exact, pairs = Objective(SerialOracle(net, ex), net), []
    inexact_gradient = oracle.gradient

    def gradient(ev):
        g = inexact_gradient(ev)
        exact.begin(ev.batch)
        true = exact.gradient(exact.value(ev.theta))
        stats = ev.tape.stats        # the one-shot evaluation's (one data group)
        pairs.append((float((g - true).norm() / true.norm()),
                      stats.fwd_error + stats.adj_error))
        return g
    oracle.gradient = gradient
    train(theta, opt, oracle, data, opts, MemoryWriter(), Console(False, 1), ex)
    true, est = np.array(pairs).T
    ratio = est / true
    print(f"{sys.argv[1]}: evaluations {len(pairs)}, median true error "
          f"{statistics.median(true):.2e}, median estimate {statistics.median(est):.2e}, "
          f"median estimate / true {statistics.median(ratio):.1f} "
          f"(min {min(ratio):.2f}), log correlation "
          f"{np.corrcoef(np.log(true), np.log(est))[0, 1]:.2f}; estimate below the true "
          f"error in {np.mean(ratio < 1):.0%}; true error above grad_tol "
          f"({opts.mgrit.grad_tol:g}) in {int(np.sum(true > opts.mgrit.grad_tol))}, "
          f"largest {max(true):.2e}")

if __name__ == "__main__":
    main()
