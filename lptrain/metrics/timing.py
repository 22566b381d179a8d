"""Where each rank's time went: timing/'s compute, communication and waiting, totalled.

Every optimizer iteration, each rank's clock splits the iteration's duration into
seconds spent in communication calls (sends, collectives), seconds blocked waiting for
messages, and the rest, computing (train/loop.py); rank 0 logs one row per iteration.
Here the rows of one grid are summed per rank and rendered for the run's summary (plain
text, 80 columns) and for lptrain-report (markdown). A collective counts as
communication as a whole, also where it waited for a slower rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from lptrain.errors import counted
from lptrain.metrics import schema as s
from lptrain.metrics.console_text import SEPARATOR, wrap_parts

KINDS = (s.COMPUTE, s.COMMUNICATION, s.WAITING)
LISTED = 8          # ranks listed one by one; beyond, the fastest, median and slowest


@dataclass(frozen=True)
class RankTime:
    """One rank's seconds of each kind, summed over the iterations."""

    rank: int
    compute: float
    communication: float
    waiting: float

    @property
    def total(self) -> float:
        return self.compute + self.communication + self.waiting

    def share(self, seconds: float) -> float:
        """`seconds` as a percentage of this rank's total (0 when the total is 0)."""
        return 100.0 * seconds / self.total if self.total > 0 else 0.0


