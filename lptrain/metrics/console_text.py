"""The console's text: the values of an iteration as groups that stay on one line, lines
broken between groups or words at a width, and the summary's values with their units.
Pure formatting; console.py decides where and when they are printed."""
from __future__ import annotations

import math
import textwrap

from lptrain.metrics import schema as s
from lptrain.metrics.quantities import format_duration

VAL_ACCURACY = "val_accuracy"  # validation accuracy (validation/accuracy in the file)
GRAD_ERROR = "grad_error"      # the one-shot gradient's estimated relative error
FRACTION = "fraction"          # summary unit of accuracies: four decimals, no suffix
VAL_ITERATION = "val_iteration"  # the iteration the shown validation accuracy is from

# field -> (label, format); the order here is the order on screen
_SHOWN = {
    s.OBJECTIVE: ("J", lambda v: _digits(v, 4)),      # 0.5000 beside 0.4934
    s.LOSS: ("loss", lambda v: _digits(v, 4)),
    s.ACCURACY: ("acc", "{:.3f}".format),
    VAL_ACCURACY: ("val", "{:.3f}".format),
}
# MGRIT solves are shown as "fwd <iterations> it <residual>"
_SOLVES = {"fwd": (s.FWD_ITERATIONS, s.FWD_RESIDUAL), "adj": (s.ADJ_ITERATIONS, s.ADJ_RESIDUAL)}
FIELDS = (*_SHOWN, s.STEP_TIME, s.FWD_ITERATIONS, s.FWD_RESIDUAL, s.ADJ_ITERATIONS,
          s.ADJ_RESIDUAL, GRAD_ERROR, VAL_ITERATION)
SEPARATOR = "  "


def _digits(value: float, digits: int) -> str:
    """`value` to `digits` significant digits with their trailing zeros (0.250, not
    0.25), without a bare point (1234, not 1234.); nan and inf as they are."""
    return f"{value:#.{digits}g}".rstrip(".")


def stat_parts(values: dict, seconds_per_iteration: float | None = None,
               iteration: int | None = None) -> list[str]:
    """The fields present in `values` and the iteration time so far, as groups that stay
    on one line, e.g. ['loss 0.2', 'acc 0.910', '0.042 s/it', 'fwd 2 it 3.0e-06'] (gerr:
    the estimated relative error of the gradient, docs/method.md §6). A validation
    accuracy from an earlier iteration than `iteration` names it: 'val 0.835 (it 10)'."""
    at = values.get(VAL_ITERATION)
    stale = f" (it {at})" if at is not None and at != iteration else ""
    parts = [f"{label} {fmt(values[name])}{stale if name == VAL_ACCURACY else ''}"
             for name, (label, fmt) in _SHOWN.items() if values.get(name) is not None]
    if seconds_per_iteration is not None:
        parts.append(f"{_digits(seconds_per_iteration, 3)} s/it")
    for label, (its, res) in _SOLVES.items():
        solve = [f"{values[its]} it" if values.get(its) is not None else "",
                 f"{values[res]:.1e}" if values.get(res) is not None else ""]
        if any(solve):
            parts.append(" ".join([label, *filter(None, solve)]))
    if values.get(GRAD_ERROR) is not None:
        parts.append(f"gerr {values[GRAD_ERROR]:.1e}")
    return parts


def wrap_parts(parts: list[str], width: int) -> list[str]:
    """`parts` joined into lines of at most `width` columns, breaking only between parts
    (a part wider than `width` gets a line of its own)."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(SEPARATOR) + len(part) <= width:
            lines[-1] += SEPARATOR + part
        else:
            lines.append(part)
    return lines


def broken(line: str, width: int) -> list[str]:
    """`line` broken between words into lines of at most `width` columns (a word wider
    gets a line of its own), its indent kept and the lines after the first indented two
    spaces more, as the run's notes are."""
    lead = line[:len(line) - len(line.lstrip(" "))]
    return textwrap.wrap(line.lstrip(" "), width, initial_indent=lead,
                         subsequent_indent=lead + "  ", break_long_words=False,
                         break_on_hyphens=False) or [line]


def format_value(value, unit: str = "") -> str:
    """'0.123457', '1.12710', '12', '29.10 s', '3725 s (1:02:05)', '37250 s (10:20:50)',
    an accuracy (unit 'fraction') '0.7400'; '-' for None. Floats keep their trailing
    zeros, so that values of one kind show as many digits."""
    if value is None:
        return "-"
    if unit == FRACTION:
        return f"{value:.4f}"
    if unit == "s" and isinstance(value, (int, float)):
        # whole seconds from 1000 on (not 3.725e+04); h:mm:ss as the progress line has
        # it (seconds rounded down: 119.6 s is 0:01:59)
        text = f"{value:.0f}" if math.isfinite(value) and value >= 1e3 else \
            _digits(value, 4)
        return f"{text} s ({format_duration(value)})" if value >= 60 else f"{text} s"
    text = _digits(value, 6) if isinstance(value, float) else str(value)
    return f"{text} {unit}" if unit else text

