"""The per-iteration guards: the divergence rule and the agreement on a stop signal."""
import math
import os
import signal

import pytest
import torch

from lptrain.errors import DivergedError, Interrupted, RunFileError
from lptrain.metrics.schema import MetricsFileError
from lptrain.metrics.writer import NullWriter
from lptrain.mgrit.exchange import SerialExchange
from lptrain.train.guard import DIVERGENCE_FACTOR, NoStop, Progress, StopSignals
from lptrain.train.stop import _FAILED as FAILED
from lptrain.train.stop import ROWS_KEPT, ROWS_LOST
from lptrain.train.stop import _WEIGHT as W


def test_divergence_rule_keeps_the_last_good_parameters():
    p = Progress(torch.zeros(2))
    p.check(1, 2.0, torch.ones(2))
    p.check(2, 2.0 * DIVERGENCE_FACTOR, torch.full((2,), 2.0))   # at the bound: still fine
    assert (p.iteration, p.first_objective) == (2, 2.0)
    # with what to try (it said only the numbers)
    with pytest.raises(DivergedError, match=r"iteration 3 exceeds 1000 x the first "
                       r"iteration's 2\.000e\+00: lower the step size \(optimizer.lr; "
                       r"L-BFGS: optimizer.step0\) or check the data scaling$"):
        p.check(3, 2.0 * DIVERGENCE_FACTOR * 1.0001, torch.full((2,), 3.0))
    assert p.iteration == 2 and torch.equal(p.theta, torch.full((2,), 2.0))
    for bad in (math.nan, math.inf):
        with pytest.raises(DivergedError, match="iteration 4"):
            p.check(4, bad, torch.zeros(2))
    assert p.iteration == 2
    # SGD/Adam's first objective is at the initial parameters: no step size to blame
    # (held-out: an MGRIT solve that overflowed at θ0 was told to lower the step size)
    with pytest.raises(DivergedError, match=r"^diverged: objective inf at the initial "
                                            r"parameters, before any step: check network.T"):
        Progress(torch.zeros(2)).check(1, math.inf, torch.zeros(2), at_start=True)


def test_parameters_whose_objective_comes_with_the_next_step_wait_for_it():
    """SGD and Adam report the objective of the parameters a step started from: the new
    ones are last good, and a candidate for the best, only once the next step's objective
    passes or the run ends; a checkpoint, which a resumed run starts from, counts them."""
    p = Progress(torch.zeros(1))
    p.check(1, 2.0, torch.ones(1), at_start=True)            # J(θ_0); θ_1 pending
    p.validated(1, 0.5, 0.9, torch.ones(1))
    assert (p.iteration, p.best, p.validation, p.best_state()) == (0, None, None, None)
    # a checkpoint of θ_1 keeps it pending, with the last good and θ_1's validation
    again = Progress(torch.zeros(1))
    again.load_best(p.best_state())
    again.load_pending(p.pending_state(), torch.ones(1), 1)
    assert (again.iteration, again.theta.item(), again.pending.iteration,
            again.pending.accuracy) == (0, 0.0, 1, 0.9)
    with pytest.raises(DivergedError, match="iteration 2"):
        again.check(2, math.inf, torch.full((1,), 2.0), at_start=True)
    assert again.iteration == 0 and again.best is None       # θ_1 never passed
    with pytest.raises(DivergedError, match="iteration 2"):
        p.check(2, math.nan, torch.full((1,), 2.0), at_start=True)     # J(θ_1) bad
    assert p.iteration == 0 and p.theta.item() == 0 and p.best is None
    q = Progress(torch.zeros(1))
    q.check(1, 2.0, torch.ones(1), at_start=True)
    q.validated(1, 0.5, 0.9, torch.ones(1))
    q.check(2, 1.0, torch.full((1,), 2.0), at_start=True)    # J(θ_1) fine: θ_1 passed
    assert (q.iteration, q.theta.item(), q.best.iteration, q.validation_of(1)) == \
        (1, 1.0, 1, (0.5, 0.9))
    q.validated(2, 0.4, 0.95, torch.full((1,), 2.0))
    q.finish()                                                # the run ended after 2
    assert (q.iteration, q.theta.item(), q.best.iteration, q.pending) == (2, 2.0, 2, None)
    # its files have θ_2; a run carrying it on checks θ_2 first (its best: before it)
    assert q.pending_state()["iteration"] == 1 and q.best_state()["iteration"] == 1


