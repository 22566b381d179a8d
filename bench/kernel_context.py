"""The speedup model's kernel costs against the same kernels inside the real iteration.

    .venv/bin/python bench/kernel_context.py MODE [OVERRIDES ...] [--rounds R]

lptrain-model times each recorded kernel alone, on random inputs rotating through
pools beyond the cache's reach (model_perf/measure.py).  Here the configured 1-rank
iteration of MODE (mgrit or simultaneous: the training oracle as app.py builds it,
value and gradient on the configured batch, simultaneous at its fixed
fwd_iters / adj_iters) runs with the real kernels, each call timed in CPU time where
it happens.  In alternating rounds, one such iteration, then every kernel it called
timed alone as lptrain-model does (cold: pools of the last-level cache's size,
measure.cold_bytes) and with pools of at most 8 copies (warm: as the model
measured them before).  Prints per kernel the calls per iteration and
the median µs per call of the three, the kernels' total per iteration, and the
whole iteration's CPU time.

    .venv/bin/python bench/kernel_context.py serial [OVERRIDES ...] [--rounds R]

The serial forward sweep's per-layer kernel (the model records and times the sweep
whole since stop 57, `serial_forward`; before, N apply_save calls), where the
run's forward is the stepper's own sweep (`stepper.sweep`, model/serial.py): the
sweep as serial training runs it (states and activations into buffers of all N
layers, a few rotating) against N × apply_save alone, warm and cold, alternating.

    .venv/bin/python bench/kernel_context.py adjoint [OVERRIDES ...] [--rounds R]

The serial backward sweep's kernels (act_vjp and vjp_from_g per layer, one stacked
vjp_weights) timed where they run (the sweep of model/serial.py, layer by layer) and
alone under three conditions, alternating: every operand cold (the model's pools);
λ and f′ ⊙ λ hot (one copy, reused: what the previous kernel produced) and the saved
activations and states cold; the same with those from pools of one sweep's storage
(N states per operand).  Prints µs per call and the backward's ms per iteration,
with `adjoint` (model/serial.py) timed whole.

    .venv/bin/python bench/kernel_context.py pair [OVERRIDES ...] [--rounds R]

Two ranks on one host: the kernels of the configured one-shot iteration timed as
lptrain-model does, by one process alone and by two processes at once, R rounds
alternating; prints each process's kernels per iteration (the iteration's call counts).
"""
from __future__ import annotations

import argparse
import collections
import math
import statistics
import subprocess
import sys
import time
from dataclasses import replace

import torch

import common  # noqa: F401  (one thread, the allocator setting)
from lptrain.config import compose
from lptrain.data import load_dataset
from lptrain.model_perf import measure, record
from lptrain.model_perf.cli import build_network
from lptrain.model_perf.scripted import ScriptedExchange
from lptrain.model_perf.zero_cost import ZeroCostNetwork, ZeroCostStepper, apply_kernel

POOLS = {"cold (the model's)": 256, "warm": 8}    # max_copies


class TimedStepper(ZeroCostStepper):
    """The real stepper's kernels, each call reported with its CPU time."""

    def apply(self, u, K, b, h, save=None, out=None, plus=None):
        return self._report(apply_kernel(save, plus), u, self._real.apply, u, K, b, h,
                            save=save, out=out, plus=plus)

    def linearize(self, u, *args):
        return self._report("linearize", u, self._real.linearize, u, *args)

    def vjp_saved(self, saved, lam, K, h, out=None):
        return self._report("vjp_saved", lam, self._real.vjp_saved, saved, lam, K, h, out=out)

    def vjp_and_g(self, saved, lam, K, h, out=None):
        return self._report("vjp_and_g", lam, self._real.vjp_and_g, saved, lam, K, h, out=out)

    def vjp_from_g(self, g, lam, K, h, out=None):
        return self._report("vjp_from_g", lam, self._real.vjp_from_g, g, lam, K, h, out=out)

    def vjp_weights(self, u, g, K=None):
        return self._report("vjp_weights", u, self._real.vjp_weights, u, g,
                            *(() if K is None else (K,)))


