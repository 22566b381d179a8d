"""The console: formatting, silence when disabled, the plain lines' cadence, the live display
at 80 and 160 columns, the summary's units."""
import io
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console as RichConsole

from lptrain.metrics.console import (FRACTION, SEPARATOR, Cadence, Console, stat_parts,
                                     wrap_parts)
from lptrain.metrics.quantities import format_duration, iteration_time

REPO = Path(__file__).resolve().parents[2]
TTY_VARS = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "NO_COLOR")
TITLE = "simultaneous peaks N=32 P=4 (2 layer x 2 data)"
MGRIT = dict(loss=0.41234, accuracy=0.8391, val_accuracy=0.82, fwd_iterations=3,
             fwd_residual=7.4e-4, adj_iterations=3, adj_residual=8.8e-7, grad_error=4.4e-3)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def plain_env(monkeypatch):
    for name in TTY_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def tty_env(monkeypatch):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("TTY_INTERACTIVE", "1")
    monkeypatch.setenv("TERM", "xterm")


def _iterate(console, clock, iterations, seconds, **fields):
    """`iterations` iterations of `seconds` each; the iterations whose line was printed."""
    for k in iterations:
        clock.now += seconds
        console.update(k, step_time=seconds, **fields)


def format_stats(values: dict, seconds: float | None = None) -> str:
    return SEPARATOR.join(stat_parts(values, seconds))


def _printed(out) -> list[int]:
    """The iterations whose lines were printed (a line '12/300  0:00:28 elapsed ...')."""
    return [int(line.split("/")[0]) for line in out.getvalue().splitlines()
            if line[:1].isdigit()]


def test_format_stats_shows_only_given_fields():
    assert format_stats({}) == ""
    assert format_stats({"loss": 0.123456, "accuracy": 0.5}) == "loss 0.1235  acc 0.500"
    line = format_stats({"val_accuracy": 0.875, "fwd_iterations": 2, "fwd_residual": 3.2e-6,
                         "adj_residual": 1e-3}, 0.0421)
    assert line == "val 0.875  0.0421 s/it  fwd 2 it 3.2e-06  adj 1.0e-03"
    assert format_stats({"fwd_iterations": 3, "grad_error": 0.0041}) == "fwd 3 it  gerr 4.1e-03"


def test_a_validation_from_an_earlier_iteration_names_it():
    """'acc 0.605  val 0.035' at iteration 5 read as one model scored twice: the
    validation was iteration 0's (eval_every=10)."""
    values = {"accuracy": 0.605, "val_accuracy": 0.035, "val_iteration": 0}
    assert stat_parts(values, None, 5) == ["acc 0.605", "val 0.035 (it 0)"]
    assert stat_parts(values, None, 0) == ["acc 0.605", "val 0.035"]
    assert stat_parts({"val_accuracy": 0.5}, None, 5) == ["val 0.500"]   # unknown: unmarked
    assert stat_parts({"val_iteration": 3}, None, 5) == []


def test_summary_prints_accuracies_with_four_decimals(plain_env):
    out = io.StringIO()
    Console(True, 3, "run", file=out).summary(
        {"accuracy": (1.0, FRACTION), "val": (0.74, FRACTION), "none": (None, FRACTION)})
    cells = [line.split("│")[2].strip() for line in out.getvalue().splitlines()
             if line.startswith("│")]
    assert cells == ["1.0000", "0.7400", "-"]


def test_wrap_parts_breaks_between_groups_only():
    parts = ["J 0.4116", "loss 0.4054", "fwd 3 it 7.4e-04", "adj 3 it 8.8e-07"]
    assert wrap_parts(parts, 80) == ["  ".join(parts)]
    assert wrap_parts(parts, 30) == ["J 0.4116  loss 0.4054", "fwd 3 it 7.4e-04",
                                     "adj 3 it 8.8e-07"]
    assert wrap_parts(["a-very-long-group"], 5) == ["a-very-long-group"]