def test_a_diverging_sgd_run_keeps_the_parameters_before_the_bad_step():
    """The objective SGD reports at iteration k is that of θ_{k-1}: where it diverges,
    θ_{k-1} is the bad one (model-last.pt had held it)."""
    from helpers import MemoryWriter
    from lptrain.app import build
    from lptrain.config import compose
    from lptrain.metrics.console import Console
    from lptrain.train.loop import train
    opts, _ = compose(["optimizer=sgd", "optimizer.lr=1e8", "train.iterations=5",
                       "network.layers=4", "dataset.n_train=100", "dataset.n_val=20",
                       "eval_every=1"])
    ex, data, net, theta, oracle, opt = build(opts, None)
    progress = Progress(theta)
    with pytest.raises(DivergedError, match="at iteration 2"):
        train(theta, opt, oracle, data, opts, MemoryWriter(), Console(False, 1), ex,
              progress)
    assert progress.iteration == 0 and torch.equal(progress.theta, theta)
    assert progress.best.iteration == 0


@pytest.mark.parametrize("optimizer", ["lbfgs", "sgd"])
def test_a_run_not_finite_at_the_initial_parameters_keeps_its_row(optimizer):
    """L-BFGS raised at its first evaluation, before any row: metrics.h5 had no train/
    group, and the failed solve's MGRIT record was lost (held-out); SGD kept both."""
    from helpers import MemoryWriter
    from lptrain.app import build
    from lptrain.config import compose
    from lptrain.metrics.console import Console
    from lptrain.train.loop import train
    opts, _ = compose([f"optimizer={optimizer}", "train.iterations=3", "mode=simultaneous",
                       "network=custom", "network.step._target_=custom_step_pkg.NotFinite",
                       "+network.step.width=4", "network.width=4", "network.layers=4",
                       "mgrit.levels=2", "mgrit.cfactor0=2", "dataset.n_train=100",
                       "dataset.n_val=20"])
    ex, data, net, theta, oracle, opt = build(opts, None)
    rows = MemoryWriter()
    with pytest.raises(DivergedError, match=r"^diverged: objective nan at the initial "
                                            r"parameters, before any step"):
        train(theta, opt, oracle, data, opts, rows, Console(False, 1), ex, Progress(theta))
    assert [r["iteration"] for r in rows.train] == [1] and math.isnan(rows.train[0]["objective"])
    assert [r["iteration"] for r in rows.mgrit] == [1]


def test_an_sgd_run_carried_on_keeps_what_the_whole_run_keeps_where_it_diverges(tmp_path):
    """A run of one iteration (completed) carried on to 20: it diverges at iteration 2 as
    the whole run does, and both model files are iteration 0's; the carried-on run had
    kept the diverged parameters of iteration 1 in both."""
    from helpers import composed
    from lptrain import app
    from lptrain.model.saved import load_model

    def cfg(iterations):
        return composed("optimizer=sgd", "optimizer.lr=1e8", "network.layers=4",
                        "dataset.n_train=100", "dataset.n_val=20", "eval_every=1",
                        f"train.iterations={iterations}")
    for d in ("whole", "parts"):
        (tmp_path / d).mkdir()
    with pytest.raises(DivergedError, match="at iteration 2"):
        app.run(cfg(20), None, tmp_path / "whole")
    app.run(cfg(1), None, tmp_path / "parts")
    with pytest.raises(DivergedError, match="at iteration 2"):
        app.run(cfg(20), None, tmp_path / "parts", resume=True)
    for which in ("best", "last"):
        whole, parts = (load_model(tmp_path / d, which) for d in ("whole", "parts"))
        assert whole.iteration == parts.iteration == 0
        assert torch.equal(whole.theta, parts.theta)


def test_a_resumed_sgd_run_stopped_before_its_first_step_leaves_the_files_alone(tmp_path):
    """Review: a finished SGD run resumed for more and stopped at once rewrote model.pt
    and model-last.pt with older parameters (the checkpoint's θ waits for its check)."""
    from helpers import composed
    from lptrain import app
    from lptrain.errors import Interrupted
    from lptrain.model.saved import load_model
    from lptrain.train.stop import NoStop

    class StopNow(NoStop):
        def check(self, exchange, iteration, writer=None, signals=True):
            raise Interrupted(int(signal.SIGINT), iteration)

    def cfg(iterations):
        return composed("optimizer=sgd", "optimizer.lr=0.5", "network.layers=4",
                        "dataset.n_train=100", "dataset.n_val=20", "eval_every=1",
                        f"train.iterations={iterations}")
    tmp_path.mkdir(exist_ok=True)
    app.run(cfg(4), None, tmp_path)
    before = {w: load_model(tmp_path, w) for w in ("best", "last")}
    assert before["last"].iteration == 4
    with pytest.raises(Interrupted):
        app.run(cfg(8), None, tmp_path, StopNow(), resume=True)
    for which, model in before.items():
        after = load_model(tmp_path, which)
        assert after.iteration == model.iteration and torch.equal(after.theta, model.theta)


