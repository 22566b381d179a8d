"""The console's words and numbers: the statistics of a progress line, durations, the
summary table's units, and silence when disabled."""
import io
import math

import pytest

from lptrain.metrics.console import Console
from lptrain.metrics.console_text import FRACTION, SEPARATOR, stat_parts, wrap_parts
from lptrain.metrics.quantities import format_duration, iteration_time


def format_stats(values: dict, seconds: float | None = None) -> str:
    return SEPARATOR.join(stat_parts(values, seconds))


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
    assert iteration_time([4.0]) is None                     # the first only: none
    assert iteration_time([]) is None and iteration_time(None) is None
    assert format_duration(3725.9) == "1:02:05" and format_duration(math.nan) == "-:--:--"
    from lptrain.metrics.console_text import format_value as _format_value
    assert _format_value(145.96, "s") == "146.0 s (0:02:25)"     # h:mm:ss as the bar has it
    assert _format_value(37250.3, "s") == "37250 s (10:20:50)"   # not 3.725e+04


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
    assert [line.strip() for line in out.getvalue().splitlines()[:2]] == \
        [title, f"{title}: summary"]        # the title said at the start, then the table's


def test_progress_numbers_keep_their_digits_without_a_bare_point():
    from lptrain.metrics.console_text import stat_parts
    from lptrain.metrics import schema as s
    assert stat_parts({s.OBJECTIVE: 0.5, s.LOSS: 0.4934}, 0.25) == \
        ["J 0.5000", "loss 0.4934", "0.250 s/it"]
    assert stat_parts({s.OBJECTIVE: 1234.5, s.LOSS: 2000.0}, 123.4) == \
        ["J 1234", "loss 2000", "123 s/it"]          # review: 'J 1234.', '123. s/it'


def test_a_paragraph_breaks_between_words_with_an_indent(plain_env):
    """The stall message came as one 287-character line in a pipe and wrapped without an
    indent on a terminal, where every other note is broken (held-out check)."""
    from lptrain.app import _stall_message
    from lptrain.config import compose
    from lptrain.train.loop import Outcome
    opts, _ = compose(["mode=simultaneous", "optimizer=sgd", "train.patience=3"])
    outcome = Outcome(iterations=5, objective=1.0, loss=1.0, accuracy=0.5, val_loss=1.0,
                      val_accuracy=0.5, best_val_accuracy=0.5, wall_time=1.0,
                      converged=False, stalled="the objective has not decreased for 3 "
                      "iterations (best 1.4641)")
    text = _stall_message(opts, outcome)
    out = io.StringIO()
    Console(True, 3, "run", file=out, width=80).paragraph(text)
    title, *lines = out.getvalue().splitlines()
    assert title == "run" and len(text) > 200 and len(lines) == 4
    assert all(len(line) <= 80 for line in lines)
    assert lines[0].startswith("stalled after 5 iterations: the objective")
    assert all(line.startswith("  ") and line[2] != " " for line in lines[1:])
    assert " ".join(line.strip() for line in lines) == text
