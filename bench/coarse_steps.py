"""User coarse steps against the default (the fine f with the coarse step size): MGRIT
iterations and CPU time of one converged forward + backward, one rank.

    .venv/bin/python bench/coarse_steps.py [--layers 16] [--batch 32] [--rounds 5]

The step is examples/fashion_resnet.py's (conv, GroupNorm, ReLU, conv; 8 channels,
14×14); its coarse variants: `cheap` drops the GroupNorm (its convolutions follow the
fine layers), `exact` steps the covered fine layers one after another (converges in
one cycle at the cost of a fine sweep per coarse step).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from common import save
from lptrain import LayerParallel, MGRITOptions


def block(n):
    return nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1)).double()


def cheap(c):
    return nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.Identity(), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1)).double()


class Exact(nn.Module):
    def __init__(self, fine, c, h):
        super().__init__()
        self.fine, self.c, self.h = fine, c, h     # fine: outside the module tree

    def forward(self, u):
        v = u
        for n in self.c.layers:
            v = v + self.h * self.fine[n](v)
        return (v - u) / self.c.h


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    torch.manual_seed(0)
    layers = [block(n) for n in range(a.layers)]
    h = 2.0 / a.layers
    x = torch.randn(a.batch, 8, 14, 14, dtype=torch.float64)
    mgrit = MGRITOptions(levels=2, cfactor0=4, tol=1e-9, max_iter=50, adj_tol=1e-9)
    runs = {"default": None, "cheap": cheap, "exact": lambda c: Exact(layers, c, h)}
    mods = {k: LayerParallel(layers, T=2.0, mgrit=mgrit, coarse_steps=f)
            for k, f in runs.items()}
    cpu = {k: [] for k in mods}
    for _ in range(a.rounds):
        for k, m in mods.items():
            c0 = time.process_time()
            m(x).pow(2).sum().backward()
            cpu[k].append(time.process_time() - c0)
    rows = []
    for k, m in mods.items():
        row = {"coarse": k, "fwd_iters": m.last_forward.iterations,
               "adj_iters": m.last_backward.iterations,
               "cpu_ms": 1e3 * statistics.median(cpu[k])}
        rows.append(row)
        print(f"| {k:8s} | {row['fwd_iters']:3d} | {row['adj_iters']:3d} | "
              f"{row['cpu_ms']:8.1f} |")
    save("coarse_steps", {"args": vars(a), "rows": rows})


if __name__ == "__main__":
    main()