def test_a_non_finite_objective_of_sgd_ends_with_its_row_and_the_rules_line(tmp_path):
    """optimizer.lr=1e300: 'objective became inf' from inside the step, without the
    'diverged:' README promises and without the iteration's row."""
    from helpers import composed
    from lptrain import app
    from lptrain.metrics import schema as ms
    from lptrain.metrics.reader import read_metrics
    from lptrain.model.saved import load_model
    tmp_path.mkdir(exist_ok=True)
    with pytest.raises(DivergedError, match=r"^diverged: objective inf at iteration 2: "
                       r"lower the step size"):
        app.run(composed("optimizer=sgd", "optimizer.lr=1e300", "network.layers=4",
                         "dataset.n_train=100", "dataset.n_val=20", "train.iterations=5"),
                None, tmp_path)
    m = read_metrics(tmp_path / ms.FILE_NAME)
    assert list(m.train[ms.ITERATION]) == [1, 2] and m.train[ms.OBJECTIVE][1] == math.inf
    assert load_model(tmp_path, "last").iteration == 0
    # with MGRIT: the iteration's own solve record, its forward solve alone (it had
    # repeated the last one's; then it had none, and the console repeated the last
    # iteration's numbers)
    (tmp_path / "mgrit").mkdir()
    with pytest.raises(DivergedError):
        app.run(composed("optimizer=sgd", "optimizer.lr=1e300", "network.layers=4",
                         "dataset.n_train=100", "dataset.n_val=20", "train.iterations=5",
                         "mode=mgrit", "mgrit.levels=2", "mgrit.cfactor0=2"),
                None, tmp_path / "mgrit")
    m = read_metrics(tmp_path / "mgrit" / ms.FILE_NAME)
    assert list(m.train[ms.ITERATION]) == [1, 2] and list(m.mgrit[ms.ITERATION]) == [1, 2]
    assert m.mgrit[ms.ADJ_ITERATIONS][0] > 0 and m.mgrit[ms.ADJ_ITERATIONS][1] in (0, -1)


def test_reference_is_the_first_objective_even_if_it_is_tiny():
    p = Progress(torch.zeros(1))
    p.check(1, 0.0, torch.zeros(1))
    with pytest.raises(DivergedError):
        p.check(2, 1e-8, torch.zeros(1))     # 1e-8 > 1e3 · 1e-12


def test_the_best_is_the_highest_accuracy_then_the_lowest_loss_and_a_copy():
    p = Progress(torch.zeros(1))
    theta = torch.zeros(1)
    for k, loss, acc in [(0, 2.0, 0.2), (4, 1.0, 0.6), (8, 0.9, 0.5), (12, 0.8, 0.6),
                         (16, 0.9, 0.6), (20, math.nan, 0.6)]:
        theta.fill_(k)            # the optimizer may write into the same storage
        p.validated(k, loss, acc, theta)
    assert (p.best.iteration, p.best.loss, p.best.accuracy) == (12, 0.8, 0.6)
    assert p.best.theta.item() == 12 and p.validation == (20, math.nan, 0.6)
    assert p.validation_of(20) == (math.nan, 0.6) and p.validation_of(16) is None
    again = Progress(torch.zeros(1))
    again.load_best(p.best_state())
    assert again.best == p.best and again.validation == p.validation
    again.load_best(None)         # a checkpoint from before the best was kept
    assert again.best is None and again.validation is None


class Sum:
    """An exchange of two ranks whose other rank contributes `other`."""

    size = 2

    def __init__(self, other):
        self.other = other

    def allreduce_sum(self, value):
        return value + self.other


@pytest.fixture
def signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield StopSignals().install()
    for s, h in saved.items():
        signal.signal(s, h)


def test_a_signal_is_recorded_not_raised(signals):
    assert signals.agreed(SerialExchange())[0] is None
    os.kill(os.getpid(), signal.SIGINT)       # no KeyboardInterrupt
    assert signals.received == signal.SIGINT
    with pytest.raises(Interrupted) as exc:
        signals.check(SerialExchange(), 7)
    assert (exc.value.exit_code, exc.value.iteration) == (130, 7)
    assert str(exc.value) == "interrupted by SIGINT after iteration 7"
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)       # a later SIGINT does not weaken SIGTERM
    assert signals.agreed(SerialExchange())[0] == signal.SIGTERM


