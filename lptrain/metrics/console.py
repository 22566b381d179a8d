"""Show training progress on the terminal of rank 0: a live bar, messages, a summary.

On an interactive terminal (as rich decides: a TTY, TERM not dumb) a live display redraws
in place: the run's title, a bar, the finished/total iterations, the elapsed time and the
estimated time left on one line (the title on a line of its own above when the terminal
is too narrow for both), the latest values below; the title's notes (e.g. the MGRIT
levels) are printed once above it, broken between words at the terminal's width.
Through a pipe or into a file (CI, `| tee`, every rank under mpiexec) it prints plain
lines instead, never escape codes, at a time-based cadence (`Cadence`): the title and its
notes once, then per shown iteration its position and values broken between groups at
the console's width (80 columns unless COLUMNS says otherwise, or a rank finds the
terminal its MPI launcher writes to), so that a terminal behind a pipe never wraps them
mid-value. With `enabled=False` (ranks other than 0) every method does nothing.

Every plain line (progress, messages, errors, the summary as `name: value` lines) also goes
to the "lptrain" logger, live display or not: the lptrain command's Hydra job log
(`<run dir>/lptrain.log`) holds them.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import IO, Callable, Sequence

from rich.console import Console as RichConsole
from rich.console import Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from lptrain.metrics import schema as s
from lptrain.metrics.streams import colour_off, launcher_columns, to_devnull
from lptrain.metrics.console_text import FIELDS, broken, format_value, stat_parts, wrap_parts
from lptrain.metrics.quantities import format_duration, iteration_time

INDENT = "  "                   # plain progress lines after an iteration's first
MIN_BAR = 10                    # the bar's least width (or a fifth of the terminal)
MIN_COLUMNS = 20                # the least width the console takes COLUMNS for
log = logging.getLogger("lptrain")


class _Terminal(RichConsole):
    """rich's console, going on quietly once its output cannot be written: its reader has
    gone (`| head`, a pager or terminal closed), where rich ends the process (SystemExit 1),
    or a write failed (stdout to a full disk or /dev/full), where rich raises; either
    failed the run mid-training with no checkpoint. The run goes on; lptrain.log keeps
    every line."""

    def on_broken_pipe(self) -> None:
        self._gone("was closed")

    def _write_buffer(self) -> None:
        try:
            super()._write_buffer()
        except BrokenPipeError:
            raise                      # rich's _check_buffer calls on_broken_pipe
        except OSError as exc:
            self._gone(f"cannot be written ({exc.strerror or exc})")

    def _gone(self, why: str) -> None:
        self.quiet = True
        to_devnull(self.file)
        log.warning(f"the console's output {why}; the run goes on (this log keeps "
                    "every line)")


@dataclass(frozen=True)
class Cadence:
    """When the plain console prints a progress line: always at the first and the last
    iteration, and between them once `gap` seconds have passed since the previous line,
    which spreads about `lines` lines over the run's expected duration, at least `min_gap`
    and at most `max_gap` seconds apart (a minute-long run: a line every 3 s; a day-long
    one: every 30 s; a run of a few seconds: every second)."""

    lines: int = 20
    min_gap: float = 1.0
    max_gap: float = 30.0

    def __post_init__(self):
        if self.lines < 1 or not 0 < self.min_gap <= self.max_gap:
            raise ValueError(f"cadence: need lines >= 1 and 0 < min_gap <= max_gap, got "
                             f"lines={self.lines}, min_gap={self.min_gap}, "
                             f"max_gap={self.max_gap}")

    def gap(self, run_seconds: float) -> float:
        """Seconds between lines in a run expected to take `run_seconds`."""
        return min(max(run_seconds / self.lines, self.min_gap), self.max_gap)


class Console:
    """Progress display of one training run (see the module docstring).

    `clock` (seconds, monotonic) times the elapsed time, the ETA and the cadence; `width`
    overrides the terminal's width; `done` and `before`: a resumed run's iterations and
    seconds before this start, which its live bar starts from.
    """

    def __init__(self, enabled: bool, total: int, title: str = "training", *,
                 notes: Sequence[str] = (), file: IO[str] | None = None,
                 err_file: IO[str] | None = None, cadence: Cadence = Cadence(),
                 clock: Callable[[], float] = time.monotonic, width: int | None = None,
                 done: int = 0, before: float = 0.0):
        self.enabled, self.total, self.title = enabled, total, title
        self._closed = False
        self.notes = tuple(notes)        # lines that go with the title, shown once
        self.cadence, self._clock = cadence, clock
        self._values: dict = {}
        self._step_times: list[float] = []
        self._first = self._iteration = self._first_at = None  # first, latest iteration
        self._updated = self._shown = None     # clock at the latest update / printed line
        self._elapsed = 0.0                    # the run's elapsed seconds at that update
        self._doing: str | None = None         # what the run does between iterations
        self._done = done                      # iterations done before this start
        self._live, self.live = None, False
        if not enabled:
            return
        self._start, self._before = clock(), float(before)   # a resumed run's earlier time
        # a rank: the terminal mpiexec writes to, which breaks nothing between words
        behind = launcher_columns(file or sys.stdout) \
            if width is None and "COLUMNS" not in os.environ else None
        narrowest = _narrowest(os.environ)
        self._behind, width = behind is not None, behind or width or narrowest
        self._out = _Terminal(file=file, highlight=False, width=width, no_color=colour_off())
        # stderr=True resolves sys.stderr at print time, so it lands above a live display
        self._err = _Terminal(file=err_file, stderr=err_file is None, highlight=False,
                              no_color=colour_off(), width=narrowest)
        self.live = self._out.is_interactive
        if self.live:
            self._live = Live(console=self._out, get_renderable=self.display,
                              refresh_per_second=4)
            self._live.start()
            for line in (self.title, *self.notes):   # the log: when the run started
                log.info(line)
            for note in self.notes:      # above the bar, which shows the title
                self._out.print(Text("\n".join(broken(note, self.width))), soft_wrap=True)
        else:     # a pipe or file: what was launched shows at once, not with the first
            self._print_title()       # iteration's line (minutes later on a large run)

    def update(self, iteration: int, elapsed: float | None = None, **fields) -> None:
        """Show iteration `iteration` (finished iterations, up to `total`) and its fields.

        Fields are those of `FIELDS`; a field keeps its last value until it is given again
        (validation accuracy is typically logged every few iterations). Without
        `step_time` the iteration's duration is measured between calls. `elapsed`: the
        run's wall time at the end of this iteration (train/wall_time, a resumed run's
        earlier time included), which the elapsed time shows from then on, so that the
        last line agrees with the summary's wall time; else the console's own clock
        (which also counts start-up and the validation after the iteration).
        """
        unknown = set(fields) - set(FIELDS)
        if unknown:
            raise KeyError(f"console fields unknown: {', '.join(sorted(unknown))}; "
                           f"known: {', '.join(FIELDS)}")
        if not self.enabled:
            return
        now = self._clock()
        step = fields.pop(s.STEP_TIME, None)
        if step is None and self._iteration is not None and iteration > self._iteration:
            step = (now - self._updated) / (iteration - self._iteration)
        if step is not None:
            self._step_times.append(float(step))
        self._values.update({k: v for k, v in fields.items() if v is not None})
        if self._first is None:
            self._first, self._first_at = iteration, now
        self._iteration, self._updated, self._doing = iteration, now, None
        self._elapsed = now - self._start + self._before if elapsed is None else elapsed
        if (self._shown is None or iteration >= self.total
                or now - self._shown >= self.cadence.gap(self._run_seconds())):
            self._print_progress()

    def doing(self, what: str | None) -> None:
        """What the run does now outside an iteration (`validating`): the live display
        shows it in place of the ETA until the next update; lines printed are unchanged."""
        self._doing = what

    def carry_on(self, step_times) -> None:
        """A resumed run: its earlier iterations' durations count in the iteration time
        (as lptrain-report counts them), before this start's (its earlier seconds and
        iterations: the constructor's `before` and `done`)."""
        self._step_times[:0] = [float(t) for t in step_times]

    def iteration_time(self) -> float | None:
        """The iteration time [s] of the run's iterations so far (metrics/quantities.py)."""
        return iteration_time(self._step_times)

    def progress_lines(self) -> list[str]:
        """The plain lines of the latest iteration: i/total, elapsed, ETA and the values,
        broken between groups to fit the console's width (the run's title is printed once,
        above the first); lines after the first are indented."""
        parts = [self._position(),
                 *stat_parts(self._values, self.iteration_time(), self._iteration)]
        lines = wrap_parts(parts, max(self._out.width - len(INDENT), 20))
        return [lines[0], *(INDENT + line for line in lines[1:])]

    def display(self) -> Group:
        """What the live display shows now: the bar line, the values below it."""
        width = self._out.width
        now = self._clock()
        right = Text(self._position(None if self._closed else now))
        parts = stat_parts(self._values, self.iteration_time(), self._iteration)
        return Group(*_bar_lines(self.title, self._iteration or self._done, self.total,
                                 right, width),
                     *(Text(line) for line in wrap_parts(parts, width)))

    @property
    def width(self) -> int:
        """The console's columns (80 unless the terminal or COLUMNS says otherwise)."""
        return self._out.width if self.enabled else 80

    def message(self, text: str, whole: bool = False) -> None:
        """Print one line of plain text (above the bar when it is live), `_fitted`: on a
        terminal broken between words at its width, in a pipe or file whole. `whole`: a
        line that holds a path (which may have spaces) goes whole to a terminal too,
        which wraps it at its edge and copies it back whole."""
        if self.enabled:
            log.info(text)      # one print: a live display redraws between two
            self._out.print(Text(text if whole else "\n".join(self._fitted(text))),
                            soft_wrap=whole or not self._out.is_terminal)

    def _fitted(self, line: str) -> list[str]:
        """`line` as a terminal (also one behind mpiexec's pipe) should get it, `broken`
        at its width (the terminal itself would break it without an indent); a pipe or
        file gets it whole."""
        if not (self._behind or self._out.is_terminal) or len(line) <= self.width:
            return [line]
        return broken(line, self.width)

    def paragraph(self, text: str) -> None:
        """Print `text` `broken` at the console's width, on a terminal and in a pipe
        alike."""
        for line in broken(text, self.width):
            self.message(line)

    def error(self, text: str) -> None:
        """Print one red line on stderr."""
        if self.enabled:
            log.error(text)
            self._err.print(Text(f"error: {text}", style="bold red"),
                            soft_wrap=not self._err.is_terminal)

    def summary(self, rows: dict) -> None:
        """Print a two-column table of final quantities: {name: value} or, with a unit,
        {name: (value, unit)}, e.g. {'loss': 0.12, 'wall time': (29.1, 's')}."""
        if not self.enabled:
            return
        title = f"{self.title}: summary"
        if len(title) + 2 > self.width:      # the run's title is on screen above it
            title = "summary"
        # at least as wide as its title, so the title stays one line whatever the values
        table = Table(title=title, show_header=False, min_width=len(title) + 2)
        table.add_column("quantity", style="bold")
        table.add_column("value", justify="right", overflow="fold")
        for name, value in rows.items():
            text = format_value(*value) if isinstance(value, tuple) else format_value(value)
            table.add_row(Text(str(name)), Text(text))
            log.info("%s: %s", name, text)
        self._out.print(table)

    def close(self) -> None:
        """Stop the live display, leaving its last state on screen; print the latest
        iteration if its line was not due yet (a run that stopped early). Later calls do
        nothing."""
        if not self.enabled:
            return
        if self._live is not None:
            self._closed = True      # its last frame: the last update's time, not a clock
            self._live.stop()        # that ran on through the final checkpoint
            self._live = None
        if self._iteration is not None and self._shown is not None \
                and self._shown < self._updated:
            self._print_progress()
        self._closed = True

    def __enter__(self) -> Console:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close()
        return False

    # -- internals -----------------------------------------------------------------------
    def _print_title(self) -> None:
        for line in (self.title, *self.notes):
            log.info(line)
            for part in self._fitted(line):
                self._out.print(Text(part), soft_wrap=True)

    def _print_progress(self) -> None:
        lines = self.progress_lines()
        for line in lines:
            log.info(line)
            if not self.live:
                self._out.print(Text(line), soft_wrap=True)
        self._shown = self._updated

    def _eta(self) -> float:
        """Seconds left at the pace of this start's iterations after its first (which pays
        one-time costs): nan until there are two, 0 once all are done."""
        left = max(self.total - self._iteration, 0)
        if left == 0:
            return 0.0
        if self._iteration <= self._first:
            return math.nan
        return (self._updated - self._first_at) / (self._iteration - self._first) * left

    def _run_seconds(self) -> float:
        """This start's expected duration (0 while unknown)."""
        expected = self._updated - self._start + self._eta()
        return expected if math.isfinite(expected) else 0.0

    def _position(self, now: float | None = None) -> str:
        """'12/300  0:00:28 elapsed  eta 0:00:42': elapsed at `now` (a live display's
        clock; what the run is `doing` in place of the ETA), else at the update; before
        this start's first update, the iterations done before it and the clock's time."""
        if self._iteration is None:
            iteration, eta, ticking = self._done, math.nan, True
            elapsed = (self._clock() if now is None else now) - self._start + self._before
        else:
            iteration, eta, ticking = self._iteration, self._eta(), now is not None
            elapsed = self._elapsed + (0.0 if now is None else now - self._updated)
        doing = self._doing if ticking and self._doing else f"eta {format_duration(eta)}"
        return f"{iteration}/{self.total}  {format_duration(elapsed)} elapsed  {doing}"