def test_iteration_time_is_the_median_after_the_first():
    assert iteration_time([9.0, 1.0, 3.0, 2.0]) == 2.0      # the cold first one left out
    assert iteration_time([9.0, 1.0, math.nan, 3.0]) == 2.0
    assert iteration_time([4.0]) == 4.0
    assert iteration_time([]) is None and iteration_time(None) is None
    assert format_duration(3725.9) == "1:02:05" and format_duration(math.nan) == "-:--:--"
    from lptrain.metrics.console import _format_value
    assert _format_value(145.96, "s") == "146 s (0:02:26)"      # one rounding for both


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


@pytest.mark.parametrize("seconds,expected", [(3, 1.0), (60, 3.0), (600, 30.0), (86400, 30.0)])
def test_cadence_spreads_twenty_lines_between_one_and_thirty_seconds(seconds, expected):
    assert Cadence().gap(seconds) == expected


def test_cadence_rejects_a_bad_gap():
    with pytest.raises(ValueError, match="min_gap=5"):
        Cadence(min_gap=5, max_gap=1)


def test_plain_lines_follow_the_clock_not_the_iteration_count(plain_env):
    # 100 iterations of 0.5 s: a 50 s run, a line every 2.5 s = every 5 iterations
    clock, out = Clock(), io.StringIO()
    with Console(True, 100, "peaks", file=out, clock=clock) as c:
        assert not c.live
        _iterate(c, clock, range(1, 101), 0.5, loss=0.25)
    assert _printed(out) == [1, *range(6, 100, 5), 100]


def test_a_long_run_prints_every_thirty_seconds(plain_env):
    # 100,000 iterations of 1/64 s (26 minutes): every 1920 iterations, not every 5000
    clock, out = Clock(), io.StringIO()
    c = Console(True, 100_000, "peaks", file=out, clock=clock)
    _iterate(c, clock, range(1, 100_001), 1 / 64)
    assert _printed(out) == [*range(1, 100_000, 1920), 100_000]


def test_a_run_of_seconds_prints_a_line_a_second(plain_env):
    clock, out = Clock(), io.StringIO()
    c = Console(True, 30, "peaks", file=out, clock=clock)
    _iterate(c, clock, range(1, 31), 1 / 8)
    assert _printed(out) == [1, 9, 17, 25, 30]


def test_the_line_shows_elapsed_time_and_eta(plain_env):
    clock, out = Clock(), io.StringIO()
    c = Console(True, 300, "peaks", file=out, clock=clock)
    clock.now = 8.0                           # the first iteration: a cold start
    c.update(1, step_time=8.0, loss=0.5)
    _iterate(c, clock, range(2, 121), 0.25)   # 119 more at 0.25 s: 180 left take 45 s
    assert out.getvalue().splitlines()[:2] == \
        ["peaks", "1/300  0:00:08 elapsed  eta -:--:--  loss 0.5000  8.00 s/it"]
    assert c.progress_lines() == ["120/300  0:00:37 elapsed  eta 0:00:45  loss 0.5000  0.250 s/it"]


def test_the_elapsed_time_is_the_runs_wall_time_where_the_loop_gives_it(plain_env):
    """The last line said 0:15:46 elapsed where the summary's wall time said 938.5 s: the
    console's own clock also counted start-up (loading 60,000 images) and the validation
    after the last iteration, which the wall time (train/wall_time) does not."""
    clock, out = Clock(), io.StringIO()
    c = Console(True, 2, "peaks", file=out, clock=clock)
    clock.now = 20.0                    # the console started 12 s before training
    c.update(1, 8.0, step_time=8.0, loss=0.5)
    clock.now = 29.0                    # then 1 s of validation after iteration 2
    c.update(2, 16.0, step_time=8.0, loss=0.4)
    assert [ln.split("  ")[1] for ln in out.getvalue().splitlines()[1:]] == \
        ["0:00:08 elapsed", "0:00:16 elapsed"]
    assert c._position(now=31.0).startswith("2/2  0:00:18 elapsed")   # live: ticks on