class TimedNetwork(ZeroCostNetwork):
    def stepper(self, theta):
        real = self._net.stepper(theta)
        timed = TimedStepper(real, self._report, len(self._net.state_dims(1)))
        timed.act = real.act
        return timed


class Calls:
    """An observer keeping each kernel call's seconds."""

    def __init__(self):
        self.seconds = collections.defaultdict(list)

    def kernel(self, name: str, states: int, seconds: float) -> None:
        self.seconds[(name, states)].append(seconds)

    def step(self, *args) -> None:
        pass

    message = sum = step


class Iteration:
    """The configured 1-rank iteration of `mode` with timed real kernels."""

    def __init__(self, mode: str, overrides):
        opts, _ = compose(overrides)
        self.net, self.theta, self.batch = build_network(opts)
        mg = opts.mgrit if mode != "simultaneous" else replace(
            opts.mgrit, control="fixed", adaptive=False, calibrate_every=0)
        self.calls, self.ex = Calls(), ScriptedExchange(0, 1)
        timed = TimedNetwork(self.net, self.calls, math.prod(self.net.state_dims(self.batch)))
        self.oracle = record.iteration_oracle(timed, mode, mg, self.ex)
        data = load_dataset(opts.dataset, opts.seed)
        self.x = data.x_train[:self.batch].to(self.theta.dtype)
        self.y = data.y_train[:self.batch]
        self.cpu: list[float] = []

    def run(self) -> None:
        """One value and gradient, then a small step (a new point, as an optimizer's)."""
        self.ex.script(None)
        self.ex.reversed().script(None)
        t0 = time.thread_time()
        grad = record.gradient_of(self.oracle, record.value_of(self.oracle, self.theta,
                                                               self.x, self.y))
        self.cpu.append(time.thread_time() - t0)
        self.theta = self.theta - 1e-3 * grad


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("serial", "adjoint", "mgrit", "simultaneous", "pair",
                                    "_timed"))
    p.add_argument("overrides", nargs="*")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    if a.mode == "serial":
        return sweep_check(a.overrides, a.rounds)
    if a.mode == "adjoint":
        return adjoint_check(a.overrides, a.rounds)
    if a.mode in ("pair", "_timed"):
        return pair(a.overrides, a.rounds, a.mode == "_timed")
    it = Iteration(a.mode, a.overrides)
    it.run()                      # warm-up: allocations, first solves cold
    it.calls.seconds.clear()
    it.cpu.clear()
    kernels = sorted(_recorded(it))
    fns = {(pool, *key): fn for pool, copies in POOLS.items() for key, fn in
           measure.kernel_calls(it.net, it.theta, it.batch, kernels,
                                max_copies=copies).items()}
    alone = collections.defaultdict(list)
    for _ in range(a.rounds):     # alternating, so that a change of speed hits both
        it.run()
        for key, s in measure.seconds_per_call(fns, rounds=1).items():
            alone[key].append(s)
    report(a, it, kernels, alone)


def sweep_check(overrides, rounds: int, buffers: int = 4) -> None:
    opts, _ = compose(overrides)
    net, theta, batch = build_network(opts)
    stepper, shape = net.stepper(theta), net.state_dims(batch)
    N = stepper.n_layers
    states = [0.5 * torch.randn(N + 1, *shape, dtype=theta.dtype) for _ in range(buffers)]
    saved = [torch.zeros(N, *shape, dtype=theta.dtype) for _ in range(buffers)]
    fns = {pool: measure.kernel_calls(net, theta, batch, [("apply_save", 1)],
                                      max_copies=copies)[("apply_save", 1)]
           for pool, copies in POOLS.items()}
    swept, alone = [], collections.defaultdict(list)
    for r in range(rounds * 10 + buffers):
        i = r % buffers
        t0 = time.thread_time()
        stepper.sweep(states[i], saved[i], net.h)
        swept.append(time.thread_time() - t0)
        if r % 10 == 0:
            for pool, sec in measure.seconds_per_call(fns, rounds=1).items():
                alone[pool].append(sec * N)
    print(f"serial {' '.join(overrides)}: N = {N}, batch {batch}, CPU ms per forward sweep")
    print("| sweep as run | " + " | ".join(f"{N} × apply_save alone, {pool}"
                                          for pool in POOLS) + " |")
    print("|---:|" + "---:|" * len(POOLS))
    print(f"| {statistics.median(swept[buffers:]) * 1e3:.2f} | " + " | ".join(
        f"{statistics.median(alone[pool]) * 1e3:.2f}" for pool in POOLS) + " |")


