"""Clean stops: SIGINT/SIGTERM to mpiexec or to one rank of `mpiexec -n 2 lptrain`, or to
`lptrain` on one rank.

Twelve runs are started at once (the machine is oversubscribed on purpose: signals then land
in collectives and point-to-point waits as well as in computation); each gets its signal
once it has logged a few iterations. Every one must end with the signal's exit code, one
line naming the signal and how to resume, status `interrupted`, a model, and no traceback,
after at most the one iteration that was running (counted in metrics.h5; one more on
several ranks, where the signal can land during the stop agreement). A hang fails through
the timeout.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from launch import ENV, LPTRAIN, MPIEXEC, rank_pids
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics
from lptrain.model.saved import load_model

pytestmark = [pytest.mark.cli, pytest.mark.mpi, pytest.mark.slow]

TIMEOUT = 240
TINY = ["network.layers=8", "network.width=4", "dataset.n_train=200", "dataset.n_val=50",
        "train.iterations=1000000", "eval_every=1000000", "mgrit.levels=2",
        "mgrit.cfactor0=2"]
INT, TERM = signal.SIGINT, signal.SIGTERM
FORWARDING_ITERATIONS = 12  # see the bound on the iterations after a signal
AGREEING = 1                # ... and the iteration a signal during the agreement adds
# (who gets the signal, which signal, mode)
TRIALS = [("mpiexec", INT, "serial"), ("mpiexec", TERM, "mgrit"),
          ("mpiexec", INT, "simultaneous"), ("mpiexec", TERM, "serial"),
          ("rank0", INT, "mgrit"), ("rank1", INT, "serial"), ("rank1", TERM, "mgrit"),
          ("rank0", TERM, "simultaneous"), ("all", INT, "mgrit"), ("all", INT, "serial"),
          ("solo", INT, "serial"), ("solo", TERM, "serial")]    # solo: 1 rank, no mpiexec


def _iterations(path: Path) -> int:
    try:
        return read_metrics(path).n_iterations
    except (ms.MetricsFileError, OSError, KeyError):
        return 0


class Trial:
    def __init__(self, tmp: Path, i: int, target: str, sig: int, mode: str):
        self.dir, self.target, self.sig = tmp / f"run{i}", target, sig
        self.err = open(tmp / f"stderr{i}.txt", "w+")
        launch = [] if target == "solo" else [MPIEXEC, "-n", "2"]
        self.proc = subprocess.Popen(
            [*launch, LPTRAIN, f"hydra.run.dir={self.dir}", f"mode={mode}", f"seed={i}",
             *TINY], env=ENV, stdout=subprocess.DEVNULL, stderr=self.err,
            start_new_session=True)
        self.sent = False
        self.rows_at_signal = 0     # iterations in metrics.h5 just after the signal

    def poke(self) -> None:
        """Send the signal once the run has finished a few iterations."""
        rows = _iterations(self.dir / ms.FILE_NAME)
        if self.sent or rows < 3:
            return
        ranks = rank_pids(self.proc.pid)
        if self.target in ("mpiexec", "solo"):
            os.kill(self.proc.pid, self.sig)
        elif self.target == "all":        # a terminal's Ctrl-C: the whole process group
            os.killpg(self.proc.pid, self.sig)
        else:
            os.kill(ranks[int(self.target[-1])], self.sig)
        self.sent = True
        self.rows_at_signal = max(rows, _iterations(self.dir / ms.FILE_NAME))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def test_signals_stop_every_rank_cleanly(tmp_path):
    trials = [Trial(tmp_path, i, *t) for i, t in enumerate(TRIALS)]
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and any(t.proc.poll() is None for t in trials):
            for t in trials:
                if t.proc.poll() is None:
                    t.poke()
            time.sleep(0.1)
    finally:
        for t in trials:
            t.stop()
    for t in trials:
        t.err.seek(0)
        err = t.err.read()
        what = f"{t.target} {signal.Signals(t.sig).name}: {err}"
        assert t.sent, what
        assert t.proc.returncode == 128 + t.sig, what
        assert "Traceback" not in err, what
        ours = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("[mpiexec@")]
        assert len(ours) == 1, what
        assert ours[0].startswith(f"lptrain: interrupted by {signal.Signals(t.sig).name}")
        # as it ran: on 2 ranks it said `lptrain resume=DIR`, which an explicit split
        # refuses on one rank
        launch = "" if t.target == "solo" else "mpiexec -n 2 "
        assert f"resume with: {launch}lptrain resume={t.dir}" in ours[0]
        m = read_metrics(t.dir / ms.FILE_NAME)
        assert m.status == ms.INTERRUPTED, what
        n = m.n_iterations
        assert n >= 3
        # README "Stops": the iteration that was running finishes, no other, unless the
        # signal lands while a rank waits in the stop agreement for the others (its "no"
        # sent, its iteration not yet in metrics.h5, which rank 0 writes when it gets
        # there): then the next one finishes too. A signal to mpiexec reaches the ranks
        # only once mpiexec has forwarded it, which on this oversubscribed machine can
        # take several of these millisecond iterations (5 seen in CI, 60 rows in): there
        # the count at the test's kill is a lower bound of the ranks' own, and the bound
        # only says the run stops soon; the exact one holds for the other targets.
        late = {"mpiexec": FORWARDING_ITERATIONS, "solo": 0}.get(t.target, AGREEING)
        assert n <= t.rows_at_signal + 1 + late, \
            f"{what}: {n} iterations, {t.rows_at_signal} at the signal"
        np.testing.assert_array_equal(m.train[ms.ITERATION], np.arange(1, n + 1))
        assert load_model(t.dir, "last").iteration == n
        assert load_model(t.dir).iteration <= n      # the best validated one


def _handles(pid: int, sig: int) -> bool:
    """Whether process `pid` has a handler for `sig` (its SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(int(ln.split()[1], 16) for ln in status.splitlines()
                if ln.startswith("SigCgt:"))
    return bool(mask >> (sig - 1) & 1)


# (who gets the signal, which signal): each is sent as soon as lptrain's handlers are in
# place on every rank, while torch and MPI are still loading
STARTS = [("solo", INT), ("rank1", TERM), ("mpiexec", INT)]


def test_a_signal_while_starting_stops_before_anything_is_written(tmp_path):
    """Was a KeyboardInterrupt traceback (SIGINT) or a silent death (SIGTERM) while the
    imports ran; now one line, 128 + the signal, and no run directory."""
    procs, errs, sent = [], [], []
    for i, (who, sig) in enumerate(STARTS):
        errs.append(open(tmp_path / f"start{i}.txt", "w+"))
        launch = [] if who == "solo" else [MPIEXEC, "-n", "2"]
        procs.append(subprocess.Popen(
            [*launch, LPTRAIN, f"hydra.run.dir={tmp_path / f'run{i}'}", *TINY], env=ENV,
            stdout=subprocess.DEVNULL, stderr=errs[-1], start_new_session=True))
        sent.append(False)
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            for i, ((who, sig), p) in enumerate(zip(STARTS, procs)):
                ranks = {0: p.pid} if who == "solo" else rank_pids(p.pid)
                if sent[i] or len(ranks) < (1 if who == "solo" else 2) or \
                        not all(_handles(r, TERM) for r in ranks.values()):
                    continue
                os.kill(ranks[1] if who == "rank1" else p.pid, sig)
                sent[i] = True
            time.sleep(0.01)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for i, ((who, sig), p, err) in enumerate(zip(STARTS, procs, errs)):
        err.seek(0)
        text = err.read()
        what = f"{who} {signal.Signals(sig).name}: {text}"
        ours = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("[mpiexec@")]
        assert sent[i] and p.returncode == 128 + sig, what
        assert len(ours) == 1, what
        assert ours[0] == (f"lptrain: interrupted by {signal.Signals(sig).name} while "
                           f"starting; nothing was run or written"), what
        assert not (tmp_path / f"run{i}").exists(), what