@pytest.mark.parametrize("width", [40, 80, 160])
def test_plain_lines_fit_the_width_and_break_between_groups(plain_env, width):
    clock, out = Clock(), io.StringIO()
    with Console(True, 1200, TITLE, file=out, clock=clock, width=width) as c:
        _iterate(c, clock, range(1, 3), 1.5, objective=1.0937, **MGRIT)
    lines = out.getvalue().splitlines()
    assert lines[0] == TITLE                                  # once, above the first
    assert lines.count(TITLE) == 1 and all(len(ln) <= width for ln in lines[1:])
    first = [i for i, ln in enumerate(lines) if ln.startswith("2/1200  ")][0]
    shown = lines[first:]
    assert all(ln.startswith("  ") for ln in shown[1:])      # continuations indented
    parts = ["2/1200  0:00:03 elapsed  eta 0:29:57",
             *stat_parts({"objective": 1.0937, **MGRIT}, 1.5)]
    assert SEPARATOR.join(ln.strip() for ln in shown) == SEPARATOR.join(parts)
    assert len(shown) == {40: 4, 80: 2, 160: 1}[width]


def test_a_run_that_stops_early_shows_its_last_iteration(plain_env):
    clock, out = Clock(), io.StringIO()
    with Console(True, 100, "peaks", file=out, clock=clock) as c:
        _iterate(c, clock, range(1, 6), 0.5)
        c.message("gradient norm below gtol: stopping")
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("5/100  0:00:02 elapsed  eta 0:00:47")


def test_time_per_iteration_is_measured_without_step_time(plain_env):
    clock = Clock(100.0)
    c = Console(True, 10, "t", file=io.StringIO(), clock=clock)
    for k, now in ((1, 101.0), (2, 102.0), (4, 106.0)):   # 1 s, then 2 s per iteration
        clock.now = now
        c.update(k)
    assert c.iteration_time() == 2.0


def _screen(console: Console, width: int) -> list[str]:
    out = io.StringIO()
    RichConsole(file=out, width=width, color_system=None).print(console.display())
    return [line.rstrip() for line in out.getvalue().splitlines()]


@pytest.mark.parametrize("width", [80, 160])
def test_live_display_keeps_bar_counter_elapsed_and_eta(tty_env, width):
    clock = Clock()
    c = Console(True, 300, TITLE, file=io.StringIO(), clock=clock, width=width)
    assert c.live
    clock.now = 3.0
    c.update(1, step_time=3.0, **MGRIT)
    _iterate(c, clock, range(2, 46), 0.25, **MGRIT)
    clock.now += 4.0                        # the display ticks between iterations
    lines = _screen(c, width)
    c.close()
    assert all(len(line) <= width for line in lines)
    bar = next(line for line in lines if "45/300" in line)
    assert bar.endswith("45/300  0:00:18 elapsed  eta 0:01:03")
    assert "━" in bar and bar.index("━") < bar.index("45/300")
    assert TITLE in lines[0]                  # whole, on the bar's line only when it fits
    assert (lines[0] == bar) == (width == 160)
    values = " ".join(lines[lines.index(bar) + 1:])
    for text in ("loss 0.4123", "acc 0.839", "val 0.820", "0.250 s/it", "fwd 3 it 7.4e-04",
                 "adj 3 it 8.8e-07", "gerr 4.4e-03"):
        assert text in values


def test_live_display_before_the_first_iteration(tty_env):
    clock = Clock()
    c = Console(True, 300, TITLE, file=io.StringIO(), clock=clock, width=80)
    clock.now = 2.0
    lines = _screen(c, 80)
    c.close()
    assert lines[-1].endswith("0/300  0:00:02 elapsed  eta -:--:--")


