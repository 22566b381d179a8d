"""Validation in the MGRIT modes: a serial sweep against a converged MGRIT solve.

    .venv/bin/python bench/validation.py "dataset=fashion_mnist" 1000 [reps]

One process, one rank.

Both give the exact validation loss and accuracy of θ₀ on the first n validation
samples, in chunks of the training batch (as the training loop validates); prints
the process CPU seconds of each (median of reps, robust to a shared machine) and
their difference in loss.  The MGRIT modes validate with the serial sweep
(train/mgrit_oracle.py MGRITOracle.validate); the solve is what they did before.
"""
from __future__ import annotations

import statistics
import sys
import time

import common  # noqa: F401  (one thread, the allocator setting)
from lptrain.app import build
from lptrain.config import compose
from lptrain.data.base import chunks
from lptrain.mgrit.exchange import SerialExchange
from lptrain.parallel.layer_parallel import LayerParallel


def converged(net, mgrit, exchange, theta, x, y, chunk):
    """Mean loss and accuracy by a forward MGRIT solve to mgrit.tol per chunk."""
    lp = LayerParallel(net, mgrit, exchange)
    n, loss, correct = x.shape[0], 0.0, 0
    for part in chunks(n, chunk):
        res = lp.forward(theta, x[part], warm=None, max_iter=mgrit.max_iter, tol=mgrit.tol,
                         save=False)
        ev = lp.evaluate(theta, res.states, y[part], n, False)
        loss, correct = loss + ev.loss, correct + ev.correct
    return loss, correct / n


def cpu_seconds(fn, reps):
    times, out = [], None
    for _ in range(reps):
        t0 = time.process_time()
        out = fn()
        times.append(time.process_time() - t0)
    return statistics.median(times), out


def main():
    overrides, n = sys.argv[1].split(), int(sys.argv[2])
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    opts, _ = compose(["mode=mgrit", *overrides])
    ex, data, net, theta, oracle, _ = build(opts, None)
    x, y, chunk = data.x_val[:n], data.y_val[:n], opts.train.batch_size
    sweep_s, (sweep_loss, sweep_acc) = cpu_seconds(
        lambda: oracle.validate(theta, x, y, chunk), reps)
    solve_s, (solve_loss, solve_acc) = cpu_seconds(
        lambda: converged(net, opts.mgrit, SerialExchange(), theta, x, y, chunk), reps)
    print(f"{' '.join(overrides)}: {n} samples in chunks of {chunk}")
    print(f"  serial sweep     {sweep_s:8.3f} CPU s   loss {sweep_loss:.10f}  acc {sweep_acc:.4f}")
    print(f"  converged MGRIT  {solve_s:8.3f} CPU s   loss {solve_loss:.10f}  acc {solve_acc:.4f}")
    print(f"  solve / sweep {solve_s / sweep_s:.1f}x, |loss difference| "
          f"{abs(solve_loss - sweep_loss):.1e}")


if __name__ == "__main__":
    main()