def test_ctrl_c_ends_lptrain_model_and_its_forked_neighbours_in_one_line(tmp_path):
    """Was a KeyboardInterrupt traceback from the command and from each forked child
    that ran its kernels beside it (model_perf/neighbours.py); now one line and 130."""
    cmd = [str(Path(LPTRAIN).parent / "lptrain-model"), "--fresh", "--host-ranks", "2",
           "network.layers=8", "network.width=4", "dataset.n_train=200"]
    proc = subprocess.Popen(cmd, env={**ENV, "LPTRAIN_CACHE": str(tmp_path)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline, forked = time.monotonic() + TIMEOUT, []
        while proc.poll() is None and time.monotonic() < deadline:
            forked = _children(proc.pid)      # asked once: a group of neighbours may end
            if forked:                        # between two questions (kernels, optimizer)
                break
            time.sleep(0.05)
        assert forked, "no neighbours were forked"
        os.killpg(proc.pid, signal.SIGINT)          # a terminal's Ctrl-C: the whole group
        err = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    # its progress lines (what it records), then the stop's one line
    assert err.splitlines()[-1] == "lptrain-model: interrupted by SIGINT", err
    assert all(ln.startswith("lptrain-model: ") for ln in err.splitlines()), err
    # the neighbours end on the same Ctrl-C; on a loaded machine one may take a moment
    left, deadline = b"", time.monotonic() + 10
    while time.monotonic() < deadline:
        left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True).stdout
        if not left:
            break
        time.sleep(0.2)
    assert not left, left


def _children(pid: int) -> list[str]:
    return subprocess.run(["pgrep", "-P", str(pid)], capture_output=True,
                          text=True).stdout.split()
