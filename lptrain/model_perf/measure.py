"""Measure the model's inputs on this machine: the recorded kernels and a ping-pong.

Each kernel a record contains (record.py: its name and the states stacked in one call)
is timed by calling the network's own function with random inputs of the recorded
shape, at a batch of one sample and at the full batch: what a call costs besides
the samples, and per sample, for any shard in between (costs.py).  With neighbours,
each is also timed while copies of this process run it beside it: the ranks that share
a host in a run (neighbours.py).
"""
from __future__ import annotations

import inspect
import itertools
import math
import os
import time
from pathlib import Path

import torch

from lptrain.model_perf.simulate import Link

DEFAULT_LINK = Link(7e-6, 5e9)   # MPICH on one machine's loopback (BENCHMARKS.md)
_LAUNCHER_SIZE = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def seconds_per_call(fns: dict, device: str = "cpu", budget: float = 0.02,
                     rounds: int = 5, progress=None) -> dict:
    """{key: seconds of one fn() call}: the median of single calls timed over `rounds`
    visits of ~budget s each, visiting every fn in turn.

    On the CPU a call is timed by this thread's CPU time: on a shared machine other
    processes take the core away in the middle of a loop, which wall time would count
    and CPU time does not (their cache traffic still counts).  On a GPU, wall time
    after synchronising, and the 20th percentile: the least loaded calls.
    """
    return _timed(fns, device, budget, rounds, None, progress)[0]


def seconds_alone_and_shared(fns: dict, copies: int, budget: float = 0.02, rounds: int = 5,
                             progress=None) -> tuple[dict, dict]:
    """({key: seconds of one call alone}, {key: ... while `copies` forked neighbours call
    the same fn}) on the CPU, both timed in the same visits (neighbours.py)."""
    from lptrain.model_perf.neighbours import Neighbours
    with Neighbours([whole(fn) for fn in fns.values()], copies) as nb:
        alone, shared = _timed(fns, "cpu", budget, rounds, nb, progress)
        ended, idle = copies - nb.alive(), sum(c == 0 for c in nb.calls())
        if ended or idle:
            raise RuntimeError(f"of {copies} neighbour processes {ended} ended and "
                               f"{idle} made no call while kernels were timed beside them")
    return alone, shared


def cost_clock(device: str = "cpu"):
    """The clock costs are timed with: this thread's CPU time, which other processes on
    the host do not inflate; wall time on a GPU, and with several torch threads (the
    calling thread's CPU time misses the others' work and counts its own spinning)."""
    if str(device).startswith("cuda") or torch.get_num_threads() > 1:
        return time.perf_counter
    return time.thread_time


def _timed(fns: dict, device: str, budget: float, rounds: int, nb, progress=None
           ) -> tuple[dict, dict]:
    """seconds_per_call's medians alone, and beside the neighbours `nb` (when given:
    each visit times the fn alone, then with the neighbours playing it). `progress` (a
    callable) hears after each round how far they are: a loaded host stretches them."""
    gpu = str(device).startswith("cuda")
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    clock = cost_clock(device)
    reps, longest = {}, 0.0
    for key, fn in fns.items():
        whole(fn)()
        sync()
        _prepare(fn)
        t0 = time.perf_counter()
        fn()
        sync()
        longest = max(longest, time.perf_counter() - t0)
        reps[key] = max(1, int(budget / max(time.perf_counter() - t0, 1e-7)))
    start = time.perf_counter()
    seen: dict = {key: [] for key in fns}
    beside: dict = {key: [] for key in fns} if nb is not None else {}
    settle = max(2 * longest, 0.002)  # the neighbours finish a call, or start the next fn
    for r in range(rounds):
        for i, (key, fn) in enumerate(fns.items()):
            phases = [(seen[key], False)] + ([(beside[key], True)] if nb is not None else [])
            for times, playing in phases:
                if nb is not None:
                    if playing:
                        nb.play(i)
                    else:
                        nb.rest()
                    _busy(whole(fn), settle)
                for _ in range(reps[key]):
                    _prepare(fn)
                    t0 = clock()
                    fn()
                    sync()
                    times.append(clock() - t0)
        if nb is not None:
            nb.rest()
        if progress is not None:
            progress(f"timed round {r + 1} of {rounds} "
                     f"({time.perf_counter() - start:.0f} s)")
    q = 0.2 if gpu else 0.5
    return tuple({key: sorted(t)[int(q * (len(t) - 1))] for key, t in d.items()}
                 for d in (seen, beside))


