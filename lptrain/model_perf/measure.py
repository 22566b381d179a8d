"""Measure the model's inputs on this machine: the recorded kernels and a ping-pong.

Each kernel a record contains (record.py: its name and the states stacked in one call)
is timed by calling the network's own function with random inputs of the recorded
shape, at a batch of one sample and at the full batch: what a call costs besides
the samples, and per sample, for any shard in between (costs.py).
"""
from __future__ import annotations

import inspect
import itertools
import math
import os
import time

import torch

from lptrain.model_perf.simulate import Link

DEFAULT_LINK = Link(7e-6, 5e9)   # MPICH on one machine's loopback (BENCHMARKS.md)
_LAUNCHER_SIZE = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def seconds_per_call(fns: dict, device: str = "cpu", budget: float = 0.02,
                     rounds: int = 5) -> dict:
    """{key: seconds of one fn() call}: the median of single calls timed over `rounds`
    visits of ~budget s each, visiting every fn in turn.

    On the CPU a call is timed by this thread's CPU time: on a shared machine other
    processes take the core away in the middle of a loop, which wall time would count
    and CPU time does not (their cache traffic still counts).  On a GPU, wall time
    after synchronising, and the 20th percentile: the least loaded calls.
    """
    gpu = str(device).startswith("cuda")
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    clock = time.perf_counter if gpu else time.thread_time
    reps = {}
    for key, fn in fns.items():
        fn()
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        reps[key] = max(1, int(budget / max(time.perf_counter() - t0, 1e-7)))
    seen: dict = {key: [] for key in fns}
    for _ in range(rounds):
        for key, fn in fns.items():
            times = seen[key]
            for _ in range(reps[key]):
                t0 = clock()
                fn()
                sync()
                times.append(clock() - t0)
    q = 0.2 if gpu else 0.5
    return {key: sorted(t)[int(q * (len(t) - 1))] for key, t in seen.items()}


def kernel_calls(net, theta: torch.Tensor, batch: int, kernels, pool_bytes: float = 2 ** 26
                 ) -> dict:
    """{(name, states): closure calling that kernel once} on `batch` samples.

    Inputs rotate through a pool of distinct copies (at most pool_bytes), as a sweep
    through the layers meets a new state every step.  The values are random: the
    cost of a kernel does not depend on them, its shapes do.
    """
    gen = torch.Generator().manual_seed(batch)
    stepper = net.stepper(theta)
    out = {}
    for name, m in sorted(set(kernels)):
        shape = net.state_dims(batch) if m == 1 else (m, *net.state_dims(batch))
        copies = max(1, min(8, int(pool_bytes // (math.prod(shape) * theta.element_size()))))
        out[(name, m)] = _call(name, net, theta, stepper, shape, m, batch, copies, gen)
    return out


def _call(name: str, net, theta, stepper, shape, m: int, batch: int, copies: int, gen):
    """A closure running kernel `name` once (record.py's names)."""
    def rand(*dims):
        return torch.randn(dims, generator=gen, dtype=theta.dtype).to(theta.device)
    u, lam = 0.5 * rand(copies, *shape), rand(copies, *shape)
    N = stepper.n_layers
    K, b = stepper.weights(0) if m == 1 else stepper.weights_many(torch.arange(m) % N)
    saved = torch.stack([stepper.linearize(u[i], K, b) for i in range(copies)])
    g, res, h = rand(copies, *shape), torch.empty(shape, dtype=theta.dtype,
                                                   device=theta.device), net.h
    nxt = itertools.cycle(range(copies)).__next__
    extra = (K,) if "K" in inspect.signature(stepper.vjp_weights).parameters else ()
    x = rand(batch, *net.in_shape)
    labels = torch.arange(batch, device=theta.device) % net.n_classes
    grad = torch.zeros_like(theta)
    table = {
        "apply": lambda i: stepper.apply(u[i], K, b, h, out=res),
        "apply_save": lambda i: stepper.apply(u[i], K, b, h, save=saved[i], out=res),
        "apply_plus": lambda i: stepper.apply(u[i], K, b, h, out=res, plus=lam[i]),
        "apply_save_plus": lambda i: stepper.apply(u[i], K, b, h, save=saved[i], out=res,
                                                   plus=lam[i]),
        "linearize": lambda i: stepper.linearize(u[i], K, b),
        "vjp_saved": lambda i: stepper.vjp_saved(saved[i], lam[i], K, h, out=res),
        "vjp_and_g": lambda i: stepper.vjp_and_g(saved[i], lam[i], K, h, out=res),
        "vjp_from_g": lambda i: stepper.vjp_from_g(g[i], lam[i], K, h, out=res),
        "act_vjp": lambda i: stepper.act.vjp(saved[i], lam[i], out=res),
        "vjp_weights": lambda i: stepper.vjp_weights(u[i], g[i], *extra),
        "opening": lambda i: net.opening(theta, x),
        "opening_vjp": lambda i: net.opening_vjp(theta, x, lam[i], grad),
        "classify": lambda i: net.classify(theta, u[i], labels, batch, False),
        "classify_grad": lambda i: net.classify(theta, u[i], labels, batch, True),
        "regulariser": lambda i: net.regulariser(theta),
        "regulariser_grad": lambda i: net.regulariser(theta, grad)}
    if name not in table:
        raise ValueError(f"kernel {name!r}: not one the model can measure ({sorted(table)})")
    fn = table[name]
    return lambda: fn(nxt())


def measure_kernels(net, theta: torch.Tensor, batch: int, kernels, device: str = "cpu"
                    ) -> dict:
    """{(name, states, b): seconds of one call} for b = 1 and b = batch, all timed in
    the same rounds (a change of load hits them alike)."""
    from lptrain.parallel.context import keep_freed_memory
    # as the lptrain command runs: without it a stack of m ≥ 4 states gets fresh pages
    # for each temporary and the measured cost of stacked calls is far too high
    keep_freed_memory()
    calls = {}
    for b in sorted({1, batch}):
        calls.update({(*key, b): fn for key, fn in kernel_calls(net, theta, b, kernels).items()})
    with torch.no_grad():
        return seconds_per_call(calls, device)


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
