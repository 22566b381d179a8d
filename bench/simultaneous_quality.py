"""Does one-shot training reach the model serial training reaches?  The whole matrix.

    .venv/bin/python bench/simultaneous_quality.py [--only NAME ...] [--out FILE.md]

For each configuration: serial and simultaneous runs with the same overrides
and iteration count; both final parameter vectors are then evaluated EXACTLY
(layer-serial, full training set), so an inexact one-shot objective cannot
flatter the result.  Pass: simultaneous objective within 15 % of serial's and
validation accuracy within 0.03.  Also the MGRIT iterations per optimizer
iteration (accepted point, and all solves incl. line-search trials), failed
line searches and the highest rung the controller climbed to.  "Pass" asks
that simultaneous be no worse than that; the ratio column shows when it is
better (early in a run L-BFGS paths part ways by chance).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import common  # noqa: F401  (one thread, the allocator setting)
from lptrain.app import build
from lptrain.config import compose
from lptrain.metrics.console import Console
from lptrain.metrics.writer import MemoryWriter
from lptrain.train.loop import train
from lptrain.train.oracles import Batch, SerialOracle

QUICK_MNIST = ["dataset=mnist", "network=conv", "dataset.n_train=300", "dataset.n_val=100",
               "train.iterations=15", "eval_every=15"]
MATRIX = {
    **{f"default seed {s}": [f"seed={s}", "train.iterations=100"] for s in range(5)},
    "peaks_paper": ["experiment=peaks_paper"],
    "N=128": ["network.layers=128", "train.iterations=60"],
    "N=1024": ["network.layers=1024", "train.iterations=20", "dataset.n_train=1000"],
    "relu": ["network.activation=relu", "train.iterations=100"],
    "smoothrelu": ["network.activation=smoothrelu", "train.iterations=100"],
    "cfactor 2, 4 levels": ["mgrit.cfactor0=2", "mgrit.cfactor=2", "mgrit.levels=4",
                            "train.iterations=100"],
    "cfactor 4, 2 levels": ["mgrit.levels=2", "train.iterations=100"],
    "cfactor 2, 3 levels": ["mgrit.cfactor0=2", "mgrit.cfactor=2", "train.iterations=100"],
    "indian_pines_paper (short)": ["experiment=indian_pines_paper", "train.iterations=10",
                                   "dataset.n_train=1000", "dataset.n_val=500"],
    "mnist conv (short)": QUICK_MNIST,
    "sgd mini-batch": ["optimizer=sgd", "train.batch_size=500", "train.iterations=100"],
    "adam mini-batch": ["optimizer=adam", "train.batch_size=500", "train.iterations=100"],
}


def run(mode: str, overrides: list[str]) -> dict:
    opts, _ = compose([f"mode={mode}", *overrides])
    ex, data, net, theta, oracle, opt = build(opts, None)
    rows = MemoryWriter()
    t0 = time.perf_counter()
    theta, out = train(theta, opt, oracle, data, opts, rows, Console(False, 1), ex)
    wall = time.perf_counter() - t0
    exact = SerialOracle(net, ex)                     # the exact objective at the result
    exact.begin(Batch(data.x_train, data.y_train))
    point = exact.value(theta)
    _, val_acc = exact.validate(theta, data.x_val, data.y_val)
    m = rows.mgrit
    n = max(len(m), 1)
    return dict(objective=point.objective, val=val_acc, iterations=out.iterations,
                stalled=out.stalled, wall=wall,
                accepted=sum(r["fwd_iterations"] + r["adj_iterations"] for r in m) / n,
                total=sum(r["fwd_total"] + r["adj_total"] for r in m) / n,
                failed=sum(r["ls_failed"] for r in rows.train),
                rung=max((r["rung"] for r in m), default=0))


HEADER = ("| configuration | its | serial J | simult. J | ratio | serial val | simult. val "
          "| Δval | MGRIT it/iter (accepted / all) | failed LS | max rung | serial s "
          "| simult. s | pass |\n|" + "---|" * 14)


def row(name: str, ser: dict, sim: dict) -> str:
    ratio = sim["objective"] / ser["objective"]
    dval = sim["val"] - ser["val"]
    ok = ratio <= 1.15 and dval >= -0.03 and not sim["stalled"]
    return (f"| {name} | {sim['iterations']} | {ser['objective']:.4f} | {sim['objective']:.4f} "
            f"| {ratio:.3f} | {ser['val']:.3f} | {sim['val']:.3f} | {dval:+.3f} "
            f"| {sim['accepted']:.2f} / {sim['total']:.2f} | {sim['failed']} | {sim['rung']} "
            f"| {ser['wall']:.1f} | {sim['wall']:.1f} | {'yes' if ok else 'NO'} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--only", nargs="*", help="configuration names (default: all)")
    p.add_argument("--out", type=Path, help="also write the table here")
    a = p.parse_args()
    names = a.only or list(MATRIX)
    lines = [HEADER]
    print(HEADER, flush=True)
    for name in names:
        over = MATRIX[name]
        line = row(name, run("serial", over), run("simultaneous", over))
        lines.append(line)
        print(line, flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