def _prepare(fn) -> None:
    """What a kernel call needs done first, untimed (SerialSweep's `prepare`)."""
    prepare = getattr(fn, "prepare", None)
    if prepare is not None:
        prepare()


def whole(fn):
    """fn with its untimed preparation: what a neighbour, or a call not timed, runs."""
    if getattr(fn, "prepare", None) is None:
        return fn
    return lambda: (fn.prepare(), fn())


def _busy(fn, seconds: float) -> None:
    """Call fn, untimed, for `seconds` (while the neighbours change what they run)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn()


def cold_bytes(path: str = "/sys/devices/system/cpu/cpu0/cache/index3/size") -> int:
    """Bytes an input pool must hold to be out of cache: the last-level cache's size
    (Linux reports it as e.g. "32768K"), within [16, 64] MiB; 32 MiB if unknown."""
    try:
        text = Path(path).read_text().strip().upper()
        size = int(text.rstrip("KMG")) * {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}.get(
            text[-1], 1)
    except (OSError, ValueError, IndexError):
        return 2 ** 25
    return min(max(size, 2 ** 24), 2 ** 26)


def kernel_calls(net, theta: torch.Tensor, batch: int, kernels, pool_bytes: int | None = None,
                 max_copies: int = 256) -> dict:
    """{(name, states): closure calling that kernel once} on `batch` samples.

    Each input rotates through a pool of distinct copies holding pool_bytes
    (cold_bytes(): beyond the cache) in at most max_copies: in a run a sweep meets a
    new state every step, and what it reads (states, adjoints, the activations the
    forward kept) was written out of cache's reach (bench/kernel_context.py compares
    kernels alone and in the iteration).  The kernels of one shape share the pools.
    The serial sweeps (SERIAL_SWEEPS, composite kernels of N layers) run the sweeps
    themselves instead, on their own reused buffers (SerialSweeps): their states and
    activations stay where the other sweep left them, and λ passes from one layer to
    the next in cache, as in a serial iteration.
    The values are random: the cost of a kernel does not depend on them, its shapes do.
    """
    gen = torch.Generator().manual_seed(batch)
    stepper = net.stepper(theta)
    pool_bytes = pool_bytes or cold_bytes()
    pools: dict = {}
    out, sweeps = {}, None
    for name, m in sorted(set(kernels)):
        if name in SERIAL_SWEEPS:
            sweeps = sweeps or SerialSweeps(net, theta, batch, gen)
            out[(name, m)] = SerialSweep(name, sweeps)
            continue
        shape = net.state_dims(batch) if m == 1 else (m, *net.state_dims(batch))
        if shape not in pools:
            size = math.prod(shape) * theta.element_size()
            copies = max(1, min(max_copies, int(pool_bytes // size)))
            pools[shape] = _Pool(stepper, theta, shape, m, copies, gen)
        out[(name, m)] = _call(name, net, theta, stepper, batch, pools[shape], gen)
    return out


class _Pool:
    """`copies` random states, adjoints, products and saved activations of m stacked
    states each (shape), the weights of m layers (K, b), handed out in turn (`next`:
    the index of the next call's copy)."""

    def __init__(self, stepper, theta, shape, m: int, copies: int, gen):
        def rand():
            return torch.randn((copies, *shape), generator=gen, dtype=theta.dtype
                               ).to(theta.device)
        self.u, self.lam, self.g = 0.5 * rand(), rand(), rand()
        self.K, self.b = stepper.weights(0) if m == 1 else \
            stepper.weights_many(torch.arange(m) % stepper.n_layers)
        self.saved = torch.stack([stepper.linearize(self.u[i], self.K, self.b)
                                  for i in range(copies)])
        self.res = torch.empty(shape, dtype=theta.dtype, device=theta.device)
        self.next = itertools.cycle(range(copies)).__next__


def _call(name: str, net, theta, stepper, batch: int, pool: _Pool, gen):
    """A closure running kernel `name` once (record.py's names) on the pool's next copy."""
    u, lam, g, saved, res, h = pool.u, pool.lam, pool.g, pool.saved, pool.res, net.h
    K, b = pool.K, pool.b
    extra = (K,) if "K" in inspect.signature(stepper.vjp_weights).parameters else ()
    x = torch.randn((batch, *net.in_shape), generator=gen, dtype=theta.dtype).to(theta.device)
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
    return _KernelCall(table[name], pool)


SERIAL_SWEEPS = ("serial_forward", "serial_forward_nosave", "serial_adjoint")


class SerialSweeps:
    """The serial sweeps of all N layers as the serial oracle runs them (model/serial.py
    `propagate` and `adjoint`): on the states the network's opening gives for `batch`
    random samples, in buffers every sweep reuses (the oracle's `Buffers`), so that a
    sweep finds its storage where the other sweep left it, as in an iteration."""

    def __init__(self, net, theta, batch: int, gen):
        from lptrain.model.serial import Buffers
        x = torch.randn((batch, *net.in_shape), generator=gen, dtype=theta.dtype
                        ).to(theta.device)
        self.stepper, self.h = net.stepper(theta), net.h
        self.u0 = net.opening(theta, x)
        self.lamN = torch.randn(self.u0.shape, generator=gen, dtype=theta.dtype
                                ).to(theta.device)
        self.buffers, self.swept = Buffers(), None

    def forward(self, save: bool = True) -> None:
        from lptrain.model.serial import propagate
        self.swept = propagate(self.stepper, self.u0, self.h, save, self.buffers)

    def adjoint(self):
        """The adjoint sweep of the last forward one (which it consumes)."""
        from lptrain.model.serial import adjoint
        states, saved = self.swept
        return adjoint(self.stepper, states, saved, self.lamN, self.h)


class SerialSweep:
    """One composite kernel of the record (SERIAL_SWEEPS) on `sweeps`.  serial_adjoint's
    `prepare`, untimed, is the forward sweep that writes the states and activations it
    reads (and overwrites)."""

    def __init__(self, name: str, sweeps: SerialSweeps):
        self.name, self.sweeps = name, sweeps
        if name == "serial_adjoint":
            self.prepare = sweeps.forward

    def __call__(self):
        if self.name == "serial_adjoint":
            return self.sweeps.adjoint()
        return self.sweeps.forward(self.name == "serial_forward")


class _KernelCall:
    """One kernel's call on the next copy of its `pool`."""

    def __init__(self, fn, pool: _Pool):
        self.fn, self.pool = fn, pool

    def __call__(self):
        return self.fn(self.pool.next())


def measure_kernels(net, theta: torch.Tensor, batch: int, kernels, device: str = "cpu",
                    neighbours: int = 0, progress=None) -> tuple[dict, dict]:
    """({(name, states, b): seconds of one call} for b = 1 and b = batch, the same with
    `neighbours` forked copies of this process running each kernel beside it ({} without
    neighbours; CPU only)), all timed in the same rounds (a change of load hits them
    alike)."""
    from lptrain.parallel.context import keep_freed_memory
    # as the lptrain command runs: without it a stack of m ≥ 4 states gets fresh pages
    # for each temporary and the measured cost of stacked calls is far too high
    keep_freed_memory()
    calls = {}
    for b in sorted({1, batch}):
        calls.update({(*key, b): fn for key, fn in kernel_calls(net, theta, b, kernels).items()})
    with torch.no_grad():
        if neighbours and not str(device).startswith("cuda"):
            return seconds_alone_and_shared(calls, neighbours, progress=progress)
        return seconds_per_call(calls, device, progress=progress), {}


def host_ranks() -> int:
    """Ranks of one thread each that fit on the cores this process may use."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


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
