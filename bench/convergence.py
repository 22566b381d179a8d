"""Convergence factor of forward and adjoint MGRIT per iteration.

    .venv/bin/python bench/convergence.py [--layers 1024] [--batch 500]

For levels 2..5, cfactor 2/4/8 (all levels), F- and FCF-relaxation on every
level: the geometric mean of successive residual ratios over the first
iterations of a cold solve, and the iterations to a relative residual of
1e-9.  Convergence hardly depends on the batch size, so a batch of 500
keeps the sweep short; the network is the benchmark network (smooth weights).
"""
from __future__ import annotations

import argparse

from common import data, network, save
from lptrain.train.control import convergence_factor
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.options import MGRITOptions
from lptrain.parallel.layer_parallel import LayerParallel


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=1024)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--max-iter", type=int, default=25)
    a = p.parse_args()
    net, theta = network(a.layers)
    x, y = data(a.batch)
    rows = []
    for cf in (2, 4, 8):
        for levels in (2, 3, 4, 5):
            for nrelax in (0, 1):
                o = MGRITOptions(levels=levels, cfactor0=cf, cfactor=cf, nrelax0=nrelax,
                                 nrelax=nrelax, min_coarse=1, tol=0.0, rtol=1e-9,
                                 max_iter=a.max_iter, skip_first_down=False)
                lp = LayerParallel(net, o, SerialExchange())
                if len(lp.hier.levels) < levels:
                    continue
                res = lp.forward(theta, x)
                ev = lp.evaluate(theta, res.states, y, a.batch, True)
                _, ares = lp.backward(theta, x, res.states, ev)
                row = {"cfactor": cf, "levels": levels, "relax": "FCF" if nrelax else "F",
                       "fwd_factor": convergence_factor(res.history[:6]),
                       "fwd_iters_to_1e-9": res.iterations if res.converged else None,
                       "adj_factor": convergence_factor(ares.history[:6]),
                       "adj_iters_to_1e-9": ares.iterations if ares.converged else None}
                rows.append(row)
                print(row, flush=True)
    save(f"convergence_N{a.layers}", {"layers": a.layers, "batch": a.batch, "rows": rows})


if __name__ == "__main__":
    main()
