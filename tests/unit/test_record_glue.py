"""The glue a record keeps: the median over the kept iterations of each rank, timed with
Python's cycle collector paused, so that a pause in one iteration does not become part of
the model (two starts of `lptrain-model` predicted 3 and 130 ms for the same cycle)."""
from __future__ import annotations

import gc

import pytest

from lptrain.model_perf import record as rec_mod
from lptrain.model_perf.record import Allreduce, Glue, Kernel, Recv, Send, median_glue


def _run(*glue):
    """Ops of one iteration: kernels, a message and a sum, with glue before each."""
    a, b, c, d = glue
    return [Glue(a), Kernel("apply", 1, 3), Glue(b), Send(1), Kernel("vjp_saved", 2),
            Glue(c), Allreduce(16), Glue(d)]


def test_each_glue_op_is_the_median_of_its_runs():
    runs = [_run(1.0, 5.0, 2.0, 0.5), _run(3.0, 4.0, 9.0, 0.7), _run(2.0, 0.2, 1.0, 0.6)]
    assert median_glue(runs) == tuple(_run(2.0, 4.0, 2.0, 0.6))


def test_a_pause_in_one_iteration_does_not_reach_the_record():
    runs = [_run(1.0, 1.0, 1.0, 1.0), _run(1.0, 130.0, 1.0, 1.0), _run(1.1, 1.0, 0.9, 1.0)]
    assert median_glue(runs) == tuple(_run(1.0, 1.0, 1.0, 1.0))


def test_glue_missing_in_a_run_counts_as_none_and_consecutive_glue_adds():
    one = [Kernel("apply"), Glue(2.0), Glue(1.0), Recv(0)]
    none = [Kernel("apply"), Recv(0)]
    assert median_glue([one, none, one]) == (Kernel("apply"), Glue(3.0), Recv(0))
    assert median_glue([none, none, one]) == (Kernel("apply"), Recv(0))


def test_runs_that_differ_in_more_than_glue_give_the_last():
    other = [Glue(1.0), Kernel("apply", 1, 2), Glue(1.0), Send(1)]
    runs = [_run(1.0, 1.0, 1.0, 1.0), other]
    assert median_glue(runs) == tuple(other)


def test_ranks_are_recorded_with_the_collector_paused_and_it_resumes(monkeypatch):
    from helpers import dense_net
    net, _ = dense_net(layers=8)
    seen = []
    real = rec_mod._rank_iterations

    def watched(*args, **kw):
        seen.append(gc.isenabled())
        return real(*args, **kw)
    monkeypatch.setattr(rec_mod, "_rank_iterations", watched)
    assert gc.isenabled()
    rec_mod.record_iteration(net, "simultaneous", rec_mod_opts(), 2, 1, 2, 2)
    assert seen == [False, False] and gc.isenabled()


def test_the_collector_stays_off_after_a_record_if_it_was_off():
    gc.disable()
    try:
        with rec_mod.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("mode", ["serial", "simultaneous"])
def test_a_rank_keeps_the_ops_of_its_warm_iterations(mode, monkeypatch):
    """Every kept iteration does the same ops, so the median leaves them as they are."""
    from helpers import dense_net
    net, _ = dense_net(layers=8)
    one = rec_mod.record_iteration(net, mode, rec_mod_opts(), 1, 1, 2, 2)
    monkeypatch.setattr(rec_mod, "KEPT", 1)
    single = rec_mod.record_iteration(net, mode, rec_mod_opts(), 1, 1, 2, 2)

    def bare(part):
        return [[op for op in ops if not isinstance(op, Glue)] for ops in part]
    assert bare(one.value) == bare(single.value)
    assert bare(one.gradient) == bare(single.gradient)


def rec_mod_opts():
    from lptrain.mgrit.options import MGRITOptions
    return MGRITOptions(levels=2, cfactor0=2, cfactor=2, tol=1e-9, max_iter=30)
