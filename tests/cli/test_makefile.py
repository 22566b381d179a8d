"""The Makefile's commands as `make -n` prints them (nothing runs)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from launch import REPO

pytestmark = [pytest.mark.cli,
              pytest.mark.skipif(shutil.which("make") is None, reason="no make")]
CORES = len(os.sched_getaffinity(0))


def _make(*args: str, **env: str) -> list[str]:
    proc = subprocess.run(["make", "-n", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def _runs(lines: list[str]) -> str:
    return next(line for line in lines if "mpiexec -n" in line)


def test_yielding_waits_only_where_the_ranks_outnumber_the_cores():
    """GNU nproc counts OMP_NUM_THREADS as the cores: with OMP_NUM_THREADS=1 two ranks on
    two free cores got MPICH's yielding waits (about 18 % slower, BENCHMARKS.md)."""
    for threads in ("1", str(CORES)):
        assert "HEAVY_YIELD" not in _runs(_make("compare-modes", f"NP={CORES}",
                                                OMP_NUM_THREADS=threads))
        assert "HEAVY_YIELD" in _runs(_make("compare-modes", f"NP={CORES + 1}",
                                            OMP_NUM_THREADS=threads))


def test_quick_runs_have_folders_of_their_own():
    for target in ("compare-modes", "reproduce-peaks"):
        assert "-quick/" in _runs(_make(target, "QUICK=1"))
        assert "-quick/" not in _runs(_make(target))


def test_make_help_fits_80_columns():
    proc = subprocess.run(["make", "help"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) >= 10
    assert max(map(len, lines)) <= 80, max(lines, key=len)
