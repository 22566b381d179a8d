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


FAKE_LPTRAIN = """#!/bin/bash
for a in "$@"; do case $a in
  mode=*) m=${a#mode=};; hydra.run.dir=*) d=${a#hydra.run.dir=};;
  resume=*) d=${a#resume=}; m=$(basename "$d");; esac; done
echo "ran $m" >> "$LOG"; mkdir -p "$d"; touch "$d/metrics.h5"
code=EXIT_$m; exit ${!code:-0}
"""
FAKE_RUNPLAN = """#!/bin/bash
for a in "$@"; do case $a in mode=*) m=${a#mode=};; esac; done
plan=PLAN_$m; echo ${!plan:-fresh}
"""
FAKE_REPORT = """#!/bin/bash
echo "report $*" >> "$LOG"
"""


def _paper_target(tmp_path, *args: str, **env: str):
    """`make compare-modes` on 1 rank with lptrain, runplan and lptrain-report replaced by
    scripts: each mode exits with EXIT_<mode> and is planned PLAN_<mode> (default
    fresh). (make's status, its output, the log of what ran)"""
    tools = {}
    for name, text in (("lptrain", FAKE_LPTRAIN), ("python", FAKE_RUNPLAN),
                       ("report", FAKE_REPORT)):
        tools[name] = tmp_path / name
        tools[name].write_text(text)
        tools[name].chmod(0o755)
    log = tmp_path / "log"
    log.write_text("")
    proc = subprocess.run(
        ["make", "-o", ".venv/.installed", "compare-modes", "NP=1", f"OUT={tmp_path}",
         f"LPTRAIN={tools['lptrain']}", f"PY={tools['python']}",
         f"REPORT={tools['report']}", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "LOG": str(log), **env})
    return proc.returncode, proc.stdout + proc.stderr, log.read_text().splitlines()


def test_a_failed_mode_lets_the_others_run_and_the_report_show_it(tmp_path):
    """A diverged serial run stopped the target with "stopped; the same make command
    carries it on", and no report was written until every mode had failed (held-out
    check)."""
    status, out, ran = _paper_target(tmp_path, EXIT_serial="1")
    folder = tmp_path / "compare-modes"
    assert status != 0
    assert ran[:3] == ["ran serial", "ran mgrit", "ran simultaneous"]
    assert ran[3] == f"report {folder}/serial {folder}/mgrit {folder}/simultaneous " \
                     f"--out {folder}/report"
    assert f"{folder}/serial: did not complete (exit status 1, see above)\n" in out
    assert "carries it on" not in out
    # a run kept as diverged fails the target again, the others still reported
    status, out, ran = _paper_target(tmp_path, PLAN_serial="kept-failed")
    assert status != 0 and ran[0] == "ran mgrit" and ran[-1].startswith("report ")


def test_a_stopped_or_refused_mode_runs_no_further_mode(tmp_path):
    status, out, ran = _paper_target(tmp_path, EXIT_mgrit="130")
    folder = tmp_path / "compare-modes"
    assert status != 0 and ran == ["ran serial", "ran mgrit"]       # no report either
    assert f"{folder}/mgrit: stopped; the same make command carries it on" in out
    # with FRESH=1 the same command starts every mode afresh: not what carries it on
    status, out, ran = _paper_target(tmp_path, "FRESH=1", EXIT_mgrit="143")
    assert "mgrit: stopped; run the make command again without FRESH=1 to carry it on" \
        in out
    stale = folder / "simultaneous"            # of other settings, from an earlier call
    stale.mkdir()
    (stale / "metrics.h5").touch()
    status, out, ran = _paper_target(tmp_path, EXIT_mgrit="2")
    assert status != 0                         # the mode not reached is not reported
    assert ran == ["ran serial", "ran mgrit",
                   f"report {folder}/serial {folder}/mgrit --out {folder}/report"]
    assert "mgrit: refused (exit status 2, the line above says why); no further mode " \
           "runs" in out


def test_every_mode_completed_makes_the_report_and_exits_0(tmp_path):
    status, out, ran = _paper_target(tmp_path, PLAN_mgrit="kept")
    assert status == 0 and ran[:2] == ["ran serial", "ran simultaneous"]
    assert "figures and summary.md in" in out