def _narrowest(environ) -> int | None:
    """MIN_COLUMNS where COLUMNS asks for fewer (at 0 rich prints nothing, at 5 empty
    cells); None otherwise (rich reads COLUMNS itself)."""
    given = environ.get("COLUMNS", "")
    return MIN_COLUMNS if given.isdigit() and int(given) < MIN_COLUMNS else None


def _bar_lines(title: str, completed: int, total: int, right: Text, width: int) -> list:
    """Title, bar and `right` on one line of `width` columns when the bar keeps
    max(MIN_BAR, width / 5) columns; otherwise the title on a line of its own above."""
    room = width - right.cell_len - 1           # for the bar and the title
    bar_min = max(MIN_BAR, width // 5)
    lines = []
    if len(title) + 1 + bar_min <= room:
        grid = _row([(Text(title, style="bold"), len(title))], room - len(title) - 1,
                    completed, total, right)
    else:
        lines.append(Text(title, style="bold", no_wrap=True, overflow="ellipsis"))
        grid = _row([], room, completed, total, right)
    return [*lines, grid]


def _row(cells: list, bar_width: int, completed: int, total: int, right: Text) -> Table:
    """A one-line grid: the (text, width) `cells`, a bar `bar_width` wide (left out when
    narrower than 3 columns), `right`."""
    grid = Table.grid(padding=(0, 1))
    row = []
    for text, width in cells:
        grid.add_column(width=width, no_wrap=True)
        row.append(text)
    if bar_width >= 3:
        grid.add_column(width=bar_width, no_wrap=True)
        row.append(ProgressBar(total=max(total, 1), completed=min(completed, total),
                               width=bar_width))
    grid.add_column(no_wrap=True)
    row.append(right)
    grid.add_row(*row)
    return grid
