"""Forked neighbours (model_perf/neighbours.py): they run what is played, rest, stop, and
a kernel is timed alone and beside them in the same rounds (measure.py)."""
from __future__ import annotations

import multiprocessing
import os
import time

import pytest
import torch

from lptrain.model_perf.measure import seconds_alone_and_shared
from lptrain.model_perf.neighbours import Neighbours

WAIT = 20.0    # seconds a change may take to show on a loaded machine


def _counting():
    """Two functions that count their calls in shared memory (seen by the parent)."""
    counts = multiprocessing.get_context("fork").Array("i", 2)

    def make(i):
        def fn():
            counts[i] += 1
            time.sleep(1e-4)
        return fn
    return counts, [make(0), make(1)]


def _until(cond) -> bool:
    deadline = time.monotonic() + WAIT
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_neighbours_call_what_is_played_and_nothing_at_rest():
    counts, fns = _counting()
    with Neighbours(fns, 2) as nb:
        assert nb.alive() == 2
        time.sleep(0.05)
        assert list(counts) == [0, 0]                      # resting at the start
        nb.play(1)
        assert _until(lambda: counts[1] > 50) and counts[0] == 0
        assert _until(lambda: all(c > 0 for c in nb.calls()))      # both children play
        nb.rest()
        time.sleep(0.05)
        settled = counts[1]
        time.sleep(0.1)
        assert counts[1] == settled
        nb.play(0)
        assert _until(lambda: counts[0] > 50)
        with pytest.raises(IndexError):
            nb.play(2)
        children = list(nb._children)
    assert not any(c.is_alive() for c in children)          # stopped on exit
    assert all(c.exitcode == 0 for c in children)


def test_no_neighbours_is_this_process_alone():
    counts, fns = _counting()
    with Neighbours(fns, 0) as nb:
        nb.play(0)
        time.sleep(0.05)
        assert nb.alive() == 0 and list(counts) == [0, 0] and nb.calls() == []
    with pytest.raises(ValueError, match="-1"):
        Neighbours(fns, -1)


def test_a_kernel_is_timed_alone_and_beside_its_neighbours():
    torch.set_num_threads(1)
    x = torch.randn(512, 512, dtype=torch.float64)
    fns = {"matmul": lambda: x @ x, "sum": lambda: x.sum()}
    alone, shared = seconds_alone_and_shared(fns, copies=1, budget=0.005, rounds=2)
    assert set(alone) == set(shared) == set(fns)
    assert all(t > 0 for t in [*alone.values(), *shared.values()])
    assert alone["matmul"] > alone["sum"] and shared["matmul"] > shared["sum"]


def test_a_neighbour_that_fails_stops_the_measurement():
    """It ends before its first call is counted: whether it has ended by the time the
    timing does (a loaded machine may start it late), it made no call."""
    parent = os.getpid()

    def fails_in_a_child():
        if os.getpid() != parent:
            os._exit(3)
        time.sleep(1e-3)
    with pytest.raises(RuntimeError, match=r"of 1 neighbour processes (1 ended|.* 1 made no)"):
        seconds_alone_and_shared({"k": fails_in_a_child}, copies=1, budget=0.01, rounds=3)