BACKWARD = ("act_vjp", "vjp_from_g", "vjp_weights")
OPERANDS = {"all cold": "cold", "λ hot, rest cold": "cold",
            "λ hot, rest from the sweep's storage": "storage"}


def adjoint_check(overrides, rounds: int) -> None:
    """The serial backward's kernels in the run against alone (module docstring)."""
    from lptrain.model.serial import Buffers, adjoint, propagate
    opts, _ = compose(overrides)
    net, theta, batch = build_network(opts)
    stepper, shape = net.stepper(theta), net.state_dims(batch)
    N, h = stepper.n_layers, net.h
    kernels = [("act_vjp", 1), ("vjp_from_g", 1), ("vjp_weights", N)]
    storage = N * math.prod(shape) * theta.element_size()
    fns = {}
    for cond, pools in OPERANDS.items():
        calls = measure.kernel_calls(net, theta, batch, kernels,
                                     pool_bytes=storage if pools == "storage" else None)
        hot = cond != "all cold"
        for (name, m), fn in calls.items():
            fns[(cond, name)] = _hot_lambda(stepper, net.h, fn.pool, name) \
                if hot and name != "vjp_weights" else fn
    u0, lamN = 0.5 * torch.randn(shape, dtype=theta.dtype), torch.randn(shape, dtype=theta.dtype)
    bufs, whole, ran = Buffers(), [], collections.defaultdict(list)
    alone = collections.defaultdict(list)
    with torch.no_grad():
        for _ in range(rounds):         # alternating, so that a change of speed hits all
            for _ in range(5):
                states, saved = propagate(stepper, u0, h, buffers=bufs)
                t0 = time.thread_time()
                adjoint(stepper, states, saved, lamN, h)
                whole.append(time.thread_time() - t0)
                states, saved = propagate(stepper, u0, h, buffers=bufs)
                _timed_adjoint(stepper, states, saved, lamN, h, ran)
            for key, sec in measure.seconds_per_call(fns, rounds=1).items():
                alone[key].append(sec)
    med = statistics.median
    print(f"adjoint {' '.join(overrides)}: N = {N}, batch {batch}, {theta.dtype}, "
          f"µs per call (CPU), medians over {rounds} alternating rounds")
    print("| kernel | in the run | " + " | ".join(OPERANDS) + " |")
    print("|---|---:|" + "---:|" * len(OPERANDS))
    for name in BACKWARD:
        print(f"| {name}{f' × {N}' if name == 'vjp_weights' else ''} | {med(ran[name]) * 1e6:.1f}"
              " | " + " | ".join(f"{med(alone[(c, name)]) * 1e6:.1f}" for c in OPERANDS) + " |")

    def sweep(t):
        return N * (t("act_vjp") + t("vjp_from_g")) + t("vjp_weights")
    print(f"backward, ms: adjoint() whole {med(whole) * 1e3:.2f}, its kernels in the run "
          f"{sweep(lambda k: med(ran[k])) * 1e3:.2f}; alone: " + ", ".join(
              f"{c} {sweep(lambda k, c=c: med(alone[(c, k)])) * 1e3:.2f}" for c in OPERANDS))


