"""Show training progress on the terminal of rank 0: a rich progress bar, messages, a summary.

On an interactive terminal the bar redraws in place. When the output is a pipe or a file
(CI, `| tee`), or TERM is dumb, the console instead prints one plain line every `every`
iterations and never emits escape codes. With `enabled=False` (ranks other than 0) every
method does nothing.

Every line the plain console prints (progress every `every` iterations, messages, errors,
the summary as `name: value` lines) also goes to the "lptrain" logger, live bar or not:
the lptrain command's Hydra job log (`<run dir>/lptrain.log`) holds them.
"""
from __future__ import annotations

import logging
import time
from typing import IO

from rich.console import Console as RichConsole
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn)
from rich.table import Table
from rich.text import Text

from lptrain.metrics import schema as s

VAL_ACCURACY = "val_accuracy"  # validation accuracy (validation/accuracy in the file)

# field -> (label, format); the order here is the order on screen
_SHOWN = {
    s.OBJECTIVE: ("J", "{:.4g}"),
    s.LOSS: ("loss", "{:.4g}"),
    s.ACCURACY: ("acc", "{:.3f}"),
    VAL_ACCURACY: ("val", "{:.3f}"),
    s.STEP_TIME: ("s/it", "{:.3g}"),
}
# MGRIT solves are shown as "fwd <iterations> it <residual>"
_SOLVES = {"fwd": (s.FWD_ITERATIONS, s.FWD_RESIDUAL), "adj": (s.ADJ_ITERATIONS, s.ADJ_RESIDUAL)}
GRAD_ERROR = "grad_error"   # the one-shot gradient's estimated relative error, last
FIELDS = (*_SHOWN, s.FWD_ITERATIONS, s.FWD_RESIDUAL, s.ADJ_ITERATIONS, s.ADJ_RESIDUAL,
          GRAD_ERROR)
log = logging.getLogger("lptrain")


def format_stats(values: dict) -> str:
    """One line of the fields present in `values`, e.g. 'loss 0.2 acc 0.910 fwd 2 it 3.0e-06'
    (gerr: the estimated relative error of the gradient, docs/method.md §6)."""
    parts = [f"{label} {fmt.format(values[name])}"
             for name, (label, fmt) in _SHOWN.items() if values.get(name) is not None]
    for label, (its, res) in _SOLVES.items():
        solve = [f"{values[its]} it" if values.get(its) is not None else "",
                 f"{values[res]:.1e}" if values.get(res) is not None else ""]
        if any(solve):
            parts.append(" ".join([label, *filter(None, solve)]))
    if values.get(GRAD_ERROR) is not None:
        parts.append(f"gerr {values[GRAD_ERROR]:.1e}")
    return "  ".join(parts)


class Console:
    """Progress display of one training run (see the module docstring)."""

    def __init__(self, enabled: bool, total: int, title: str = "training", *,
                 file: IO[str] | None = None, err_file: IO[str] | None = None,
                 every: int | None = None):
        self.enabled = enabled
        self.total = total
        self.title = title
        self.every = every or max(1, total // 20)
        self._values: dict = {}
        self._progress = None
        self._last = None  # (iteration, monotonic time) of the previous update
        if not enabled:
            return
        self._out = RichConsole(file=file, highlight=False)
        # stderr=True resolves sys.stderr at print time, so it lands above a live bar
        self._err = RichConsole(file=err_file, stderr=err_file is None, highlight=False)
        self.live = self._out.is_interactive
        if self.live:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
                console=self._out)
            self._task = self._progress.add_task(title, total=total, stats="")
            self._progress.start()

    def update(self, iteration: int, **fields) -> None:
        """Show iteration `iteration` (finished iterations, up to `total`) and its fields.

        Fields are those of `FIELDS`; a field keeps its last value until it is given again
        (validation accuracy is typically logged every few iterations). Without
        `step_time` the time per iteration is measured between calls.
        """
        unknown = set(fields) - set(FIELDS)
        if unknown:
            raise KeyError(f"console fields unknown: {', '.join(sorted(unknown))}; "
                           f"known: {', '.join(FIELDS)}")
        if not self.enabled:
            return
        self._values.update({k: v for k, v in fields.items() if v is not None})
        now, first = time.monotonic(), self._last is None
        if s.STEP_TIME not in fields and self._last and iteration > self._last[0]:
            self._values[s.STEP_TIME] = (now - self._last[1]) / (iteration - self._last[0])
        self._last = (iteration, now)
        stats = format_stats(self._values)
        if self._progress is not None:
            self._progress.update(self._task, completed=min(iteration, self.total),
                                  stats=stats)
        if first or iteration % self.every == 0 or iteration >= self.total:
            line = f"{self.title} {iteration}/{self.total}  {stats}"
            log.info(line)
            if self._progress is None:
                self._out.print(Text(line), soft_wrap=True)

    def message(self, text: str) -> None:
        """Print one line of plain text (above the bar when it is live)."""
        if self.enabled:
            log.info(text)
            self._out.print(Text(text), soft_wrap=True)

    def error(self, text: str) -> None:
        """Print one red line on stderr."""
        if self.enabled:
            log.error(text)
            self._err.print(Text(f"error: {text}", style="bold red"), soft_wrap=True)

    def summary(self, rows: dict) -> None:
        """Print a two-column table of final quantities, e.g. {'final loss': 0.12}."""
        if not self.enabled:
            return
        title = f"{self.title}: summary"
        # at least as wide as its title, so the title stays one line whatever the values
        table = Table(title=title, show_header=False, min_width=len(title) + 2)
        table.add_column("quantity", style="bold")
        table.add_column("value", overflow="fold")
        for name, value in rows.items():
            table.add_row(str(name), _format_value(value))
            log.info("%s: %s", name, _format_value(value))
        self._out.print(table)

    def close(self) -> None:
        """Stop the live bar, leaving its last state on screen; later calls do nothing."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def __enter__(self) -> Console:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close()
        return False


def _format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
