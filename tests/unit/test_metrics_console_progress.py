"""The console's progress: the plain lines' cadence and width, the live display at 80 and
160 columns, and the title with its notes."""
import io
import logging
import re

import pytest
from rich.console import Console as RichConsole

from helpers import CONSOLE_TITLE, TTY_VARS
from lptrain.metrics.console import Cadence, Console
from lptrain.metrics.console_text import SEPARATOR, stat_parts

MGRIT = dict(loss=0.41234, accuracy=0.8391, val_accuracy=0.82, fwd_iterations=3,
             fwd_residual=7.4e-4, adj_iterations=3, adj_residual=8.8e-7, grad_error=4.4e-3)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 0.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


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


def _printed(out) -> list[int]:
    """The iterations whose lines were printed (a line '12/300  0:00:28 elapsed ...')."""
    return [int(line.split("/")[0]) for line in out.getvalue().splitlines()
            if line[:1].isdigit()]


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
        ["peaks", "1/300  0:00:08 elapsed  eta -:--:--  loss 0.5000"]   # no timed one yet
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
    with Console(True, 1200, CONSOLE_TITLE, file=out, clock=clock, width=width) as c:
        _iterate(c, clock, range(1, 3), 1.5, objective=1.0937, **MGRIT)
    lines = out.getvalue().splitlines()
    assert lines[0] == CONSOLE_TITLE                                  # once, above the first
    assert lines.count(CONSOLE_TITLE) == 1 and all(len(ln) <= width for ln in lines[1:])
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
    c = Console(True, 300, CONSOLE_TITLE, file=io.StringIO(), clock=clock, width=width)
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
    assert CONSOLE_TITLE in lines[0]                  # whole, on the bar's line only when it fits
    assert (lines[0] == bar) == (width == 160)
    values = " ".join(lines[lines.index(bar) + 1:])
    for text in ("loss 0.4123", "acc 0.839", "val 0.820", "0.250 s/it", "fwd 3 it 7.4e-04",
                 "adj 3 it 8.8e-07", "gerr 4.4e-03"):
        assert text in values


def test_live_display_before_the_first_iteration(tty_env):
    clock = Clock()
    c = Console(True, 300, CONSOLE_TITLE, file=io.StringIO(), clock=clock, width=80)
    clock.now = 2.0
    lines = _screen(c, 80)
    c.close()
    assert lines[-1].endswith("0/300  0:00:02 elapsed  eta -:--:--")


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
    # its second line indented, as the run's notes (at 60 columns a model line went on
    # unindented: held-out)
    assert lines[:2] == ["model: /runs/a/model.pt (best validation",
                         "  accuracy 0.87, iteration 50); last: x"]
    for name in TTY_VARS:
        monkeypatch.delenv(name, raising=False)
    out = io.StringIO()
    Console(True, 5, "peaks", file=out, width=40).message(text)
    assert out.getvalue() == "peaks\n" + text + "\n"      # the title first, at once


def test_a_pipe_shows_the_title_and_notes_at_once_and_once(plain_env):
    """Through a pipe the title and notes came with the first iteration's line: 3.5
    minutes of silence before a full MNIST run's first line (held-out check)."""
    out = io.StringIO()
    c = Console(True, 3, "serial mnist N=30 P=2", notes=["MGRIT levels: 30 / 8"], file=out)
    assert out.getvalue() == "serial mnist N=30 P=2\nMGRIT levels: 30 / 8\n"
    c.update(1, objective=1.0, step_time=0.5)
    c.update(3, objective=0.5, step_time=0.5)
    c.close()
    lines = out.getvalue().splitlines()
    assert lines.count("serial mnist N=30 P=2") == 1 and len(lines) > 3


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
        # logged at the start, not with the first iteration's line (held-out: the log
        # stamped a terminal run's title 31 s late, after the first validation)
        assert logged.lines == ["peaks", note]
        for i in range(1, 6):
            c.update(i, loss=0.5)
        c.close()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert plain.count(note) == 1 and plain.index(note) < plain.index("5/5")
    assert logged.lines[:2] == ["peaks", note]


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


NOT_USED = ("not used: mgrit.levels=2 mgrit.cfactor0=2 mgrit.grad_tol=0.01 "
            "(mode=serial runs no MGRIT)")


def test_a_long_note_goes_whole_to_a_pipe_and_the_log(plain_env):
    out = io.StringIO()
    with _Logged() as logged:
        Console(True, 3, "peaks", notes=[NOT_USED], file=out, width=40).close()
    assert out.getvalue().splitlines() == ["peaks", NOT_USED]
    assert logged.lines == ["peaks", NOT_USED]


def test_a_long_note_above_a_live_bar_is_broken_at_the_terminal_s_width(tty_env):
    """At 60 columns the 'not used' note, broken at a fixed 80 before, was wrapped again by
    the terminal, its second line without an indent (held-out)."""
    out = io.StringIO()
    c = Console(True, 5, "peaks", notes=[NOT_USED], file=out, width=60)
    c.close()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue()).splitlines()
    first = [i for i, ln in enumerate(plain) if ln.startswith("not used:")][0]
    assert plain[first:first + 2] == ["not used: mgrit.levels=2 mgrit.cfactor0=2",
                                      "  mgrit.grad_tol=0.01 (mode=serial runs no MGRIT)"]


def test_a_summary_title_wider_than_the_terminal_is_left_to_the_bar(tty_env):
    """At 60 columns the title broke as '…(1 layer x 1 data):' over 'summary' (held-out);
    the live bar above shows the run's title."""
    title = "simultaneous fashion_mnist N=32 P=1 (1 layer x 1 data)"
    for width, shown in ((60, "summary"), (80, f"{title}: summary")):
        out = io.StringIO()
        c = Console(True, 1, title, file=out, width=width)
        c.update(1, loss=0.5)
        c.close()
        c.summary({"iterations": 1})
        plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue()).splitlines()
        assert plain[-4].strip() == shown, plain


def test_a_resumed_runs_live_bar_starts_where_it_stopped(tty_env):
    """The bar of a run resumed after 16 of 80 iterations showed 0/80 and 0:00:00 until
    its first new iteration ended (held-out)."""
    clock, out = Clock(100.0), io.StringIO()
    c = Console(True, 80, "peaks", file=out, clock=clock, done=16, before=5.0)
    first = "".join(seg.text for seg in c._out.render(c.display()))   # before carry_on
    c.carry_on([0.3] * 16)
    clock.now = 102.0
    text = "".join(seg.text for seg in c._out.render(c.display()))
    c.close()
    assert "16/80  0:00:05 elapsed" in first and "0/80" not in first, first
    assert "16/80  0:00:07 elapsed" in text, text


def test_a_path_goes_whole_to_a_terminal(tty_env):
    """Broken between words, 'metrics: /tmp/dir with space/x/metrics.h5' put a newline
    and an indent inside the path a user copies (held-out)."""
    line = "metrics: /tmp/a dir with spaces/another run dir/x/metrics.h5"
    out = io.StringIO()
    c = Console(True, 1, "peaks", file=out, width=40)
    c.message(line, whole=True)
    c.close()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert line in plain.replace("\r", "")
