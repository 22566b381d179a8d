"""Copies of this process that run the kernel being timed, as the other ranks on a host do.

In a run the ranks that share a host share its last-level cache and memory bandwidth,
and they run the same sweeps at about the same time: a kernel timed alone is faster
than it is inside a run on P ranks.  `Neighbours` forks `copies` children that call
the function this process plays (`play(i)`: fns[i]) in a loop, idle (`rest()`) or stop;
their time is not counted, what they cost the timed calls is.

The children are forked: they inherit the kernels' closures and inputs as they are
(copy-on-write) and never touch MPI or a GPU; call it only with one torch thread (a
forked child of a process that has run OpenMP threads can hang in them).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import time
from typing import Callable, Sequence

REST, STOP = -1, -2
PAUSE = 1e-3       # seconds a resting child sleeps between looks at what to play
STOP_WAIT = 10.0   # seconds to wait for a child to stop before killing it


class Neighbours:
    """`copies` forked children calling fns[i] while this process plays i (a context
    manager: the children start on entry and stop on exit)."""

    def __init__(self, fns: Sequence[Callable[[], object]], copies: int):
        if copies < 0:
            raise ValueError(f"neighbours: copies must be >= 0, got {copies}")
        self.fns, self.copies = list(fns), copies
        self._playing = self._calls = None
        self._children: list = []

    def __enter__(self) -> "Neighbours":
        if self.copies:
            ctx = multiprocessing.get_context("fork")
            self._playing = ctx.Value("i", REST, lock=False)
            self._calls = ctx.Array("q", self.copies, lock=False)
            self._children = [ctx.Process(target=_loop, args=(self.fns, self._playing,
                                                              self._calls, k), daemon=True)
                              for k in range(self.copies)]
            for child in self._children:
                child.start()
        return self

    def play(self, i: int) -> None:
        """The children call fns[i] from their next call on."""
        if not 0 <= i < len(self.fns):
            raise IndexError(f"neighbours: no function {i} of {len(self.fns)}")
        self._set(i)

    def rest(self) -> None:
        """The children stop calling once their current call returns."""
        self._set(REST)

    def alive(self) -> int:
        """Children still running."""
        return sum(child.is_alive() for child in self._children)

    def calls(self) -> list[int]:
        """Calls each child has made so far."""
        return [] if self._calls is None else list(self._calls)

    def _set(self, value: int) -> None:
        if self._playing is not None:
            self._playing.value = value

    def __exit__(self, *exc) -> None:
        self._set(STOP)
        deadline = time.monotonic() + STOP_WAIT
        for child in self._children:
            child.join(max(deadline - time.monotonic(), 0.0))
            if child.is_alive():
                child.kill()
                child.join()
        self._children, self._playing = [], None


def _loop(fns, playing, calls, k: int) -> None:
    """Child k: call what the parent plays, counting in calls[k], until it says stop (or
    goes away). SIGINT and SIGTERM are the parent's to handle (a terminal's Ctrl-C
    reaches the whole process group): it stops the children on its way out."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = os.getppid()
    while True:
        i = playing.value
        if i == STOP or os.getppid() != parent:
            return
        if i == REST:
            time.sleep(PAUSE)
        else:
            fns[i]()
            calls[k] += 1
