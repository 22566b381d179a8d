"""Why MGRIT converged slowly on large-step networks: cold forward and adjoint factors.

    .venv/bin/python bench/coarse_factor.py "network=dense_wide" [ITERATIONS]

Trains the configuration serially for ITERATIONS (default 20) iterations, then
measures at θ₀ and at the trained θ the convergence factor (geometric mean of
the residual ratios) of an 8-iteration cold forward solve and of the adjoint
solve that follows, for MGRIT variants: coarse weights injected or averaged,
F or FCF on the finest level, c = 2 or 4, 2 or 3 levels.
"""
from __future__ import annotations

import sys
from dataclasses import replace

import common  # noqa: F401  (one thread, the allocator setting)
from common import MemoryWriter
from lptrain.app import build
from lptrain.config import compose
from lptrain.metrics.console import Console
from lptrain.train.control import convergence_factor
from lptrain.parallel.layer_parallel import LayerParallel
from lptrain.train.loop import train

VARIANTS = {
    "inject": dict(coarse_weights="inject"),
    "average": dict(coarse_weights="average"),
    "inject, FCF on level 0": dict(coarse_weights="inject", nrelax0=1),
    "average, FCF on level 0": dict(coarse_weights="average", nrelax0=1),
    "inject, c = 2": dict(coarse_weights="inject", cfactor0=2, cfactor=2),
    "average, c = 2": dict(coarse_weights="average", cfactor0=2, cfactor=2),
    "inject, 2 levels": dict(coarse_weights="inject", levels=2),
    "average, 2 levels": dict(coarse_weights="average", levels=2),
}


def main():
    overrides = sys.argv[1].split() if len(sys.argv) > 1 else []
    its = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    opts, _ = compose(["mode=serial", f"train.iterations={its}", *overrides])
    ex, data, net, theta, oracle, opt = build(opts, None)
    thetas = {0: theta.clone()}
    thetas[its], _ = train(theta, opt, oracle, data, opts, MemoryWriter(), Console(False, 1),
                           ex)
    x, y = data.x_train, data.y_train
    print(f"h = {net.h:.3f}, N = {opts.network.layers}\n\n| θ after | variant | levels "
          "| forward factor | adjoint factor |\n|---|---|---|---|---|")
    for k, th in thetas.items():
        for name, change in VARIANTS.items():
            lp = LayerParallel(net, replace(opts.mgrit, **change), ex)
            fwd = lp.forward(th, x, warm=None, max_iter=8, tol=0.0)
            ev = lp.evaluate(th, fwd.states, y, x.shape[0], True)
            _, adj = lp.backward(th, x, fwd.states, ev, warm=None, max_iter=8, tol=0.0)
            print(f"| {k} | {name} | {lp.n_levels} | {convergence_factor(fwd.history):.3f} "
                  f"| {convergence_factor(adj.history):.3f} |", flush=True)


if __name__ == "__main__":
    main()
