"""Cost of averaged against injected coarse weights on the configurations users run.

    .venv/bin/python bench/coarse_weights.py [--reps 7] [--only NAME ...]

Per configuration: one serial oracle and two simultaneous oracles (2 forward +
2 adjoint iterations, mgrit.control=fixed, so that both do the same work),
one with mgrit.coarse_weights=inject and one with average, taking L-BFGS steps
in turn (bench/simultaneous_step.py run_steps) so that machine drifts reach
all alike.  Prints the median seconds per line-search trial and the ratio.
"""
from __future__ import annotations

import argparse
from dataclasses import replace

import common  # noqa: F401  (one thread, the allocator setting)
from lptrain.app import build
from lptrain.config import compose
from lptrain.mgrit.exchange import SerialExchange
from lptrain.train.objective import Objective
from lptrain.train.oneshot import SimultaneousOracle
from lptrain.train.oracles import SerialOracle
from simultaneous_step import run_steps

CONFIGS = {
    "default": [],
    "dense_wide": ["network=dense_wide", "dataset.n_train=1000"],
    "peaks_deep": ["experiment=peaks_deep", "dataset.n_train=1000"],
    "peaks_paper": ["experiment=peaks_paper"],
    "indian_pines_paper": ["experiment=indian_pines_paper", "dataset.n_train=1000"],
    "mnist_paper": ["experiment=mnist_paper", "dataset.n_train=200"],
}


def measure(overrides: list[str], reps: int) -> tuple[float, float, float]:
    opts, _ = compose(["mode=simultaneous", *overrides])
    _, data, net, theta, _, _ = build(opts, None)
    fixed = replace(opts.mgrit, control="fixed", fwd_iters=2, adj_iters=2)
    oracles = [Objective(SerialOracle(net, SerialExchange()), net)] + [
        Objective(SimultaneousOracle(net, SerialExchange(), replace(fixed, coarse_weights=w)),
                  net) for w in ("inject", "average")]
    return tuple(run_steps(oracles, theta, data.x_train, data.y_train, reps))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--only", nargs="*")
    a = p.parse_args()
    print("| configuration | serial s | inject s | average s | average / inject |\n"
          "|---|---|---|---|---|")
    for name in a.only or CONFIGS:
        ser, inj, avg = measure(CONFIGS[name], a.reps)
        print(f"| {name} | {ser:.4f} | {inj:.4f} | {avg:.4f} | {avg / inj:.3f} |", flush=True)


if __name__ == "__main__":
    main()
