"""lptrain's serial training step against a plain PyTorch autograd network.

    .venv/bin/python bench/serial_step.py [--layers 256] [--batch 5000] [--reps 7]

One step = forward + backward + an SGD update of all parameters, float32 and
float64.  The plain version is the same network written with autograd.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from common import data, network, save, timeit
from lptrain.config.schema import SGDOptions
from lptrain.mgrit.exchange import SerialExchange
from lptrain.train.optimizers import SGD
from lptrain.train.objective import Objective
from lptrain.train.oracles import Batch, SerialOracle


def plain_step(net, theta, x, y, lr=1e-3):
    """Autograd: u ← u + h·tanh(K u + b) for N layers, cross-entropy, SGD."""
    v = {k: t.detach().clone().requires_grad_() for k, t in net.layout.views(theta).items()}

    def step():
        u = torch.tanh(x @ v["open_K"].t() + v["open_b"])
        for n in range(net.opts.layers):
            u = u + net.h * torch.tanh(u @ v["K"][n].t() + v["b"][n])
        loss = F.cross_entropy(u @ v["W"].t() + v["mu"], y)
        loss.backward()
        with torch.no_grad():
            for t in v.values():
                t -= lr * t.grad
                t.grad = None
    return step


def lptrain_step(net, theta, x, y, lr=1e-3):
    oracle = Objective(SerialOracle(net, SerialExchange()), net)
    opt = SGD(SGDOptions(lr=lr, momentum=0.0))
    oracle.begin(Batch(x, y))
    state = {"theta": theta.clone()}

    def step():
        state["theta"], _ = opt.step(state["theta"], oracle)
    return step


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=256)
    p.add_argument("--batch", type=int, default=5000)
    p.add_argument("--reps", type=int, default=7)
    a = p.parse_args()
    rows = []
    for dtype in (torch.float32, torch.float64):
        net, theta = network(a.layers, dtype=dtype)
        x, y = data(a.batch, dtype=dtype)
        plain = timeit(plain_step(net, theta, x, y), a.reps)
        ours = timeit(lptrain_step(net, theta, x, y), a.reps)
        rows.append({"dtype": str(dtype).split(".")[-1], "plain_s": plain, "lptrain_s": ours,
                     "ratio": ours / plain})
        print(f"{rows[-1]['dtype']}: plain {plain * 1e3:.1f} ms, lptrain {ours * 1e3:.1f} ms, "
              f"lptrain/plain {ours / plain:.2f}")
    save("serial_step", {"layers": a.layers, "batch": a.batch, "width": 8, "rows": rows})


if __name__ == "__main__":
    main()
