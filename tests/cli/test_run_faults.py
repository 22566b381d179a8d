"""The run's files under faults, end to end: a disk that fills up during the run (a small
tmpfs, where the machine lets the tests mount one), and concurrent runs."""
from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from launch import ENV, LPTRAIN, lptrain, start
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics
from lptrain.metrics.writer import RESERVE_BYTES, free_bytes
from lptrain.model.saved import load_model
from lptrain.rundir import LOCK_FILE
from lptrain.train.checkpoint import CHECKPOINT_FILE, load_checkpoint

pytestmark = pytest.mark.cli

TIMEOUT = 120
TINY = ["network.layers=4", "network.width=4", "dataset.n_train=200", "dataset.n_val=50",
        "eval_every=1000000", "optimizer=adam"]
LONG = [*TINY, "train.iterations=1000000"]


def _start_command(args, cwd, err_path):
    """The command itself: a run whose lock another run must find held by a live
    `lptrain` process (rundir.py reads the holder's command line)."""
    return subprocess.Popen([LPTRAIN, *args], cwd=cwd, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=open(err_path, "w"))


def _wait_for_rows(proc, path, rows=3):
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if read_metrics(path).n_iterations >= rows:
                return
        except (ms.MetricsFileError, OSError, KeyError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"no {rows} rows in {path} (exit {proc.poll()})")


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)],
            capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_disk_filling_up_during_the_run_fails_cleanly_and_resumes(small_disk, tmp_path):
    run_dir = small_disk / "run"
    proc = start([f"hydra.run.dir={run_dir}", *LONG], tmp_path, stderr=tmp_path / "err.txt")
    try:
        _wait_for_rows(proc, run_dir / ms.FILE_NAME)
        # another program takes all but less than lptrain's reserve
        with open(small_disk / "filler", "wb") as f:
            f.write(b"\0" * (free_bytes(small_disk) - RESERVE_BYTES + 65536))
        rc = proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = (tmp_path / "err.txt").read_text()
    assert rc == 1, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("lptrain: error: "), err
    assert str(run_dir / ms.FILE_NAME) in lines[0] and "free" in lines[0]
    m = read_metrics(run_dir / ms.FILE_NAME)
    assert m.status == ms.FAILED
    n = m.n_iterations
    assert n >= 3
    np.testing.assert_array_equal(m.train[ms.ITERATION], np.arange(1, n + 1))
    # the iteration that reached the reserve was recorded from it, then checkpointed
    # (before: no checkpoint until iteration 10, so nothing to resume)
    assert load_checkpoint(run_dir / CHECKPOINT_FILE)["iteration"] == n
    # Adam: the parameters after n wait for the next step's objective (README)
    assert load_model(run_dir, "last").iteration == n - 1
    assert not (run_dir / LOCK_FILE).exists()
    (small_disk / "filler").unlink()           # space freed: the run continues
    again = lptrain([f"resume={run_dir}", f"train.iterations={n + 2}"], tmp_path,
                    timeout=TIMEOUT)
    assert again.returncode == 0, again.stderr
    m = read_metrics(run_dir / ms.FILE_NAME)
    assert m.status == ms.COMPLETED
    np.testing.assert_array_equal(m.train[ms.ITERATION], np.arange(1, n + 3))


def test_concurrent_runs_never_share_a_directory(tmp_path):
    run_dir = tmp_path / "run"
    first = _start_command([f"hydra.run.dir={run_dir}", *LONG], tmp_path,
                           tmp_path / "first.txt")
    same, defaults = None, []
    try:
        _wait_for_rows(first, run_dir / ms.FILE_NAME)
        # stopped, it still holds the lock (a live process) but leaves the cores to the
        # runs below and to the other tests
        first.send_signal(signal.SIGSTOP)
        # a second run into the same directory while the first one lives, and two runs
        # with default directories started in the same second
        # (forked from the tests' fork server: they start at once)
        same = start([f"hydra.run.dir={run_dir}", *TINY, "train.iterations=2"], tmp_path)
        defaults = [start([*TINY, "train.iterations=2"], tmp_path) for _ in range(2)]
        assert same.wait(timeout=TIMEOUT) == 2
        assert same.output()[1].strip().splitlines() == [
            f"lptrain: error: hydra.run.dir={run_dir}: in use by the lptrain process "
            f"{first.pid} on {__import__('socket').gethostname()} (lock file "
            f"{run_dir / LOCK_FILE}; delete it if that run is gone)"]
        for p in defaults:
            assert p.wait(timeout=TIMEOUT) == 0, p.output()[1]
        first.send_signal(signal.SIGTERM)
        first.send_signal(signal.SIGCONT)
        assert first.wait(timeout=TIMEOUT) == 128 + signal.SIGTERM
    finally:
        for p in (first, same, *defaults):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    m = read_metrics(run_dir / ms.FILE_NAME)
    assert m.status == ms.INTERRUPTED
    np.testing.assert_array_equal(m.train[ms.ITERATION], np.arange(1, m.n_iterations + 1))
    assert m.attrs[ms.CONFIG].count("iterations: 1000000") == 1     # only the first run's
    runs = sorted(p.parent for p in (tmp_path / "outputs").glob(f"*/*/{ms.FILE_NAME}"))
    assert len(runs) == 2 and runs[0] != runs[1]
    assert all(read_metrics(r / ms.FILE_NAME).status == ms.COMPLETED for r in runs)
