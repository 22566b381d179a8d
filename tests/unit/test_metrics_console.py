"""The console: formatting, silence when disabled, plain lines through a pipe, live bar."""
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lptrain.metrics.console import Console, format_stats

REPO = Path(__file__).resolve().parents[2]
TTY_VARS = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "NO_COLOR")


@pytest.fixture
def plain_env(monkeypatch):
    for name in TTY_VARS:
        monkeypatch.delenv(name, raising=False)


def test_format_stats_shows_only_given_fields():
    assert format_stats({}) == ""
    assert format_stats({"loss": 0.123456, "accuracy": 0.5}) == "loss 0.1235  acc 0.500"
    line = format_stats({"val_accuracy": 0.875, "step_time": 0.0421, "fwd_iterations": 2,
                         "fwd_residual": 3.2e-6, "adj_residual": 1e-3})
    assert line == "val 0.875  s/it 0.0421  fwd 2 it 3.2e-06  adj 1.0e-03"
    assert format_stats({"fwd_iterations": 3, "grad_error": 0.0041}) == "fwd 3 it  gerr 4.1e-03"


def test_disabled_console_prints_nothing(capsys):
    out, err = io.StringIO(), io.StringIO()
    c = Console(False, 10, "t", file=out, err_file=err)
    c.update(1, loss=0.5)
    c.message("hi")
    c.error("boom")
    c.summary({"loss": 0.5})
    c.close()
    assert out.getvalue() == err.getvalue() == ""
    assert capsys.readouterr() == ("", "")


def test_unknown_field_raises_even_when_disabled():
    with pytest.raises(KeyError, match="lss"):
        Console(False, 10).update(1, lss=0.5)


def test_plain_output_every_k_iterations(plain_env):
    out = io.StringIO()
    with Console(True, 10, "peaks", file=out, every=4) as c:
        assert not c.live
        for i in range(1, 11):
            c.update(i, loss=1.0 / i, step_time=0.5)
            if i == 5:
                c.update(i, val_accuracy=0.75)
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["1/10", "4/10", "8/10", "10/10"]
    assert lines[-1] == "peaks 10/10  loss 0.1  val 0.750  s/it 0.5"


def test_time_per_iteration_is_measured_without_step_time(plain_env, monkeypatch):
    clock = iter([100.0, 101.0, 104.0])
    monkeypatch.setattr("lptrain.metrics.console.time.monotonic", lambda: next(clock))
    out = io.StringIO()
    c = Console(True, 10, "t", file=out, every=1)
    c.update(1)
    c.update(2)
    c.update(4)  # 3 s for 2 iterations
    assert out.getvalue().splitlines()[1:] == ["t 2/10  s/it 1", "t 4/10  s/it 1.5"]


def test_summary_message_and_error(plain_env):
    out, err = io.StringIO(), io.StringIO()
    c = Console(True, 3, "run", file=out, err_file=err)
    c.message("loaded [bold]peaks[/]")  # no markup interpretation
    c.summary({"final loss": 0.0123456789, "iterations": 3, "metrics": "out/metrics.h5"})
    c.error("objective is nan")
    text = out.getvalue()
    assert "loaded [bold]peaks[/]" in text
    assert "0.0123457" in text and "out/metrics.h5" in text and "iterations" in text
    assert err.getvalue() == "error: objective is nan\n"


def test_summary_title_is_one_line_whatever_the_values(plain_env):
    out = io.StringIO()
    title = "serial peaks N=4 P=1 (1 layer x 1 data)"
    Console(True, 3, title, file=out).summary({"objective": 1.26, "iterations": 3})
    assert out.getvalue().splitlines()[0].strip() == f"{title}: summary"


_SCRIPT = """
from lptrain.metrics.console import Console
c = Console(True, 40, "peaks", every=10)
for i in range(1, 41):
    c.update(i, loss=1.0 / i, accuracy=i / 40, fwd_iterations=2, fwd_residual=1e-4 / i)
c.message("done")
c.summary({"final loss": 0.025, "wall time [s]": 1.5})
c.error("boom")
c.close()
"""


def test_output_through_a_pipe_is_plain_text():
    env = {k: v for k, v in os.environ.items() if k not in TTY_VARS}
    env.update(PYTHONPATH=str(REPO), TERM="xterm-256color", COLUMNS="100")
    res = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    assert "\x1b" not in res.stdout and "\x1b" not in res.stderr and "\r" not in res.stdout
    lines = res.stdout.splitlines()
    progress = [line for line in lines if line.startswith("peaks ")]
    assert [line.split()[1] for line in progress] == ["1/40", "10/40", "20/40", "30/40",
                                                      "40/40"]
    assert progress[-1].startswith("peaks 40/40  loss 0.025  acc 1.000  ")
    assert progress[-1].endswith("fwd 2 it 2.5e-06")
    assert "done" in lines
    assert any("final loss" in line and "0.025" in line for line in lines)
    assert res.stderr == "error: boom\n"


def test_live_bar_on_a_terminal(monkeypatch):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("TTY_INTERACTIVE", "1")
    monkeypatch.setenv("TERM", "xterm")
    out = io.StringIO()
    c = Console(True, 5, "peaks", file=out)
    assert c.live
    for i in range(1, 6):
        c.update(i, loss=0.5, adj_iterations=3)
    c.message("note")
    c.close()
    c.close()
    text = out.getvalue()
    assert "5/5" in text and "loss 0.5" in text and "adj 3 it" in text and "note" in text
