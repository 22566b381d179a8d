"""Critical-path evaluation of a schedule: a discrete-event run of every rank's ops: pure.

Each rank executes its ops in order on its own clock.  A step costs its
measured time (`StepCosts.time`); a send costs the sender nothing and its
state arrives α + bytes/β later; a receive completes at
max(own clock, arrival); an allreduce waits for every rank and then costs
2·ceil(log2 P)·(α + bytes/β) (recursive doubling, reduce + broadcast).
Messages between two ranks arrive in the order sent, as MPI guarantees.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from lptrain.errors import LptrainError
from lptrain.model_perf.schedule import (ADJOINT, DERIVATIVE, FORWARD, LINEARIZE, WEIGHTS,
                                         Allreduce, Recv, Schedule, Send, Step)


class ScheduleError(LptrainError):
    """A schedule cannot run: a receive without its send, or ranks at different allreduces."""


@dataclass(frozen=True)
class StepCosts:
    """Seconds per layer step with the full batch, alone in its kernel call.

    A call of m states (one per MGRIT interval), each with batch share s, costs
    (o + s·(t − o)) · m · r(m): o is the batch-independent part of a call
    (`overheads` per kind, else `overhead`), r(m) the cost of m states in one
    call over m single calls (`stacking`: measured points, interpolated in
    log m, constant beyond the last; 1 without data).
    adjoint is the state VJP with σ′ given; derivative (σ′ from saved
    activations) defaults to 0, i.e. counted in `adjoint`; linearize (σ′
    recomputed from a state) defaults to `forward`.
    """

    forward: float
    adjoint: float
    weights: float
    derivative: float = 0.0
    linearize: float | None = None
    overhead: float = 0.0
    overheads: tuple = ()  # ((cost kind, seconds), ...)
    stacking: tuple = ()   # ((cost kind, ((m, ratio), ...)), ...)

    def per_step(self, cost: str) -> float:
        table = {FORWARD: self.forward, ADJOINT: self.adjoint, WEIGHTS: self.weights,
                 DERIVATIVE: self.derivative,
                 LINEARIZE: self.forward if self.linearize is None else self.linearize}
        return table[cost]

    def call_overhead(self, cost: str) -> float:
        return min(dict(self.overheads).get(cost, self.overhead), self.per_step(cost))

    def ratio(self, cost: str, m: float) -> float:
        """Cost of m states in one call over that of m calls of one state."""
        points = dict(self.stacking).get(cost, ())
        if m <= 1 or not points:
            return 1.0
        xs, ys = [1.0] + [float(p[0]) for p in points], [1.0] + [p[1] for p in points]
        if m >= xs[-1]:
            return ys[-1]
        k = next(i for i, x in enumerate(xs) if x >= m)
        w = math.log(m / xs[k - 1]) / math.log(xs[k] / xs[k - 1])
        return ys[k - 1] + w * (ys[k] - ys[k - 1])

    def time(self, step: Step) -> float:
        t, o = self.per_step(step.cost), self.call_overhead(step.cost)
        m = step.count / step.calls
        return step.count * (o + step.share * (t - o)) * self.ratio(step.cost, m)


UNIT_COSTS = StepCosts(1.0, 1.0, 1.0)


@dataclass(frozen=True)
class Link:
    """Message latency α [s] and bandwidth β [bytes/s] between two ranks."""

    latency: float
    bandwidth: float

    def message(self, nbytes: int) -> float:
        return self.latency + nbytes / self.bandwidth

    def allreduce(self, nbytes: int, size: int) -> float:
        return 2 * math.ceil(math.log2(size)) * self.message(nbytes) if size > 1 else 0.0


FREE_LINK = Link(0.0, math.inf)


@dataclass(frozen=True)
class Timeline:
    """The outcome of a simulation: when each rank finished and what it did."""

    finish: tuple[float, ...]    # clock of each rank after its last op
    compute: tuple[float, ...]   # time each rank spent in steps

    @property
    def makespan(self) -> float:
        return max(self.finish)


def simulate(schedule: Schedule, costs: StepCosts, link: Link) -> Timeline:
    """Run every rank's ops from clock 0; raises ScheduleError on a deadlock."""
    sim = _Run(schedule, costs, link)
    sim.run()
    return Timeline(tuple(sim.clock), tuple(sim.busy))


def critical_steps(schedule: Schedule) -> float:
    """Steps on the critical path: every step costs 1, messages and sums cost nothing."""
    return simulate(schedule, UNIT_COSTS, FREE_LINK).makespan


class _Run:
    """The event loop: ranks run until blocked; a send or a full allreduce wakes others."""

    def __init__(self, schedule: Schedule, costs: StepCosts, link: Link):
        self.ops, self.costs, self.link = schedule, costs, link
        self.size = len(schedule)
        self.pc = [0] * self.size
        self.clock = [0.0] * self.size
        self.busy = [0.0] * self.size
        self.mail: dict[tuple[int, int], deque] = {}
        self.waiting_on: dict[tuple[int, int], int] = {}   # channel -> blocked receiver
        self.at_barrier: list[int] = []

    def run(self):
        ready = deque(range(self.size))
        while ready:
            while ready:
                ready.extend(self._advance(ready.popleft()))
            if self.at_barrier:
                ready.extend(self._release())
        stuck = [r for r in range(self.size) if self.pc[r] < len(self.ops[r])]
        if stuck:
            r = stuck[0]
            raise ScheduleError(f"rank {r} blocked at op {self.pc[r]}: "
                                f"{self.ops[r][self.pc[r]]}")

    def _advance(self, r: int) -> list[int]:
        """Run rank r until it blocks or ends; return the ranks its sends woke."""
        woken, ops = [], self.ops[r]
        while self.pc[r] < len(ops):
            op = ops[self.pc[r]]
            if isinstance(op, Step):
                dt = self.costs.time(op)
                self.clock[r] += dt
                self.busy[r] += dt
            elif isinstance(op, Send):
                channel = (r, op.peer)
                arrival = self.clock[r] + self.link.message(op.nbytes)
                self.mail.setdefault(channel, deque()).append(arrival)
                if channel in self.waiting_on:
                    woken.append(self.waiting_on.pop(channel))
            elif isinstance(op, Recv):
                box = self.mail.get((op.peer, r))
                if not box:
                    self.waiting_on[(op.peer, r)] = r
                    return woken
                self.clock[r] = max(self.clock[r], box.popleft())
            elif isinstance(op, Allreduce):
                self.at_barrier.append(r)
                return woken
            self.pc[r] += 1
        return woken

    def _release(self) -> list[int]:
        """Finish the allreduce once every rank has reached one."""
        if len(self.at_barrier) < self.size:
            return []
        ops = [self.ops[r][self.pc[r]] for r in self.at_barrier]
        end = max(self.clock) + self.link.allreduce(max(op.nbytes for op in ops), self.size)
        for r in range(self.size):
            self.clock[r] = end
            self.pc[r] += 1
        woke, self.at_barrier = self.at_barrier, []
        return woke
