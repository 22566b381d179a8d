"""Critical-path evaluation of a recorded schedule: a discrete-event run of every rank's ops: pure.

Each layer rank executes its ops (record.py) in order on its own clock.  A kernel or
glue op costs what `seconds(op)` says; a send costs the sender nothing and its states arrive
α + bytes/β later; a receive completes at max(own clock, arrival); a layer-group sum
waits for every rank and then costs 2·ceil(log2 L)·(α + bytes/β) (recursive doubling,
reduce + broadcast); a sum over the D data groups costs the same with D and waits for
nothing (the same rank of every group reaches it at the same time).  Messages between
two ranks arrive in the order sent, as MPI guarantees.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Callable

from lptrain.errors import LptrainError
from lptrain.model_perf.record import DATA, Allreduce, Glue, Kernel, Recv, Schedule, Send


class ScheduleError(LptrainError):
    """A schedule cannot run: a receive without its send, or ranks at different sums."""


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
    """The outcome of a simulation: when each rank finished and what it computed."""

    finish: tuple[float, ...]    # clock of each rank after its last op
    compute: tuple[float, ...]   # time each rank spent in kernels

    @property
    def makespan(self) -> float:
        return max(self.finish)


def simulate(schedule: Schedule, seconds: Callable[[Kernel], float], link: Link,
             state_bytes: int = 0, data: int = 1) -> Timeline:
    """Run every rank's ops from clock 0; raises ScheduleError on a deadlock.

    seconds(op): the time of a Kernel (all its calls) or Glue op; state_bytes: one state
    message;
    data: the data groups a DATA sum is over.
    """
    sim = _Run(schedule, seconds, link, state_bytes, data)
    sim.run()
    return Timeline(tuple(sim.clock), tuple(sim.busy))


class _Run:
    """The event loop: ranks run until blocked; a send or a full sum wakes others."""

    def __init__(self, schedule, seconds, link: Link, state_bytes: int, data: int):
        self.ops, self.seconds, self.link = schedule, seconds, link
        self.state_bytes, self.data = state_bytes, data
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
            if isinstance(op, (Kernel, Glue)):
                dt = self.seconds(op)
                self.clock[r] += dt
                self.busy[r] += dt
            elif isinstance(op, Send):
                channel = (r, op.peer)
                arrival = self.clock[r] + self.link.message(op.states * self.state_bytes)
                self.mail.setdefault(channel, deque()).append(arrival)
                if channel in self.waiting_on:
                    woken.append(self.waiting_on.pop(channel))
            elif isinstance(op, Recv):
                box = self.mail.get((op.peer, r))
                if not box:
                    self.waiting_on[(op.peer, r)] = r
                    return woken
                self.clock[r] = max(self.clock[r], box.popleft())
            elif isinstance(op, Allreduce) and op.group == DATA:
                self.clock[r] += self.link.allreduce(op.nbytes, self.data)
            elif isinstance(op, Allreduce):
                self.at_barrier.append(r)
                return woken
            self.pc[r] += 1
        return woken

    def _release(self) -> list[int]:
        """Finish the layer group's sum once every rank has reached one."""
        if len(self.at_barrier) < self.size:
            return []
        ops = [self.ops[r][self.pc[r]] for r in self.at_barrier]
        end = max(self.clock) + self.link.allreduce(max(op.nbytes for op in ops), self.size)
        for r in range(self.size):
            self.clock[r] = end
            self.pc[r] += 1
        woke, self.at_barrier = self.at_barrier, []
        return woke
