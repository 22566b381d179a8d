"""Seconds of the optimizer's own arithmetic per iteration, measured on this host.

After the gradient sums every rank holds the whole gradient and runs the optimizer
(train/optimizers.py; on P ranks L-BFGS recurses over a 1/P part of its pairs, which
predict.Machine.optimizer_at charges): L-BFGS's two-loop recursion over its
memory of m pairs, the line-search point θ + αd and the new pair; SGD's and Adam's
updates.  On a wide network this is no small part of an iteration: on Indian Pines
(1.3 M parameters, m = 20) about 4m passes over the parameters.  The record
(record.py) runs `value` and `gradient` only, so the cost is measured here by running
the configured optimizer against an oracle that costs nothing: a quadratic whose
curvature pairs are accepted (the memory fills as in training) and whose every
line-search trial is accepted (one evaluation per iteration; a further trial adds
one pass over θ, not charged).  The median over a few iterations after the memory
is full, in this thread's CPU time, is kept per host and configuration (costs.py),
with what each pair of the memory adds to the recursion (timed over all pairs and
over none): a run's early iterations, or those after a reset, recurse over fewer
pairs, and a measured run is predicted iteration by iteration (runs.py).  With
host_ranks > 1 the iterations are also timed while host_ranks − 1 forked copies run
theirs (neighbours.py): on a wide network the recursion streams the memory's pairs,
and ranks on one host share its memory bandwidth.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass

import torch

from lptrain.model_perf.measure import cost_clock
from lptrain.train.optimizers import OPTIMIZERS
from lptrain.train.protocol import Evaluated, Point

KEPT = 5          # iterations timed once the optimizer's state is full


class FreeOracle:
    """J with gradient D θ (D > 0 diagonal, spread over three decades: no quick
    convergence, sᵀy > 0 for every pair) and an objective that falls by a constant
    at every evaluation, so that the first trial of every line search is accepted.
    `spent` is the CPU time taken inside it, which the measurement leaves out."""

    def __init__(self, theta: torch.Tensor):
        gen = torch.Generator().manual_seed(0)
        self.diag = torch.logspace(-3, 0, theta.numel(), dtype=theta.dtype) \
            [torch.randperm(theta.numel(), generator=gen)].to(theta.device)
        self.j, self.spent, self.clock = 0.0, 0.0, cost_clock(theta.device)

    def value(self, theta: torch.Tensor) -> Evaluated:
        t0 = self.clock()
        self.j -= 1e100
        ev = Evaluated(point=Point(objective=self.j, loss=0.0, accuracy=0.0), theta=theta,
                       tape=True)
        self.spent += self.clock() - t0
        return ev

    def gradient(self, ev: Evaluated) -> torch.Tensor:
        t0 = self.clock()
        g = self.diag * ev.theta
        self.spent += self.clock() - t0
        return g

    def accept(self, ev: Evaluated) -> None:
        pass

    def tighten(self) -> bool:
        return False

    def relax(self) -> None:
        pass


def warm_iterations(opts) -> int:
    """Iterations before the optimizer's state is what it is in a long run."""
    return getattr(opts, "memory", 0) + 2


@dataclass(frozen=True)
class OptimizerCost:
    """CPU seconds of one iteration with the memory full, and what each of its `memory`
    pairs adds (0 for optimizers without one); `shared`: the seconds with host_ranks
    ranks at once on the host (None: not measured)."""

    seconds: float
    per_pair: float = 0.0
    memory: int = 0
    shared: float | None = None


def seconds_per_iteration(opts, theta: torch.Tensor, kept: int = KEPT, host_ranks: int = 1
                          ) -> OptimizerCost:
    """The cost of one iteration of optimizer `opts` (an optimizer node: name, ...) on
    θ's size, dtype and device, the oracle's own time left out: alone, and beside
    host_ranks − 1 copies of this process iterating theirs."""
    from lptrain.model_perf.neighbours import Neighbours
    from lptrain.parallel.context import keep_freed_memory
    keep_freed_memory()            # as the lptrain command runs
    optimizer = OPTIMIZERS[opts.name](opts, total=warm_iterations(opts) + 2 * kept + 1)
    oracle = FreeOracle(theta)
    at = [theta.detach().clone()]

    def iteration() -> float:
        spent, t0 = oracle.spent, oracle.clock()
        at[0], _ = optimizer.step(at[0], oracle)
        return oracle.clock() - t0 - (oracle.spent - spent)
    for _ in range(warm_iterations(opts)):
        iteration()
    full = max(statistics.median(iteration() for _ in range(kept)), 0.0)
    shared = None
    if host_ranks > 1 and not str(theta.device).startswith("cuda"):
        with Neighbours([iteration], host_ranks - 1) as nb:
            nb.play(0)
            iteration()            # while the neighbours start theirs
            shared = max(statistics.median(iteration() for _ in range(kept)), 0.0)
    memory = getattr(opts, "memory", 0)
    return OptimizerCost(full, min(per_pair(optimizer, at[0], kept), full / max(memory, 1)),
                         memory, shared)


def per_pair(optimizer, g: torch.Tensor, reps: int = KEPT) -> float:
    """Seconds a pair of a full L-BFGS memory adds to its two-loop recursion: the
    recursion over all pairs against none, alternating, medians (0 without a memory)."""
    mem = getattr(optimizer, "mem", None)
    if not mem:
        return 0.0
    pairs, times, clock = list(mem), {True: [], False: []}, cost_clock(g.device)
    try:
        for _ in range(reps):
            for full in (True, False):
                optimizer.mem.clear()
                optimizer.mem.extend(pairs if full else ())
                t0 = clock()
                optimizer.direction(g)
                times[full].append(clock() - t0)
    finally:
        optimizer.mem.clear()
        optimizer.mem.extend(pairs)
    return max(statistics.median(times[True]) - statistics.median(times[False]), 0.0) \
        / len(pairs)


def optimizer_config(opts, theta: torch.Tensor, threads: int) -> dict:
    """What the cost depends on: the optimizer's options, θ's size, dtype and device."""
    return {"optimizer": asdict(opts), "parameters": theta.numel(),
            "dtype": str(theta.dtype).removeprefix("torch."), "device": str(theta.device),
            "threads": threads, "torch": torch.__version__}


def measured_optimizer(opts, theta: torch.Tensor, threads: int, fresh: bool = False,
                       host_ranks: int = 1) -> tuple[OptimizerCost, str]:
    """(the cost per iteration, where it came from): kept for this host and
    configuration (with its shared cost if measured with host_ranks ranks at once),
    else measured now and kept."""
    from lptrain.model_perf.costs import cache_file, keep_json
    config = optimizer_config(opts, theta, threads)
    path = cache_file(config, "optimizer_costs")
    if not fresh:
        try:
            kept = json.loads(path.read_text())
            shared = kept.get("shared") if kept.get("host_ranks", 1) == host_ranks else None
            if host_ranks == 1 or shared is not None:
                return OptimizerCost(float(kept["seconds"]), float(kept["per_pair"]),
                                     int(kept["memory"]),
                                     None if shared is None else float(shared)), \
                    "kept, measured earlier"
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    cost = seconds_per_iteration(opts, theta, host_ranks=host_ranks)
    keep_json(path, {"config": config, "host_ranks": host_ranks, **asdict(cost)})
    return cost, "measured now"