@dataclass(frozen=True)
class TimingSummary:
    """Per-rank totals over `iterations` iterations of one grid."""

    iterations: int
    ranks: tuple[RankTime, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def compute_share(self) -> float:
        """Percentage of all ranks' time spent computing."""
        total = sum(r.total for r in self.ranks)
        return 100.0 * sum(r.compute for r in self.ranks) / total if total > 0 else 0.0

    @property
    def imbalance(self) -> float:
        """The most computing rank's compute seconds over the ranks' mean (1: balanced)."""
        mean = sum(r.compute for r in self.ranks) / self.size
        return max(r.compute for r in self.ranks) / mean if mean > 0 else 1.0

    def shown(self) -> list[tuple[str, RankTime]]:
        """(label, rank) rows to show: every rank up to LISTED of them, else the ranks
        that computed least, the median and most."""
        if self.size <= LISTED:
            return [(str(r.rank), r) for r in self.ranks]
        order = sorted(self.ranks, key=lambda r: (r.compute, r.rank))
        picks = (("least", order[0]), ("median", order[(self.size - 1) // 2]),
                 ("most", order[-1]))
        return [(f"{r.rank} ({label})", r) for label, r in picks]


def summarize(compute: np.ndarray, communication: np.ndarray, waiting: np.ndarray,
              world_size: np.ndarray | None = None) -> TimingSummary | None:
    """Totals of timing/ arrays (n, P), one row per iteration, NaN-padded: the rows of
    the last row's grid (`world_size` per row; a run resumed on another rank count holds
    rows of several), its first world_size columns. None without rows."""
    c, m, w = (np.asarray(a, dtype=np.float64) for a in (compute, communication, waiting))
    if c.ndim != 2 or c.shape[0] == 0 or not c.shape == m.shape == w.shape:
        return None
    rows = np.ones(c.shape[0], dtype=bool)
    size = c.shape[1]
    if world_size is not None and len(world_size) == c.shape[0] and world_size[-1] > 0:
        size = int(world_size[-1])
        rows = np.asarray(world_size) == size
    parts = [np.nansum(a[rows, :size], axis=0) for a in (c, m, w)]
    ranks = tuple(RankTime(k, *(float(p[k]) for p in parts)) for k in range(size))
    return TimingSummary(int(rows.sum()), ranks)


class TimingTally:
    """The running totals of the rows a writer logs (the run's end shows them)."""

    def __init__(self):
        self._sums: np.ndarray | None = None
        self._rows = 0

    def add(self, compute: Sequence[float], communication: Sequence[float],
            waiting: Sequence[float]) -> None:
        row = np.asarray([compute, communication, waiting], dtype=np.float64)
        if self._sums is None or self._sums.shape != row.shape:   # a new grid: start anew
            self._sums, self._rows = np.zeros_like(row), 0
        self._sums += np.nan_to_num(row)
        self._rows += 1

    def summary(self) -> TimingSummary | None:
        if self._sums is None:
            return None
        c, m, w = self._sums
        return TimingSummary(self._rows, tuple(RankTime(k, float(c[k]), float(m[k]),
                                                         float(w[k])) for k in range(len(c))))


class TallyingWriter:
    """A metrics writer that also keeps the totals of the timing rows it logs (`tally`);
    every other call goes to `inner`."""

    def __init__(self, inner):
        self.inner, self.tally = inner, TimingTally()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def log_timing(self, iteration: int, compute, communication, waiting) -> None:
        self.inner.log_timing(iteration, compute, communication, waiting)
        self.tally.add(compute, communication, waiting)


def text_lines(t: TimingSummary, last: int | None = None, width: int = 80) -> list[str]:
    """The summary as plain lines of at most 80 columns, e.g.

        time per rank over 130 iterations: 93.2 % computing, imbalance 1.01
        rank                  compute [s] communication [s]       waiting [s]  total [s]
        0                 26.510 ( 94.1%)    0.420 (  1.5%)    1.240 (  4.4%)     28.170

    narrower than 80 `width` columns the seconds alone (57 columns), and narrower
    than that each rank's seconds named and broken at `width` (the first line wraps
    where the terminal breaks it). A resumed run's tally is this start's: with the
    run's `last` iteration the first line names them (`over iterations 106-300`)."""
    span = counted(t.iterations, 'iteration')
    if last is not None and last > t.iterations:
        span = f"iterations {last - t.iterations + 1}-{last}"
    first = f"time per rank over {span}: {t.compute_share:.1f} % computing, " \
            f"imbalance {t.imbalance:.2f}"
    heads = ("compute", "comm.", "waiting", "total")
    if width < _NARROW_LINE:
        return [first] + [line for label, r in t.shown() for line in _named(
            f"rank {label}", zip(heads, (r.compute, r.communication, r.waiting, r.total)),
            width)]
    if width < 80:
        return [first, f"{'rank, seconds':<13s}" + "".join(f"{h:>{_NARROW}s}" for h in heads)] + [
            f"{label:<13s}" + "".join(f"{_seconds(v):>{_NARROW}s}" for v in (
                r.compute, r.communication, r.waiting, r.total)) for label, r in t.shown()]
    lines = [first,
             f"{'rank':<15s}" + "".join(f"{h:>{_CELL}s}" for h in (
                 "compute [s]", "communication [s]", "waiting [s]")) + f"{'total [s]':>11s}"]
    for label, r in t.shown():
        cells = "".join(f"{_seconds(v):>9s} ({r.share(v):5.1f}%)" for v in
                        (r.compute, r.communication, r.waiting))
        lines.append(f"{label:<13s}  {cells}{_seconds(r.total):>11s}")
    return lines


def markdown(t: TimingSummary) -> str:
    """The summary as a markdown table: every rank, seconds and shares of its total."""
    lines = [f"{t.iterations} iterations on {t.size} ranks: {t.compute_share:.1f} % of "
             f"the ranks' time computing; imbalance {t.imbalance:.2f} (the most computing "
             "rank's compute time over the mean)\n",
             "| rank | compute [s] | communication [s] | waiting [s] | total [s] |",
             "|---:|---:|---:|---:|---:|"]
    for r in t.ranks:
        cells = " | ".join(f"{_seconds(v)} ({r.share(v):.1f} %)"
                           for v in (r.compute, r.communication, r.waiting))
        lines.append(f"| {r.rank} | {cells} | {_seconds(r.total)} |")
    return "\n".join(lines) + "\n"


_CELL = 18      # a cell of text_lines: seconds in 9 columns, the share in 9; its
                # header ends where the cell does, as the numbers below it do
_NARROW = 11    # a cell of the narrow form: seconds only
_NARROW_LINE = 13 + 4 * _NARROW     # the narrow form's lines: rank label, four cells


def _named(label: str, cells, width: int) -> list[str]:
    """'rank 0  compute 0.862 s  comm. 0.165 s  waiting 0.000 s  total 1.028 s' broken
    between its parts at `width`, the lines after the first indented by two."""
    parts = [label] + [f"{h} {_seconds(v)} s" for h, v in cells]
    head = wrap_parts(parts, width)[0]
    rest = parts[head.count(SEPARATOR) + 1:]
    return [head] + [f"  {line}" for line in wrap_parts(rest, width - 2)]


def _seconds(value: float) -> str:
    """Milliseconds shown; never wider than 9 characters."""
    return f"{value:.3f}" if value < 1e5 else f"{value:.4g}"