def test_a_closed_terminal_stops_the_run_as_sigterm_does(signals):
    """SIGHUP (a terminal or tmux window closed) was left to MPI's debug handler: the
    run went on and printed 240 lines of UCX debug output at its end."""
    os.kill(os.getpid(), signal.SIGHUP)
    with pytest.raises(Interrupted) as exc:
        signals.check(SerialExchange(), 4)
    assert (exc.value.exit_code, str(exc.value)) == (
        129, "interrupted by SIGHUP after iteration 4")
    os.kill(os.getpid(), signal.SIGINT)       # weaker: kept SIGHUP
    os.kill(os.getpid(), signal.SIGTERM)      # stronger
    assert signals.received == signal.SIGTERM


def test_ranks_agree_whichever_rank_got_the_signal(signals):
    assert signals.agreed(Sum(0.0))[0] is None
    # only the other rank got SIGINT / SIGTERM; several SIGINTs never read as SIGTERM
    assert signals.agreed(Sum(1.0))[0] == signal.SIGINT
    assert signals.agreed(Sum(W[signal.SIGTERM]))[0] == signal.SIGTERM
    os.kill(os.getpid(), signal.SIGINT)
    assert signals.agreed(Sum(1.0))[0] == signal.SIGINT
    assert signals.agreed(Sum(W[signal.SIGTERM]))[0] == signal.SIGTERM
    # a closed terminal's SIGHUP on one rank beats SIGINTs on (nearly) any number
    assert signals.agreed(Sum(W[signal.SIGHUP] + 2.0 ** 14 - 2))[0] == signal.SIGHUP
    assert signals.agreed(Sum(2.0 ** 14 - 2))[0] == signal.SIGINT


class Broken:
    failure = MetricsFileError("/x/metrics.h5: cannot write (No space left on device)")


def test_a_failed_writer_stops_every_rank_before_a_signal(signals):
    os.kill(os.getpid(), signal.SIGINT)
    with pytest.raises(MetricsFileError, match="No space left"):
        signals.check(SerialExchange(), 3, Broken())
    # the other rank (rank 0) failed: this one stops with a quiet error of its own
    with pytest.raises(RunFileError, match="rank 0"):
        signals.check(Sum(FAILED), 3, NullWriter())
    assert signals.agreed(Sum(FAILED + W[signal.SIGTERM])) == (signal.SIGTERM, ROWS_KEPT)
    # how rank 0's writer failed reaches every rank: rows lost, so no checkpoint of it
    assert signals.agreed(Sum(2 * FAILED + W[signal.SIGTERM])) == (signal.SIGTERM, ROWS_LOST)
    with pytest.raises(RunFileError, match="rank 0") as lost:
        signals.check(Sum(2 * FAILED), 3, NullWriter())
    assert lost.value.rows_lost
    with pytest.raises(MetricsFileError) as kept:
        signals.check(SerialExchange(), 3, Broken())
    assert not kept.value.rows_lost
    Broken.rows_lost = True
    try:
        with pytest.raises(MetricsFileError) as own:
            signals.check(SerialExchange(), 3, Broken())
        assert own.value.rows_lost
    finally:
        del Broken.rows_lost
    NoStop().check(SerialExchange(), 3, NullWriter())
    with pytest.raises(MetricsFileError):
        NoStop().check(SerialExchange(), 3, Broken())


# -- the short commands (lptrain-eval, -report, -model): stop where they are -------------
def test_a_short_command_stops_in_one_line_on_a_signal(capsys):
    from lptrain.errors import stops_on_signals
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    ran = []

    def load_signalled():           # Ctrl-C while the command imports: noted, then acted on
        os.kill(os.getpid(), signal.SIGINT)
        ran.append("load")
        return lambda: ran.append("main") or 0

    def main_signalled():           # SIGTERM while it runs: it stops there
        os.kill(os.getpid(), signal.SIGTERM)
        ran.append("after the signal")
        return 0

    assert stops_on_signals("lptrain-x", load_signalled) == 130
    assert ran == ["load"]
    assert stops_on_signals("lptrain-x", lambda: main_signalled) == 143
    assert ran == ["load"]
    assert capsys.readouterr().err.splitlines() == ["lptrain-x: interrupted by SIGINT",
                                                    "lptrain-x: interrupted by SIGTERM"]
    assert stops_on_signals("lptrain-x", lambda: lambda: 2) == 2
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers


