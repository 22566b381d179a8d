"""Peak memory of training steps of bench/module_step.py's network with a LayerParallel
body: the process's peak resident size after the first step and after the last.

    .venv/bin/python bench/module_memory.py one-shot|converged [--layers 16]
        [--batch 100] [--steps 4]

One process per measurement (a peak never goes down). A step that leaves graphs of the
solves alive until the next step shows as growth from the second step on: the next
forward and backward then run beside the last one's activations.
"""
from __future__ import annotations

import argparse
import resource

import torch

from module_step import SOLVERS, batch, lp_net


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("solver", choices=sorted(SOLVERS))
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    torch.manual_seed(0)
    net = lp_net(a.layers, a.solver)
    x, y = batch(a.batch)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    peaks = []
    for _ in range(a.steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        peaks.append(peak_mib())
    print(f"{a.solver}, N = {a.layers}, batch {a.batch}: peak {peaks[0]:.0f} MiB after "
          f"1 step, {peaks[-1]:.0f} MiB after {a.steps} (+{peaks[-1] - peaks[0]:.0f})")


if __name__ == "__main__":
    main()
