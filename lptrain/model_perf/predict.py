"""Predicted time per optimizer iteration of each mode on P ranks: schedules × costs.

    time(mode, P) = trials · T(value schedule) + T(gradient schedule)

with T the simulated makespan (simulate.py).  serial is data parallel (the
batch split over P ranks), mgrit runs forward and adjoint MGRIT for a given
number of cycles to tolerance, simultaneous for mgrit.fwd_iters /
mgrit.adj_iters cycles.  All solves are warm (every optimizer iteration but
the first).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from lptrain.model_perf import modes
from lptrain.model_perf.modes import Workload
from lptrain.model_perf.schedule import (ADJOINT, COLD, FIRST, FORWARD, FRESH,
                                         hierarchy_for, iteration_schedule, max_ranks,
                                         mirrored)
from lptrain.model_perf.simulate import Link, StepCosts, simulate


@dataclass(frozen=True)
class Counts:
    """Run outcomes the schedule cannot know: evaluations and cycles per iteration."""

    trials: float = 1.0    # objective evaluations per optimizer iteration (line search)
    mgrit_fwd: float = 5   # mode=mgrit: forward cycles until the tolerance is met
    mgrit_adj: float = 5   # mode=mgrit: adjoint cycles until the tolerance is met


@dataclass(frozen=True)
class Machine:
    """The measured costs: steps and messages."""

    costs: StepCosts
    link: Link


@dataclass(frozen=True)
class Prediction:
    """Seconds per optimizer iteration on `ranks` ranks (None: the solver refuses P)."""

    ranks: int
    serial: float
    mgrit: float | None = None
    simultaneous: float | None = None
    fwd_iteration: float | None = None   # one later forward MGRIT iteration (fresh F-points)
    adj_iteration: float | None = None   # the same for the adjoint
    cold_iteration: float | None = None  # first forward iteration of a cold start

    @property
    def possible(self) -> bool:
        return self.simultaneous is not None


def _makespan(schedule, m: Machine) -> float:
    return simulate(schedule, m.costs, m.link).makespan


def serial_time(size: int, w: Workload, m: Machine, trials: float = 1.0) -> float:
    """Data-parallel layer-serial optimizer iteration."""
    return trials * _makespan(modes.serial_value(size, w), m) + \
        _makespan(modes.serial_gradient(size, w), m)


def parallel_time(size: int, w: Workload, opts, m: Machine, fwd: float, adj: float,
                  converged: bool, trials: float = 1.0) -> float:
    """Layer-parallel optimizer iteration with fwd / adj MGRIT cycles per solve.

    Fractional cycle counts (means over a run) interpolate linearly.
    """
    def value(k: int) -> float:
        return _makespan(modes.parallel_value(size, w, opts, k, converged), m)

    def gradient(k: int) -> float:
        return _makespan(modes.parallel_gradient(size, w, opts, k, converged), m)
    return trials * _interpolate(value, fwd) + _interpolate(gradient, adj)


def _interpolate(f, x: float) -> float:
    lo = math.floor(x)
    return f(lo) if x == lo else f(lo) + (x - lo) * (f(lo + 1) - f(lo))


def iteration_time(size: int, w: Workload, opts, m: Machine, which: str = FRESH,
                   adjoint: bool = False) -> float | None:
    """One MGRIT iteration alone (None with one level, which has no iterations)."""
    hier = hierarchy_for(w.n_layers, opts, size)
    if len(hier.levels) < 2:
        return None
    if adjoint:
        sched = mirrored(iteration_schedule(hier.reversed(), opts, which, w.state_bytes,
                                            ADJOINT, linear=True))
    else:
        sched = iteration_schedule(hier, opts, which, w.state_bytes, FORWARD)
    return _makespan(sched, m)


def predict_at(size: int, w: Workload, opts, m: Machine,
               counts: Counts = Counts()) -> Prediction:
    """Every mode on `size` ranks; layer-parallel entries None beyond max_ranks."""
    serial = serial_time(size, w, m, counts.trials)
    if size > max_ranks(w.n_layers, opts):
        return Prediction(size, serial)
    return Prediction(
        size, serial,
        mgrit=parallel_time(size, w, opts, m, counts.mgrit_fwd, counts.mgrit_adj, True,
                            counts.trials),
        simultaneous=parallel_time(size, w, opts, m, opts.fwd_iters, opts.adj_iters, False,
                                   counts.trials),
        fwd_iteration=iteration_time(size, w, opts, m, FRESH),
        adj_iteration=iteration_time(size, w, opts, m, FRESH, adjoint=True),
        cold_iteration=iteration_time(size, w, opts, m, first_kind(opts, cold=True)))


def first_kind(opts, cold: bool) -> str:
    """Which iteration opens a solve (schedule.KINDS)."""
    return COLD if cold and opts.skip_first_down else FIRST


def predict_all(ranks, w: Workload, opts, m: Machine,
                counts: Counts = Counts()) -> list[Prediction]:
    """predict_at() for each P in `ranks`."""
    return [predict_at(p, w, opts, m, counts) for p in ranks]
