"""Measure the model's inputs on this machine: step costs of a network and a ping-pong.

Step costs are timed on one layer of the configured network with a random
state batch of the configured size (the values do not matter, the shapes
do), alone and with m states stacked in one call (as the solver batches its
intervals).  Per-call overheads come from an affine fit t(b) = o + s·b
through the full batch and a batch of one.
"""
from __future__ import annotations

import itertools
import math
import os
import time

import torch

from lptrain.model_perf.schedule import ADJOINT, DERIVATIVE, FORWARD, LINEARIZE, WEIGHTS
from lptrain.model_perf.simulate import Link, StepCosts

DEFAULT_LINK = Link(7e-6, 5e9)   # MPICH on one machine's loopback (BENCHMARKS.md)
_LAUNCHER_SIZE = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def seconds_per_call(fns: dict, device: str = "cpu", budget: float = 0.02,
                     rounds: int = 5) -> dict:
    """{key: seconds of one fn() call}: the least over `rounds` of loops of ~budget s.

    The rounds visit every fn in turn, so a change of load on the machine hits
    all of them alike; the least, because other load only ever adds time.
    """
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    reps = {}
    for key, fn in fns.items():
        fn()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        reps[key] = max(1, int(budget / max(time.perf_counter() - t0, 1e-7)))
    best = dict.fromkeys(fns, math.inf)
    for _ in range(rounds):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(reps[key]):
                fn()
            sync()
            best[key] = min(best[key], (time.perf_counter() - t0) / reps[key])
    return best


def _kernels(stepper, u: torch.Tensor, m: int, h: float) -> dict:
    """Closures running each kind of step on m states (m = 1: one state, unstacked).

    u is a pool of distinct inputs, (copies, [m,] batch, ...); every call takes
    the next one, as a sweep through the layers meets a new state every step
    (a pool larger than the caches costs what a sweep costs).  σ′ and the
    adjoints are random stand-ins: the cost does not depend on the values.
    """
    K, b = stepper.weights(0) if m == 1 else \
        stepper.weights_many(torch.arange(m) % stepper.n_layers)
    dsig, lam = torch.rand_like(u), torch.randn_like(u)
    nxt = itertools.cycle(range(u.shape[0])).__next__

    def adjoint():
        i = nxt()
        stepper.vjp_state(dsig[i], lam[i], K, h)

    def weights():
        i = nxt()
        stepper.vjp_weights(u[i], lam[i])
    return {FORWARD: lambda: stepper.apply(u[nxt()], K, b, h),
            ADJOINT: adjoint,
            LINEARIZE: lambda: stepper.linearize(u[nxt()], K, b),
            DERIVATIVE: lambda: stepper.act.derivative(dsig[nxt()]),
            WEIGHTS: weights}


def _stack_kernels(net, theta, batch: int, m: int, pool_bytes: float, device: str) -> dict:
    """{(kind, m): closure} for m states of `batch` samples, from a pool of pool_bytes."""
    shape = net.state_dims(batch) if m == 1 else (m, *net.state_dims(batch))
    copies = max(1, int(pool_bytes // (math.prod(shape) * theta.element_size())))
    gen = torch.Generator().manual_seed(m)
    u = 0.5 * torch.randn((copies, *shape), generator=gen, dtype=torch.float64)
    kernels = _kernels(net.stepper(theta), u.to(dtype=theta.dtype, device=device), m, net.h)
    return {(kind, m): fn for kind, fn in kernels.items()}


def measure_costs(net, theta: torch.Tensor, batch: int, device: str = "cpu",
                  max_stack: int = 32, pool_bytes: float = 2 ** 26) -> StepCosts:
    """StepCosts of net at this batch size.

    Inputs rotate through pools of the network's states, at most pool_bytes
    (the states of a one-rank sweep, if smaller).  Per kind, the overhead is
    the affine fit through batch 1 and the full batch; stacking ratios
    T(m) / (m·T(1)) are measured for m = 2, 4, ... ≤ max_stack, each in the
    same rounds as its own T(1).
    """
    state = batch * math.prod(net.state_shape) * theta.element_size()
    pool = min(pool_bytes, (net.opts.layers + 1) * state)
    stacks = [2 ** k for k in range(1, 12) if 2 ** k <= max_stack and 2 ** k * state <= pool]
    with torch.no_grad():
        one = seconds_per_call(_stack_kernels(net, theta, 1, 1, pool, device), device)
        groups = [seconds_per_call({**_stack_kernels(net, theta, batch, 1, pool, device),
                                    **_stack_kernels(net, theta, batch, m, pool, device)},
                                   device) for m in stacks or [1]]
    kinds = [kind for kind, _ in one]
    full = {k: min(t[(k, 1)] for t in groups) for k in kinds}
    overheads = {k: min(max((batch * one[(k, 1)] - full[k]) / max(batch - 1, 1), 0.0),
                        full[k]) for k in kinds}
    curves = {k: tuple((m, t[(k, m)] / (m * t[(k, 1)])) for m, t in zip(stacks, groups))
              for k in kinds}
    return StepCosts(forward=full[FORWARD], adjoint=full[ADJOINT], weights=full[WEIGHTS],
                     derivative=full[DERIVATIVE], linearize=full[LINEARIZE],
                     overhead=overheads[FORWARD], overheads=tuple(overheads.items()),
                     stacking=tuple((k, v) for k, v in curves.items() if v))


def launched_size() -> int:
    """Ranks of the mpiexec that started this process (1 when not launched by one)."""
    for key in _LAUNCHER_SIZE:
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 1


def ping_pong(comm, nbytes: int = 1 << 20, rounds: int = 10, reps: int = 20) -> Link:
    """α and β between ranks 0 and 1 of comm (others idle); every rank gets the result.

    α is half the round trip of an 8-byte message, β the large message's bytes
    over its half round trip less α; each the least over `rounds` loops of
    `reps` round trips (other load only adds time).
    """
    import numpy as np
    halves = [min(_round_trips(comm, np.zeros(size // 8), reps) for _ in range(rounds))
              for size in (8, nbytes)]
    alpha = halves[0]
    beta = nbytes / max(halves[1] - alpha, 1e-12)
    alpha, beta = comm.bcast((alpha, beta), root=0)
    return Link(alpha, beta)


def _round_trips(comm, buf, reps: int) -> float:
    """Half the mean round trip of buf between ranks 0 and 1 (0 on other ranks)."""
    rank = comm.Get_rank()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(reps if rank < 2 else 0):
        if rank == 0:
            comm.Send(buf, dest=1)
            comm.Recv(buf, source=1)
        else:
            comm.Recv(buf, source=0)
            comm.Send(buf, dest=0)
    return (time.perf_counter() - t0) / (2 * reps)