def _hot_lambda(stepper, h: float, pool, name: str):
    """`name` on the pool's next saved activations (cold) with λ and f′ ⊙ λ one reused
    copy each (hot: in a sweep the previous kernel produced them)."""
    lam, g, res, K = pool.lam[0].clone(), pool.g[0].clone(), pool.res, pool.K
    if name == "act_vjp":
        return lambda: stepper.act.vjp(pool.saved[pool.next()], lam, out=res)
    hs = h * stepper.act.scale_out
    return lambda: stepper.vjp_from_g(g, lam, K, hs, out=res)


def _timed_adjoint(stepper, states, saved, lamN, h: float, ran) -> None:
    """model/serial.py's backward sweep (WEIGHTS_AFTER_SWEEP) with each kernel's CPU
    seconds appended to ran[name]."""
    act, lam, hs = stepper.act, lamN, h * stepper.act.scale_out
    K, g, clock = stepper.K.unbind(0), saved.unbind(0), time.thread_time
    for n in range(stepper.n_layers - 1, -1, -1):
        t0 = clock()
        act.vjp(g[n], lam, out=g[n])
        t1 = clock()
        lam = stepper.vjp_from_g(g[n], lam, K[n], hs)
        t2 = clock()
        ran["act_vjp"].append(t1 - t0)
        ran["vjp_from_g"].append(t2 - t1)
    t0 = clock()
    stepper.vjp_weights(states[:stepper.n_layers], saved)
    ran["vjp_weights"].append(clock() - t0)


def pair(overrides, rounds: int, child: bool) -> None:
    """Kernels per iteration measured alone and two processes at once (child: one
    measurement, its ms printed)."""
    if child:
        it = Iteration("simultaneous", overrides)
        it.run()
        counts = collections.Counter({k: len(v) for k, v in it.calls.seconds.items()})
        cost = measure.seconds_per_call(measure.kernel_calls(it.net, it.theta, it.batch,
                                                             sorted(counts)))
        print(sum(n * cost[k] for k, n in counts.items()) * 1e3)
        return
    cmd = [sys.executable, __file__, "_timed", *overrides]
    alone, together = [], []
    for _ in range(rounds):
        alone.append(float(subprocess.run(cmd, capture_output=True, text=True,
                                          check=True).stdout.split()[-1]))
        both = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
        together.append(sorted(float(p.communicate()[0].split()[-1]) for p in both))
    print(f"simultaneous {' '.join(overrides)}: kernels per iteration, ms (as measured "
          "alone by lptrain-model)")
    print("| one process alone | two at once: the faster | the slower |")
    print("|---|---|---|")
    for a, (lo, hi) in zip(alone, together):
        print(f"| {a:.1f} | {lo:.1f} | {hi:.1f} |")


def _recorded(it: Iteration) -> set:
    """The kernels one iteration calls (one more run, its times kept with the rest)."""
    it.run()
    return set(it.calls.seconds)


def report(a, it: Iteration, kernels, alone) -> None:
    runs = len(it.cpu)
    print(f"{a.mode} {' '.join(a.overrides)}: batch {it.batch}, µs per call (CPU), "
          f"medians over {a.rounds} alternating rounds")
    print("| kernel | calls / it. | in the iteration | " + " | ".join(
        f"alone, {pool}" for pool in POOLS) + " |")
    print("|---|---:|---:|" + "---:|" * len(POOLS))
    totals = [0.0] * (1 + len(POOLS))
    for key in kernels:
        n = len(it.calls.seconds[key]) / runs
        row = [statistics.median(it.calls.seconds[key]),
               *(statistics.median(alone[(pool, *key)]) for pool in POOLS)]
        totals = [t + n * s for t, s in zip(totals, row)]
        print(f"| {key[0]} × {key[1]} | {n:g} | " + " | ".join(f"{s * 1e6:.0f}" for s in row)
              + " |")
    print("| kernels per iteration, ms | | " + " | ".join(f"{t * 1e3:.1f}" for t in totals)
          + " |")
    print(f"whole iteration (value + gradient), median CPU ms: "
          f"{statistics.median(it.cpu) * 1e3:.1f}")


if __name__ == "__main__":
    main()
