"""LayerParallelResNet (lptrain's dense steps) against LayerParallel of the same layers as
torch modules: time of one forward + backward, converged and fixed (one rank).

    .venv/bin/python bench/module_vs_dense.py [--layers 64] [--width 8] [--batch 256]

Decides whether LayerParallelResNet can become a thin user of LayerParallel.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from common import save
from lptrain import LayerParallel, LayerParallelResNet, MGRITOptions


class Dense(nn.Module):
    """u ↦ tanh(K u + b): LayerParallelResNet's step as a module."""

    def __init__(self, K, b):
        super().__init__()
        self.K, self.b = nn.Parameter(K.clone()), nn.Parameter(b.clone())

    def forward(self, u):
        return torch.tanh(torch.addmm(self.b, u, self.K.t()))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=64)
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    x = torch.randn(a.batch, a.width, generator=torch.Generator().manual_seed(0),
                    dtype=torch.float64)
    rows, cpu = [], {}
    for label, opts in (("converged", dict(tol=1e-9, max_iter=50)),
                        ("fixed 2+2", dict(tol=0.0, max_iter=2, adj_max_iter=2))):
        mgrit = MGRITOptions(levels=3, cfactor0=4, **opts)
        dense = LayerParallelResNet(a.width, a.layers, T=2.0, activation="tanh", mgrit=mgrit,
                                    init_scale=0.5)
        mods = [Dense(dense.K[n].detach(), dense.b[n].detach()) for n in range(a.layers)]
        module = LayerParallel(mods, T=2.0, mgrit=mgrit)
        runs = {f"LayerParallelResNet {label}": dense, f"LayerParallel {label}": module}
        for k, m in runs.items():
            cpu[k] = []
        for _ in range(a.rounds):
            for k, m in runs.items():
                c0 = time.process_time()
                for _ in range(a.reps):
                    m(x).pow(2).sum().backward()
                cpu[k].append((time.process_time() - c0) / a.reps)
        out_d, out_m = dense(x), module(x)
        assert label != "converged" or float((out_d - out_m).detach().abs().max()) < 1e-6
    for k, ts in cpu.items():
        rows.append({"variant": k, "cpu_ms": 1e3 * statistics.median(ts)})
        print(f"| {k:32s} | {1e3 * statistics.median(ts):8.1f} |")
    save("module_vs_dense", {"args": vars(a), "rows": rows})


if __name__ == "__main__":
    main()
