"""Cost of one forward and one adjoint MGRIT iteration against a serial sweep.

    .venv/bin/python bench/mgrit_cost.py [--layers 256 1024] [--batch 5000] [--reps 3]

For 3 levels, cfactor 4, F-relaxation on the finest level and FCF on the
coarse ones: the time of one steady-state (warm) iteration = time(k+1
iterations) − time(k), relative to one serial forward (or backward) sweep,
next to the number of steps the solver itself performs per iteration
(counted by wrapping its propagator).
"""
from __future__ import annotations

import argparse

from common import Counting, data, network, save, timeit
from lptrain.mgrit.exchange import SerialExchange
from lptrain.mgrit.fused import Fusions
from lptrain.mgrit.options import MGRITOptions
from lptrain.model.serial import Buffers, adjoint, propagate
from lptrain.parallel.layer_parallel import LayerParallel

OPTS = dict(levels=3, cfactor0=4, cfactor=4, nrelax0=0, nrelax=1)


def measure(layers, batch, reps):
    net, theta = network(layers)
    x, y = data(batch)
    st = net.stepper(theta)
    u0 = net.opening(theta, x)
    states, saved = propagate(st, u0, net.h)
    lamN = states[-1].clone()
    keep = Buffers()            # as the serial oracle sweeps: into the same tensors
    t_fwd = timeit(lambda: propagate(st, u0, net.h, buffers=keep), reps)
    t_bwd = timeit(lambda: adjoint(st, states, saved, lamN, net.h), reps)
    lp = LayerParallel(net, MGRITOptions(tol=0.0, **OPTS), SerialExchange())
    base = lp.forward(theta, x, max_iter=30).states.clone()
    ev = lp.evaluate(theta, base, y, batch, True)
    row = {"layers": layers, "serial_forward_s": t_fwd, "serial_backward_s": t_bwd}
    for k in (1, 2):
        row[f"fwd_{k}_s"] = timeit(lambda k=k: lp.forward(theta, x, warm=base, max_iter=k), reps)
    fwd = lp.forward(theta, x, max_iter=30)
    for k in (1, 2):
        row[f"adj_{k}_s"] = timeit(
            lambda k=k: lp.backward(theta, x, fwd.states, ev, max_iter=k), reps)
    row["fwd_iteration_s"] = row["fwd_2_s"] - row["fwd_1_s"]
    row["adj_iteration_s"] = row["adj_2_s"] - row["adj_1_s"]
    row["fwd_iteration_vs_sweep"] = row["fwd_iteration_s"] / t_fwd
    row["adj_iteration_vs_sweep"] = row["adj_iteration_s"] / t_bwd
    row["steps_per_iteration_N"] = count_steps(lp, theta, x) / layers
    lp.fwd.ops.fusions = Fusions(stack=False)   # one interval at a time: the effect of stacking
    row["fwd_unstacked_1_s"] = timeit(lambda: lp.forward(theta, x, warm=base, max_iter=1), reps)
    row["fwd_unstacked_2_s"] = timeit(lambda: lp.forward(theta, x, warm=base, max_iter=2), reps)
    row["fwd_unstacked_iteration_s"] = row["fwd_unstacked_2_s"] - row["fwd_unstacked_1_s"]
    lp.fwd.ops.fusions = Fusions()
    return row


def count_steps(lp, theta, x) -> int:
    """Steps of one steady-state forward iteration, counted from the solver."""
    counts = []
    orig = lp.fwd.solve

    def counted(prop, *a, **kw):
        c = Counting(prop)
        counts.append(c)
        return orig(c, *a, **kw)
    lp.fwd.solve = counted
    warm = lp.forward(theta, x, max_iter=30).states.clone()
    lp.forward(theta, x, warm=warm, max_iter=1)
    one = counts[-1].total()
    lp.forward(theta, x, warm=warm, max_iter=2)
    lp.fwd.solve = orig
    return counts[-1].total() - one


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--batch", type=int, default=5000)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    rows = [measure(n, a.batch, a.reps) for n in a.layers]
    for r in rows:
        print(f"N={r['layers']}: serial sweep fwd {r['serial_forward_s']:.3f} s / bwd "
              f"{r['serial_backward_s']:.3f} s; one forward iteration "
              f"{r['fwd_iteration_s']:.3f} s = {r['fwd_iteration_vs_sweep']:.2f} sweeps, "
              f"one adjoint iteration {r['adj_iteration_s']:.3f} s = "
              f"{r['adj_iteration_vs_sweep']:.2f} sweeps; solver performs "
              f"{r['steps_per_iteration_N']:.3f} N steps per forward iteration; unstacked "
              f"forward iteration {r['fwd_unstacked_iteration_s']:.3f} s")
    save("mgrit_cost", {"batch": a.batch, "options": OPTS, "rows": rows})


if __name__ == "__main__":
    main()
