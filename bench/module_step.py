"""A training step of a user's conv ResNet with lptrain.LayerParallel against plain autograd.

    .venv/bin/python bench/module_step.py [--layers 16] [--batch 100] [--reps 5] [--rounds 5]
    .venv/bin/mpiexec -n 2 .venv/bin/python bench/module_step.py

The network is examples/fashion_resnet.py's (float32, 8 channels of 14×14, residual
branches conv–GroupNorm–ReLU–conv), one step = forward, backward and an Adam update
on a batch of random images.  Variants, timed in alternation (rounds × reps steps,
the median of the rounds reported, wall-clock and CPU time of the slowest rank: on a
shared machine the CPU time is the steadier of the two):
  plain      the same network written as a loop over an nn.ModuleList (1 process)
  plain-cl   the same with its states in channels_last memory format (as LayerParallel
             hands them to the residual branches)
  serial     LayerParallel.serial(): the reference, layers stepped with autograd
  converged  LayerParallel: forward and adjoint MGRIT to a tolerance
  one-shot   LayerParallel: 2 forward + 2 adjoint iterations, warm-started
  one-shot-1 the same with 1 + 1 iterations

    .venv/bin/python bench/module_step.py --account one-shot [--reps 12]

times instead one variant's steps (1 rank) with the CPU time of each call of its step
family (forward steps, linearisations, vector-Jacobian products) summed by kind: calls
per step, ms per call and per step, and what the step spends beyond those calls.
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch
from torch import nn

from common import save
from lptrain import LayerParallel, MGRITOptions
from lptrain.model.module_steps import ModuleSteps
from lptrain.model.module_vjp import Linear
from lptrain.parallel.context import world

SOLVERS = {"converged": (dict(tol=1e-6, max_iter=40), False),
           "one-shot": (dict(tol=0.0, max_iter=2, adj_max_iter=2), True),
           "one-shot-1": (dict(tol=0.0, max_iter=1, adj_max_iter=1), True)}


def block(n: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, padding=1))


class Net(nn.Module):
    def __init__(self, layers: int, body: nn.Module | None):
        super().__init__()
        torch.manual_seed(0)
        self.open = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2, padding=1), nn.ReLU())
        self.blocks = nn.ModuleList(block(n) for n in range(layers)) if body is None else None
        self.body, self.h = body, 2.0 / layers
        self.head = nn.Sequential(nn.AvgPool2d(2), nn.Flatten(), nn.Linear(8 * 7 * 7, 10))
        self.serial = False
        self.channels_last = False

    def forward(self, x):
        u = self.open(x)
        if self.channels_last:
            u = u.contiguous(memory_format=torch.channels_last)
        if self.blocks is not None:
            for f in self.blocks:
                u = u + self.h * f(u)
        else:
            u = self.body.serial(u) if self.serial else self.body(u)
        return self.head(u)


def lp_net(layers: int, solver: str, comm=None) -> Net:
    """The network with a LayerParallel body solved as SOLVERS[solver] says."""
    opts, warm = SOLVERS[solver]
    return Net(layers, LayerParallel(block, T=2.0, n_layers=layers, comm=comm,
                                     warm_start=warm,
                                     mgrit=MGRITOptions(levels=2, cfactor0=4, **opts)))


def batch(size: int):
    """Random images and labels, the same in every run."""
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(size, 1, 28, 28, generator=gen),
            torch.randint(10, (size,), generator=gen))


def variants(layers: int, comm, size: int) -> dict:
    out = {}
    if size == 1:
        out["plain"] = Net(layers, None)
        out["plain-cl"] = Net(layers, None)
        out["plain-cl"].channels_last = True
        serial = Net(layers, LayerParallel(block, T=2.0, n_layers=layers))
        serial.serial = True
        out["serial"] = serial
    for name in SOLVERS:
        out[name] = lp_net(layers, name, comm)
    return out


def stepper(net, x, y, call=None):
    """One Adam step of `net` on (x, y); call: what computes net(x) (e.g. a compiled net)."""
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    call = net if call is None else call

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(call(x), y).backward()
        opt.step()
    return step


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--account", choices=list(SOLVERS), help="time this variant's calls")
    a = p.parse_args()
    if a.account:
        return account(a)
    comm = world()
    size, rank = comm.Get_size(), comm.Get_rank()
    x, y = batch(a.batch)
    nets = variants(a.layers, comm if size > 1 else None, size)
    steps = {k: stepper(net, x, y) for k, net in nets.items()}
    for step in steps.values():
        step()                                        # warm-up
    wall, cpu = {k: [] for k in steps}, {k: [] for k in steps}
    for _ in range(a.rounds):
        for k, step in steps.items():                 # alternate the variants
            comm.Barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(a.reps):
                step()
            wall[k].append(comm.allreduce(time.perf_counter() - t0, op=_max()) / a.reps)
            cpu[k].append(comm.allreduce(time.process_time() - c0, op=_max()) / a.reps)
    if rank != 0:
        return
    rows = []
    for k in steps:
        body = nets[k].body
        iters = "" if body is None or nets[k].serial else \
            f"{body.last_forward.iterations}/{body.last_backward.iterations}"
        w, c = 1e3 * statistics.median(wall[k]), 1e3 * statistics.median(cpu[k])
        rows.append({"variant": k, "ranks": size, "wall_ms": w, "cpu_ms": c,
                     "iterations": iters})
        print(f"| {k:10s} | {size} | {w:8.1f} | {c:8.1f} | {iters:6s} |")
    save(f"module_step_{size}", {"args": vars(a), "rows": rows})


CALLS = ((ModuleSteps, "step"), (ModuleSteps, "linearize"), (Linear, "vjp_state"),
         (Linear, "vjp_params"), (Linear, "vjp_both"))


def account(a) -> None:
    """CPU time of a one-rank variant's step-family calls, by kind, per step."""
    spent, count, depth = collections.Counter(), collections.Counter(), [0]

    def timed(name, call):
        def wrapper(*args, **kw):
            depth[0] += 1
            c0 = time.process_time()
            try:
                return call(*args, **kw)
            finally:
                depth[0] -= 1
                if depth[0] == 0:          # calls inside calls count once, outermost
                    spent[name] += time.process_time() - c0
                    count[name] += 1
        return wrapper
    for cls, name in CALLS:
        if hasattr(cls, name):
            setattr(cls, name, timed(name, getattr(cls, name)))
    net = lp_net(a.layers, a.account)
    x, y = batch(a.batch)
    step, plain = stepper(net, x, y), stepper(Net(a.layers, None), x, y)
    step(), step(), plain()
    spent.clear(), count.clear()
    total = plain_total = 0.0
    for _ in range(a.reps):                        # alternating with plain autograd
        c0 = time.process_time()
        step()
        c1 = time.process_time()
        plain()
        total, plain_total = total + c1 - c0, plain_total + time.process_time() - c1
    total, plain_total = total / a.reps, plain_total / a.reps
    for name in count:
        print(f"| {name:10s} | {count[name] / a.reps:5.1f} | "
              f"{1e3 * spent[name] / count[name]:6.3f} | {1e3 * spent[name] / a.reps:7.1f} |")
    inside = sum(spent.values()) / a.reps
    print(f"step {1e3 * total:.1f} ms, in these calls {1e3 * inside:.1f}, beyond "
          f"{1e3 * (total - inside):.1f}; plain autograd {1e3 * plain_total:.1f}")


def _max():
    from mpi4py import MPI
    return MPI.MAX


if __name__ == "__main__":
    main()