def test_summary_shows_units_and_keeps_brackets(plain_env):
    out = io.StringIO()
    Console(True, 3, "run", file=out).summary(
        {"final loss": 0.0123456789, "iterations": 3, "wall time": (29.12874, "s"),
         "long": (3725.0, "s"), "iteration time": (None, "s"), "size [MB]": 2.5})
    text = out.getvalue()
    assert "0.0123457" in text and "29.13 s" in text and "3725 s (1:02:05)" in text
    assert "size [MB]" in text           # not taken for markup
    row = next(line for line in text.splitlines() if "iteration time" in line)
    assert row.split("│")[2].strip() == "-"


def test_summary_message_and_error(plain_env):
    out, err = io.StringIO(), io.StringIO()
    c = Console(True, 3, "run", file=out, err_file=err)
    c.message("loaded [bold]peaks[/]")  # no markup interpretation
    c.summary({"iterations": 3, "metrics": "out/metrics.h5"})
    c.error("objective is nan")
    text = out.getvalue()
    assert "loaded [bold]peaks[/]" in text
    assert "out/metrics.h5" in text and "iterations" in text
    assert err.getvalue() == "error: objective is nan\n"


def test_summary_title_is_one_line_whatever_the_values(plain_env):
    out = io.StringIO()
    title = "serial peaks N=4 P=1 (1 layer x 1 data)"
    Console(True, 3, title, file=out).summary({"objective": 1.26, "iterations": 3})
    assert out.getvalue().splitlines()[0].strip() == f"{title}: summary"


