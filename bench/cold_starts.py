"""One-shot evaluations from a cold start: the gradient's error and cost per hierarchy.

    .venv/bin/python bench/cold_starts.py [--iterations 40 400] [--batches 4] \
        [--overrides "dataset=fashion_mnist"]

Trains the configuration layer-serially for each `--iterations` count (the θ a run has
then; θ files are cached in bench/results/), then, for `--batches` batches the run has
not trained on, solves forward and adjoint by MGRIT from a cold start with k = 1, 2, 3
iterations each on several hierarchies, and prints the median relative error of the
gradient against the layer-serial one and the median CPU seconds of the evaluation (the
first batch's left out: first calls). Every Fashion-MNIST batch starts cold (600 an
epoch against mode.warm_batches kept), which is what the recipe's hierarchy is chosen by
(BENCHMARKS.md "Fashion-MNIST's one-shot default run").
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from common import RESULTS, MemoryWriter, save
from lptrain.app import build
from lptrain.config import compose
from lptrain.metrics.console import Console
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.layer_parallel import LayerParallel
from lptrain.train.loop import train

HIERARCHIES = {          # name: MGRITOptions keywords
    "3 levels, c 4": {},
    "2 levels, c 4": dict(levels=2),
    "2 levels, c 8": dict(levels=2, cfactor0=8),
    "2 levels, c 4, FCF": dict(levels=2, nrelax0=1),
    "2 levels, c 2": dict(levels=2, cfactor0=2),
}


def trained(overrides: list[str], iterations: int):
    """(net, data, θ after `iterations` serial steps), θ cached by configuration."""
    opts, _ = compose(["mode=serial", *overrides, f"train.iterations={iterations}",
                       "eval_every=1000000", "dataset.n_val=100"])
    ex, data, net, theta, oracle, opt = build(opts, None)
    path = RESULTS / f"cold_starts_theta_{'_'.join(overrides)}_{iterations}.pt"
    if path.exists():
        return net, data, torch.load(path), opts.train.batch_size
    theta, _ = train(theta, opt, oracle, data, opts, MemoryWriter(), Console(False, 1), ex)
    RESULTS.mkdir(exist_ok=True)
    torch.save(theta, path)
    return net, data, theta, opts.train.batch_size


def evaluation(net, theta, x, y, options: MGRITOptions, k: int):
    """The gradient of k forward + k adjoint iterations from a cold start, its CPU s."""
    lp = LayerParallel(net, options, SerialExchange())
    t0 = time.process_time()
    res = lp.forward(theta, x, max_iter=k, tol=0.0)
    ev = lp.evaluate(theta, res.states, y, x.shape[0], True)
    grad, _ = lp.backward(theta, x, res.states, ev, max_iter=k, tol=0.0)
    return grad, time.process_time() - t0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--overrides", default="dataset=fashion_mnist")
    p.add_argument("--iterations", type=int, nargs="+", default=[40, 400])
    p.add_argument("--batches", type=int, default=4)
    a = p.parse_args()
    overrides, rows = a.overrides.split(), []
    for iterations in a.iterations:
        net, data, theta, b = trained(overrides, iterations)
        found: dict = {}
        for i in range(a.batches):
            lo = data.x_train.shape[0] // 2 + i * b     # batches from the middle
            x, y = data.x_train[lo:lo + b], data.y_train[lo:lo + b]
            exact, _ = evaluation(net, theta, x, y, MGRITOptions(levels=1), 1)
            for name, kw in HIERARCHIES.items():
                for k in (1, 2, 3):
                    g, cpu = evaluation(net, theta, x, y, MGRITOptions(tol=0.0, **kw), k)
                    found.setdefault((name, k), []).append(
                        (float((g - exact).norm() / exact.norm()), cpu))
        for (name, k), v in found.items():
            row = {"theta after": iterations, "hierarchy": name, "iterations": k,
                   "median error": statistics.median(e for e, _ in v),
                   "max error": max(e for e, _ in v),
                   "median CPU s": statistics.median(c for _, c in v[1:] or v)}
            rows.append(row)
            print(row, flush=True)
    save("cold_starts", {"overrides": a.overrides, "rows": rows})


if __name__ == "__main__":
    main()