def test_a_short_command_stops_where_python_swallowed_the_signals_raise(capsys,
                                                                         monkeypatch):
    """lptrain-model's Ctrl-C landed in an at-fork hook, where Python only prints an
    exception ('Exception ignored in ...'), and the command ran on and exited 0."""
    from lptrain.errors import stops_on_signals

    class Hook:                     # Python reports what __del__ raises, as for at-fork
        def __del__(self):          # hooks ('Exception ignored in ...'), and goes on
            os.kill(os.getpid(), signal.SIGINT)

    def main_swallowing():
        Hook()
        return 0

    import sys        # Python's own report, as the command has it (pytest installs another)
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)

    assert stops_on_signals("lptrain-x", lambda: main_swallowing) == 130
    # one line: not also Python's report of the raise it swallowed
    assert capsys.readouterr().err.splitlines() == ["lptrain-x: interrupted by SIGINT"]


class _OneRank:
    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1


@pytest.mark.parametrize("sweep", [False, True])
def test_a_signal_after_the_last_iteration_is_said_and_ends_only_a_sweep(
        tmp_path, capsys, monkeypatch, sweep):
    """A signal in a run's last iteration stops nothing (train/loop.py): the command
    says so; a sweep stops before its next job with 128 + the signal and its resume."""
    from lptrain import stops
    from lptrain.jobs import Job
    sweep_dir = tmp_path / "sweep"
    job = Job(cfg=None, run_dir=str(sweep_dir / "0"),
              sweep_dir=str(sweep_dir) if sweep else "")
    # an Optuna sweep writes no multirun.yaml: whether it is a sweep was read from the
    # directory, and such a sweep started its next job, interrupted at iteration 0
    monkeypatch.setattr(stops, "is_sweep", lambda d: False)
    stop = StopSignals()
    stops.signal_at_the_end(job, _OneRank(), stop)           # no signal: nothing
    assert capsys.readouterr().err == ""
    stop.received = signal.SIGTERM
    if sweep:
        with pytest.raises(SystemExit) as exc:
            stops.signal_at_the_end(job, _OneRank(), stop)
        assert exc.value.code == 143
    else:
        stops.signal_at_the_end(job, _OneRank(), stop)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"lptrain: SIGTERM in the run's last iteration: {sweep_dir / '0'} ended")
    # an Optuna sweep's job is done: its resume would be refused ('ask for more')
    assert ("the sweep stops here (its sweeper saved nothing to carry it on: sweep "
            "again, an Optuna study from its hydra.sweeper.storage)" in lines[0]) == sweep
    assert "resume=" not in lines[0]
    if sweep:                 # the basic sweeper's: the whole sweep carries on
        monkeypatch.setattr(stops, "is_sweep", lambda d: True)
        stop.received = signal.SIGTERM
        with pytest.raises(SystemExit):
            stops.signal_at_the_end(job, _OneRank(), stop)
        line = capsys.readouterr().err
        assert f"the sweep stops here (`lptrain resume={sweep_dir}` carries on" in line


def test_the_command_ignores_signals_once_its_work_is_done(signals):
    """A SIGINT in the interpreter's teardown (default handlers put back) ended a
    completed run with 130 and no word."""
    from lptrain.job_run import quiet_teardown
    quiet_teardown()
    assert signal.getsignal(signal.SIGINT) == signal.getsignal(signal.SIGTERM) == \
        signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGINT)          # nothing happens
    assert signals.received is None


def test_a_metrics_file_removed_during_the_run_is_said(tmp_path, capsys):
    """metrics.h5 removed mid-run: the run ended with exit 0 and its summary named a file
    that no longer existed, its rows gone with it, and said nothing."""
    from helpers import composed
    from lptrain import app

    class Removing(StopSignals):
        def check(self, exchange, iteration, writer=None, signals=True):
            if iteration == 2:
                (tmp_path / "metrics.h5").unlink()
            super().check(exchange, iteration, writer, signals)
    app.run(composed("network.layers=4", "dataset.n_train=100", "dataset.n_val=20",
                     "train.iterations=3"), None, tmp_path, Removing())
    said = capsys.readouterr()
    assert f"metrics: {tmp_path / 'metrics.h5'} was removed during the run; its rows are " \
           f"lost" in said.err
    assert (tmp_path / "model.pt").is_file() and f"metrics: {tmp_path}" not in said.out
    # its resume: was first told to ask for more iterations, then refused for the file
    from lptrain.job_run import _resume_line
    from lptrain.metrics.schema import MetricsInputError
    with pytest.raises(MetricsInputError, match="metrics.h5: gone .* cannot be resumed"):
        app.run(composed("network.layers=4", "dataset.n_train=100", "dataset.n_val=20",
                         "train.iterations=3"), None, tmp_path, resume=True)
    # a run stopped by a signal after the removal: its line offered that resume
    assert _resume_line(None, tmp_path, 1) == "its metrics.h5 was removed during the " \
        "run, so it cannot be resumed (the models are kept)"