_SCRIPT = """
from lptrain.metrics.console import Console
c = Console(True, 40, "peaks")
for i in range(1, 41):
    c.update(i, loss=1.0 / i, accuracy=i / 40, fwd_iterations=2, fwd_residual=1e-4 / i)
c.message("done")
c.summary({"final loss": 0.025, "wall time": (1.5, "s")})
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
    assert lines[0] == "peaks"
    progress = [line for line in lines if line[:1].isdigit()]
    assert progress[0].startswith("1/40  0:00:00 elapsed  eta -:--:--  loss 1.000  ")
    assert progress[-1].startswith("40/40  ")
    assert "eta 0:00:00  loss 0.02500  acc 1.000  " in progress[-1]
    assert progress[-1].endswith("fwd 2 it 2.5e-06")
    assert "done" in lines
    assert any("final loss" in line and "0.025" in line for line in lines)
    assert any("wall time" in line and "1.5 s" in line for line in lines)
    assert res.stderr == "error: boom\n"


def test_live_bar_on_a_terminal(tty_env):
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
    assert "elapsed" in text and "eta 0:00:00" in text


def test_messages_wrap_between_words_on_a_terminal_only(tty_env, monkeypatch):
    text = "model: /runs/a/model.pt (best validation accuracy 0.87, iteration 50); last: x"
    out = io.StringIO()
    c = Console(True, 5, "peaks", file=out, width=40)
    c.message(text)
    c.close()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    lines = [line.rstrip() for line in plain.splitlines()]
    assert lines[:2] == ["model: /runs/a/model.pt (best validation",
                         "accuracy 0.87, iteration 50); last: x"]
    for name in TTY_VARS:
        monkeypatch.delenv(name, raising=False)
    out = io.StringIO()
    Console(True, 5, "peaks", file=out, width=40).message(text)
    assert out.getvalue() == text + "\n"


class _Logged(logging.Handler):
    """The messages of the "lptrain" logger (the run log's) while in use."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines, self.logger = [], logging.getLogger("lptrain")

    def emit(self, record):
        self.lines.append(record.getMessage())

    def __enter__(self):     # as a run sets it up, whatever other tests' logging did
        self.was = self.logger.level, self.logger.disabled, logging.root.manager.disable
        self.logger.setLevel(logging.INFO)
        self.logger.disabled = False
        logging.disable(logging.NOTSET)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        level, self.logger.disabled, disabled = self.was
        self.logger.setLevel(level)
        logging.disable(disabled)


def test_the_title_s_notes_follow_it_once_in_lines_and_in_the_log(plain_env):
    clock, out = Clock(), io.StringIO()
    notes = ("MGRIT levels (steps): 32 / 8 / 2",)
    with _Logged() as logged:
        with Console(True, 3, "peaks", notes=notes, file=out, clock=clock) as c:
            _iterate(c, clock, range(1, 4), 2.0, loss=0.5)
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["peaks", notes[0]] and lines.count(notes[0]) == 1
    assert logged.lines[:2] == ["peaks", notes[0]] and logged.lines.count(notes[0]) == 1


def test_the_title_s_notes_stand_above_a_live_bar_once(tty_env):
    out, note = io.StringIO(), "MGRIT levels (steps): 1024 / 256 / 64 / 16"
    with _Logged() as logged:
        c = Console(True, 5, "peaks", notes=[note], file=out)
        for i in range(1, 6):
            c.update(i, loss=0.5)
        c.close()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert plain.count(note) == 1 and plain.index(note) < plain.index("5/5")
    assert logged.lines[:2] == ["peaks", note]


class _ClosedPipe(io.StringIO):
    """A reader that has gone: every write raises, as `| head` leaves stdout."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_output_lets_the_run_go_on(plain_env, caplog):
    """rich raised SystemExit(1) there: `lptrain | head -2` failed the run at iteration
    1, status failed, no checkpoint."""
    c = Console(True, 10, TITLE, file=_ClosedPipe())
    with caplog.at_level(logging.WARNING, logger="lptrain"):
        for k in range(1, 4):
            c.update(k, objective=1.0 / k, step_time=0.1)
        c.summary({"iterations": 3})
        c.message("still here")
    assert c._out.quiet
    assert "the console's output was closed; the run goes on" in caplog.text


def test_no_colour_codes_where_the_output_is_no_terminal(monkeypatch):
    """Optuna's log lines (colorlog cannot tell a pipe from its formatter) reached files
    and pipes with escape codes."""
    from lptrain.metrics import streams
    from lptrain.metrics.streams import no_color_in_pipes
    monkeypatch.setitem(streams._COLOUR, "ours", False)     # restored after the test
    env = {}
    no_color_in_pipes(io.StringIO(), env)
    assert env == {"NO_COLOR": "1"}

    class Tty(io.StringIO):
        def isatty(self):
            return True
    env = {}
    no_color_in_pipes(Tty(), env)
    assert env == {}
    env = {"NO_COLOR": ""}                     # the user's own setting stays
    no_color_in_pipes(io.StringIO(), env)
    assert env == {"NO_COLOR": ""}


def test_lptrain_s_own_no_color_leaves_the_console_its_terminal_colours(monkeypatch):
    """`lptrain 2>err.log` on a terminal lost the console's colours to the NO_COLOR set
    for Optuna's lines; a user's NO_COLOR still holds."""
    from lptrain.metrics import streams
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setitem(streams._COLOUR, "ours", True)
    assert Console(True, 3, "run", file=io.StringIO())._out.no_color is False
    monkeypatch.setitem(streams._COLOUR, "ours", False)
    assert Console(True, 3, "run", file=io.StringIO())._out.no_color is True


class _HungUp(io.StringIO):
    """A terminal stream after its terminal closed: writes fail with `code`."""

    def __init__(self, fd: int, code: int):
        super().__init__()
        self.fd, self.code = fd, code

    def fileno(self):
        return self.fd

    def isatty(self):
        return True

    def write(self, text):
        if os.path.samestat(os.fstat(self.fd), os.stat(os.devnull)):
            return len(text)
        raise OSError(self.code, os.strerror(self.code))


def test_a_hung_up_terminal_is_written_to_nowhere_not_raised(tmp_path):
    """A closed terminal sends SIGHUP (a clean stop) and then fails every write with EIO:
    the stop's own lines had failed the run (status failed, no resume line)."""
    import errno
    import types

    from lptrain.metrics.streams import HungUpStream, survive_hangup
    fd = os.open(tmp_path / "tty", os.O_WRONLY | os.O_CREAT)
    try:
        module = types.SimpleNamespace(stdout=_HungUp(fd, errno.EIO), stderr=io.StringIO())
        survive_hangup(module)
        assert isinstance(module.stdout, HungUpStream)
        assert not isinstance(module.stderr, HungUpStream)          # no terminal
        assert module.stdout.write("interrupted by SIGHUP") == 21    # no OSError
        assert os.path.samestat(os.fstat(fd), os.stat(os.devnull))
        assert module.stdout.write("resume with: ...") == 16         # /dev/null now
        module.stdout.writelines(["a\n", "b\n"])
        other = HungUpStream(_HungUp(fd, errno.ENOSPC))
        os.dup2(os.open(tmp_path / "disk", os.O_WRONLY | os.O_CREAT), fd)
        with pytest.raises(OSError, match="No space"):               # not a hang-up
            other.write("x")
    finally:
        os.close(fd)


def test_a_line_on_stderr_breaks_between_words_on_a_terminal_only():
    """The terminal broke `lptrain: ...` lines mid-word at 80 columns, the resume
    command among them ('resume w' / 'ith: lptrain resume=...')."""
    from lptrain.metrics.streams import for_terminal

    class Terminal(io.StringIO):
        def isatty(self):
            return True
    stop = ("lptrain: interrupted by SIGINT after iteration 57 (status interrupted); resume "
            "with: /venv/bin/mpiexec -n 2 /venv/bin/lptrain resume=/tmp/a/long/run/directory")
    assert for_terminal(stop, Terminal(), 80).splitlines() == [
        "lptrain: interrupted by SIGINT after iteration 57 (status interrupted);",
        "  resume with:",
        "  /venv/bin/mpiexec -n 2 /venv/bin/lptrain resume=/tmp/a/long/run/directory"]
    refused = "lptrain: error: foo: not an lptrain option (added with '+'?); " \
              "`lptrain --cfg job` lists the options"
    assert for_terminal(refused, Terminal(), 80).splitlines() == [
        "lptrain: error: foo: not an lptrain option (added with '+'?);",
        "  `lptrain --cfg job` lists the options"]
    assert for_terminal(stop, io.StringIO(), 80) == stop          # a pipe: one line
    # the sweep's command and an install hint stay whole (review: split over lines)
    sweep = ("lptrain: SIGINT in the run's last iteration: /tmp/s/0 ended as metrics.h5 "
             "says; the sweep stops here (`mpiexec -n 2 lptrain resume=/tmp/s` carries on "
             "the jobs left)")
    assert "`mpiexec -n 2 lptrain resume=/tmp/s`" in for_terminal(sweep, Terminal(), 60)
    hint = "lptrain: error: no tensorboard: install lptrain's tensorboard extra: " \
           "`pip install 'lptrain[tensorboard]'`"
    assert "`pip install 'lptrain[tensorboard]'`" in for_terminal(hint, Terminal(), 80)


def test_progress_numbers_keep_their_digits_without_a_bare_point():
    from lptrain.metrics.console import stat_parts
    from lptrain.metrics import schema as s
    assert stat_parts({s.OBJECTIVE: 0.5, s.LOSS: 0.4934}, 0.25) == \
        ["J 0.5000", "loss 0.4934", "0.250 s/it"]
    assert stat_parts({s.OBJECTIVE: 1234.5, s.LOSS: 2000.0}, 123.4) == \
        ["J 1234", "loss 2000", "123 s/it"]          # review: 'J 1234.', '123. s/it'


def test_a_run_that_ends_before_its_first_row_still_shows_its_title():
    """An L-BFGS run diverging in its first iteration printed only its error line: no
    title, no notes (held-out)."""
    out = io.StringIO()
    with Console(True, 10, "serial peaks N=32", notes=["MGRIT levels: 32 / 8"], file=out):
        pass
    assert out.getvalue().splitlines() == ["serial peaks N=32", "MGRIT levels: 32 / 8"]
    out = io.StringIO()
    with Console(True, 10, "serial peaks N=32", file=out) as c:
        c.update(1, loss=0.5)
    c.close()                                     # later calls do nothing
    assert out.getvalue().count("serial peaks N=32") == 1
