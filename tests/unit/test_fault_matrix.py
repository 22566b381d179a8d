"""bench/fault_matrix.py's judgement on canned outcomes: which kind each one is, and the
table of kinds per class (no launches)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def fm():
    """bench/fault_matrix.py as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("fault_matrix", BENCH / "fault_matrix.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fault_matrix", module)
    spec.loader.exec_module(module)
    return module


REFUSED_LINE = "lptrain: error: network.T=1e+300: must be in (0, 10000]\n"
TRACEBACK = ("Traceback (most recent call last):\n  File \"cli.py\", line 1\n"
             "KeyboardInterrupt\n")


@pytest.mark.parametrize("rc, stderr, extra, expect, needle, kind, why", [
    (2, REFUSED_LINE, {}, (2,), "network.T", "clean", ""),
    (None, "", {}, (2,), "network.T", "hang", "timeout"),
    (124, REFUSED_LINE, {}, (2,), "network.T", "hang", "timeout"),    # `timeout` ended it
    (137, "", {}, (0,), "", "hang", "timeout"),
    (-2, TRACEBACK, {}, (130,), "SIGINT", "traceback", "traceback"),
    # the unexpected-exception path: one line, the traceback in a file
    (1, "lptrain: error: rank 0: unexpected ...\n", {"error_logs": ["run/error-rank0.log"]},
     (2,), "", "traceback", "error-rank0.log"),
    (2, REFUSED_LINE, {"lost": "refused, yet wrote metrics.h5"}, (2,), "network.T",
     "data lost", "metrics.h5"),
    (1, REFUSED_LINE, {}, (2,), "network.T", "other", "exit 1, expected 2"),
    (2, REFUSED_LINE * 2, {}, (2,), "network.T", "other", "2 lines"),
    (2, "Error executing job\n", {}, (2,), "", "other", "does not start with"),
    (2, REFUSED_LINE, {}, (2,), "network.width", "other", "does not name 'network.width'"),
    (130, "lptrain: interrupted by SIGINT after iteration 3\n", {"wrong": "stopped 6 "
     "iterations after the signal (at most 1)"}, (130,), "SIGINT", "other", "stopped 6"),
    # mpiexec's own notice about the forwarded signal is not lptrain's line
    (143, "[mpiexec@host] Sending Ctrl-C to processes as requested\n"
          "lptrain: interrupted by SIGTERM after iteration 3\n", {}, (143,), "SIGTERM",
     "clean", ""),
    (0, "", {}, (0,), "", "clean", ""),
    (0, "some warning\n", {}, (0,), "", "other", "1 lines on stderr after a success"),
    (0, "", {"lost": "metrics rows [1, 2, 4] are not 1..3"}, (0,), "", "data lost", "1..3"),
])
def test_each_outcome_gets_its_kind(fm, rc, stderr, extra, expect, needle, kind, why):
    out = fm.Outcome("lptrain …", rc, stderr, **extra)
    got, reason = fm.classify(out, expect, needle)
    assert got == kind, reason
    assert why in reason


def test_the_prefix_is_the_programs(fm):
    out = fm.Outcome("lptrain-eval run", 2, "lptrain-eval: error: run/model.pt: unreadable\n")
    assert fm.classify(out, (2,), "model.pt", prog="lptrain-eval") == ("clean", "")
    assert fm.classify(out, (2,), "model.pt")[0] == "other"


def test_the_table_counts_each_kind_per_class(fm):
    def result(group, kind):
        case = fm.Case(group, "x", 1, (2,), "", run=None)
        return fm.Result(case, fm.Outcome("c", 2, ""), kind, "", 0.0)
    results = [result("options", "clean"), result("options", "hang"),
               result("signals", "traceback"), result("signals", "clean"),
               result("signals", "data lost"), result("disk full", "other")]
    rows = fm.table(results).splitlines()
    assert rows[0] == "| class | tried | clean | hangs | tracebacks | data lost | other |"
    assert rows[2:] == ["| options | 2 | 1 | 1 | 0 | 0 | 0 |",
                        "| signals | 3 | 1 | 0 | 1 | 1 | 0 |",
                        "| disk full | 1 | 0 | 0 | 0 | 0 | 1 |",
                        "| **all** | 6 | 2 | 1 | 1 | 1 | 1 |"]
    listed = fm.failures(results)
    assert listed.count("\n[") == 3 and "[hang] options/x" in listed
    assert "signals/x" in listed and "disk full/x" in listed
