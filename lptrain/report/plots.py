"""Draw the report's PNG figures: loss, accuracy and MGRIT convergence of several runs.

Each figure is titled with what it shows and the runs' context (dataset, experiment,
modes). Training quantities, logged every iteration, are lines (a dash pattern per run);
validation, evaluated every few iterations, is hollow markers only (a shape per run), so
that two evaluations do not read as a measured straight line. The legend sits below the axes, covering no curve.

Uses matplotlib's object API with the Agg canvas (no pyplot, no global backend), so it
runs headless and does not disturb other matplotlib users in the same process.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from lptrain.metrics import schema as s
from lptrain.metrics.reader import RunMetrics
from lptrain.report.table import KILLED, shown_status

Runs = Sequence[tuple[str, RunMetrics]]  # (label, metrics) per run
_X_LABELS = {s.ITERATION: "optimizer iteration", s.WALL_TIME: "wall time [s]"}
TRAINING = {"marker": "None"}
ONE_POINT = {"marker": ".", "markersize": 8}   # a run of one iteration: a line shows nothing
# training lines, one dash pattern per run (on, off lengths in points; solid first) and,
# past the patterns, with longer gaps each cycle: a run that follows another exactly
# shows through the other's gaps whatever the number of runs
DASHES = (None, (4.0, 2.0), (6.0, 2.0, 1.0, 2.0), (1.0, 1.5), (8.0, 3.0))
# validation markers above every training line, on a white outline drawn below all of
# them: a noisy mini-batch line of the run's own colour hid them; hollow, so coinciding
# ones of other runs stay visible
VALIDATION = {"linestyle": "None", "markersize": 7, "markerfacecolor": "none",
              "markeredgewidth": 1.5, "zorder": 4}
OUTLINE = {**VALIDATION, "color": "white", "markeredgewidth": 4.5, "zorder": 3}
# statuses a legend names beside the run's label (a completed, stalled or stopped run
# ends where its curve does)
MARKED = (s.DIVERGED, s.FAILED, KILLED, s.RUNNING)
MARKERS = "osD^vPX"     # validation markers, one shape per run: coinciding ones stay visible
LEGEND_COLUMNS = 4
LEGEND_LINE_INCHES = 0.2
LEGEND_CHAR_PT, LEGEND_HANDLE_CHARS = 5.5, 6   # a label character's width at "small" size
                                               # and the entry's handle and gap, in characters
TITLE_CHAR_PT = 6.0     # a title character's width at "medium" size
MGRIT_MARKS = 30       # at most about this many markers on an MGRIT curve
SMALL_POWER = -2       # MGRIT panels below 10^this are written as m x 10^k, alike
LOG_SPAN = 10.0         # a log axis where the largest value is this many times the least
STYLE_KEY = "lines: training (every iteration)    hollow markers: validation"
MGRIT_FIGURES = ("mgrit_residuals", "mgrit_factors")    # only where some run has solves
SOLVES_RTOL = 1e-6      # MGRIT diagnostics this close are one line on the figure


def write_plots(runs: Runs, out: Path, context=lambda runs: "") -> list[Path]:
    """Write every figure of `figures` into directory `out`; return the paths written.
    An MGRIT figure an earlier report left there is removed where these runs have none:
    it would sit beside a summary of other runs."""
    made = figures(runs, context)
    for name in MGRIT_FIGURES:
        if name not in made:
            (out / f"{name}.png").unlink(missing_ok=True)
    return [_save(fig, out / f"{name}.png") for name, fig in made.items()]


def figures(runs: Runs, context=lambda runs: "") -> dict[str, Figure]:
    """name -> figure: loss and accuracy against iteration and against wall time always,
    MGRIT residuals and convergence factors when some run has an mgrit/ group.
    `context(metrics)` of the runs a figure shows (e.g. 'peaks, experiment=peaks_paper:
    serial, mgrit') ends its title: the MGRIT figures name only the runs with solves."""
    out, every = {}, context([run for _, run in runs])
    for x in (s.ITERATION, s.WALL_TIME):
        out[f"loss_vs_{x}"] = _curves(runs, x, s.LOSS, "loss", every, log=True)
        out[f"accuracy_vs_{x}"] = _curves(runs, x, s.ACCURACY, "accuracy", every, log=False)
    solved = [run for _, run in runs if run.mgrit]
    if solved:
        residuals, factors = MGRIT_FIGURES
        named = context(solved)
        out[residuals] = _mgrit_figure(runs, (s.FWD_RESIDUAL, s.ADJ_RESIDUAL), True,
                                       "final residual (absolute norm)", named)
        out[factors] = _mgrit_figure(runs, (s.FWD_FACTOR, s.ADJ_FACTOR), False,
                                     "convergence factor", named)
    return out


def _curves(runs: Runs, x: str, field: str, what: str, context: str, log: bool) -> Figure:
    """Training `field` (lines) and validation `field` (markers) of each run against x."""
    fig, (ax,) = _figure(1)
    handles, drawn = [], []
    for i, (label, run) in enumerate(runs):
        dash, tint = dashes(i), colour(i, len(runs))
        xs = _x(run, s.TRAIN, x)
        same = _same_curve(drawn, xs, run.train.get(field, []), label)
        ax.plot(xs, run.train.get(field, []), color=tint, linestyle=dash,
                **(TRAINING if len(xs) != 1 else ONE_POINT))
        at, values = _x(run, s.VALIDATION, x), run.validation.get(field, [])
        ax.plot(at, values, marker=_marker(i), **OUTLINE)
        ax.plot(at, values, color=tint, marker=_marker(i), **VALIDATION)
        status = shown_status(run)
        if not len(run.train.get(s.ITERATION, [])):    # stopped before its first iteration
            label += " (no iterations yet)"
        elif status in MARKED:           # its curve ends early or jumps: the table alone
            label += f" ({status})"      # had said why
        if same is not None:             # drawn over another run's: only one showed
            label += f" (= {same})"
        handles.append(Line2D([], [], color=tint, linestyle=dash, marker=_marker(i),
                              markerfacecolor="none", label=label))
    _finish(ax, x, what, log=log)
    _legend(fig, handles, STYLE_KEY)
    _title(fig, f"{what} against {_X_LABELS[x].split(' [')[0]}", context)
    return fig


def _same_curve(drawn: list, xs, ys, label: str, rtol: float = 1e-12) -> str | None:
    """The label of an earlier run whose training curve (`drawn`: (xs, ys, label) so far)
    this one equals, to `rtol` (None: none); this one's is added. Drawn over it, the
    earlier curve does not show, and the legend says where it is."""
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    same = next((name for x0, y0, name in drawn if len(xs) and x0.shape == xs.shape
                 and np.array_equal(x0, xs) and np.allclose(y0, ys, rtol=rtol, atol=0,
                                                            equal_nan=True)), None)
    drawn.append((xs, ys, label))
    return same


def _same_solves(drawn: list, mgrit: dict, names: tuple[str, str], label: str):
    """_same_curve of a run's two MGRIT panels together: the label of an earlier run
    whose `names` both equal this one's at the same iterations, or None. To SOLVES_RTOL:
    a residual is a small difference of the states, so one rounding apart in a state
    (another split's sums) moves it by 1e-10 of itself, far below what a plot shows."""
    iterations = np.asarray(mgrit[s.ITERATION], float)
    values = [np.asarray(mgrit.get(name, []), float) for name in names]
    if any(len(v) != len(iterations) for v in values):      # a field not recorded
        return None
    return _same_curve(drawn, np.concatenate([iterations] * len(names)),
                       np.concatenate(values), label, SOLVES_RTOL)


def _mgrit_figure(runs: Runs, names: tuple[str, str], log: bool, what: str,
                  context: str) -> Figure:
    """One panel per solve (forward, adjoint): `names` against optimizer iteration."""
    fig, axes = _figure(2)
    handles, lines, drawn = [], [], []
    shown = {}     # each run's legend label: '(= run)' where its lines lie under another's
    for i, (label, run) in enumerate(runs):
        if run.mgrit:
            same = _same_solves(drawn, run.mgrit, names, label)
            shown[i] = label + (f" (= {same})" if same else "")
    for ax, name, solve in zip(axes, names, ("forward", "adjoint")):
        lines.append([])
        for i, (label, run) in enumerate(runs):
            if run.mgrit:
                iterations = run.mgrit[s.ITERATION]
                # each run's colour and dash of the other figures (a run keeps its
                # look across them), so that 15 of 30 runs do not share 5 colours
                line, = ax.plot(iterations, run.mgrit.get(name, []),
                                color=colour(i, len(runs)), linestyle=dashes(i),
                                marker=_marker(i), markerfacecolor="none", markersize=5,
                                markevery=max(1, len(iterations) // MGRIT_MARKS),
                                label=shown[i])   # hollow shapes: coinciding runs show
                lines[-1].append(line)
                if solve == "forward":
                    handles.append(line)
        _finish(ax, s.ITERATION, f"{solve} MGRIT {what}", log=log)
    _one_scale(axes)
    for handle, *drawn in zip(handles, *lines):   # a run no panel shows (N = 1: exact)
        if not any(_drawable(line) for line in drawn):
            handle.set_label(f"{handle.get_label()} (none drawn: 0 or NaN)")
        elif sum(_zeros_masked(line) for line in drawn):
            n = sum(_zeros_masked(line) for line in drawn)
            handle.set_label(f"{handle.get_label()} ({n} {'value' if n == 1 else 'values'} of 0 not drawn on the log axis)")
    _legend(fig, handles)
    # an iteration's line-search trials and repeated evaluations solve too (fwd_total)
    _title(fig, f"MGRIT {what} of each iteration's accepted point", context)
    return fig


def _one_scale(axes) -> None:
    """The linear panels of one figure written alike: where their largest value is
    below 10^SMALL_POWER, each as multiples of the same power of ten (matplotlib chose
    per panel: 0.000175 beside 1.75 and 1e-5); a power of ten always as x 10^k."""
    linear = [ax for ax in axes if ax.get_yscale() == "linear"]
    for ax in linear:              # a power of ten as x 10^k, not 1e-5 (one style)
        ax.ticklabel_format(axis="y", useMathText=True)
    ys = np.concatenate([np.abs(_line_data(ax, "y")) for ax in linear] or [np.empty(0)])
    ys = ys[np.isfinite(ys) & (ys > 0)]
    if not ys.size or ys.max() >= 10.0 ** SMALL_POWER:
        return
    power = int(np.floor(np.log10(ys.max())))
    for ax in linear:
        ax.ticklabel_format(axis="y", style="sci", scilimits=(power, power),
                            useMathText=True)


def _drawable(line) -> bool:
    """Whether any point of `line` shows on its axis (a log one: only positive values)."""
    v = np.asarray(line.get_ydata(), float)
    log = line.axes.get_yscale() == "log"
    return bool(np.any(v > 0) if log else np.any(np.isfinite(v)))


def _zeros_masked(line) -> int:
    """Values of `line` a log axis leaves out (0: an exact solve's residual)."""
    if line.axes.get_yscale() != "log":
        return 0
    v = np.asarray(line.get_ydata(), float)
    return int(np.sum(np.isfinite(v) & (v <= 0)))


def _x(run: RunMetrics, group: str, x: str) -> np.ndarray:
    """Abscissa of `group`'s rows; validation rows get the wall time of their iteration
    (iteration 0, before training, at wall time 0)."""
    data = run.group(group)
    iterations = data.get(s.ITERATION, np.empty(0))
    if x == s.ITERATION:
        return iterations
    unknown = np.full(len(iterations), np.nan)
    if group == s.TRAIN:
        return data.get(x, unknown)
    train_it, wall = run.train.get(s.ITERATION), run.train.get(s.WALL_TIME)
    if train_it is None or wall is None or len(train_it) == 0:   # no iteration yet
        return np.where(iterations == 0, 0.0, unknown)
    if train_it[0] > 0:
        train_it, wall = np.r_[0, train_it], np.r_[0.0, wall]
    return np.interp(iterations, train_it, wall)


def _figure(panels: int) -> tuple[Figure, list]:
    fig = Figure(figsize=(6.4 * panels, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    return fig, list(axes)


def _finish(ax, x: str, ylabel: str, log: bool) -> None:
    """Labels and grid; with `log` a log y axis where the positive values span a decade
    or more (within one, a log axis labels two or three ticks: linear reads better) or
    are all one value (a linear axis shows only an offset, 1e-11, beside ticks around
    it), values <= 0 (an exact residual of 0) left out rather than pulling it down to
    1e-300."""
    ax.set_xlabel(_X_LABELS[x])
    ax.set_ylabel(ylabel)
    if x == s.ITERATION:
        _integer_ticks(ax)
    else:
        _one_time(ax)
    ys = _line_data(ax, "y")
    ys = ys[ys > 0]                       # NaN compares False
    if log and ys.size and (ys.max() >= LOG_SPAN * ys.min() or ys.max() == ys.min()):
        ax.set_yscale("log", nonpositive="mask")
    ax.grid(True, alpha=0.3)
    if not any(_drawable(line) for line in ax.lines):
        _nothing_drawn(ax)


def _one_time(ax) -> None:
    """A wall-time axis whose points are all at one time t (a run validated at 0 and
    stopped before its first iteration) over 0 to 2t (or 1 s), not matplotlib's
    t ± 0.04."""
    xs = _line_data(ax, "x")
    xs = xs[np.isfinite(xs)]
    if xs.size and xs.min() == xs.max():
        top = max(2.0 * float(xs[0]), 1.0)
        ax.set_xlim(-0.05 * top, top)        # a marker at 0 whole


def _integer_ticks(ax) -> None:
    """Ticks at whole iterations only: a short run's axis ticked 0.5, 1.25, ...; where
    every point is at one iteration (a run of one), a tick there alone, as the integer
    locator falls back to 0.96, 0.98, ... with fewer than two integers in view."""
    xs = _line_data(ax, "x")
    xs = xs[np.isfinite(xs)]
    if xs.size and xs.min() == xs.max():
        ax.set_xticks([xs[0]])
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def _line_data(ax, axis: str) -> np.ndarray:
    """Every point's `axis` ("x" or "y") coordinate over the lines of `ax`, as floats."""
    get = "get_xdata" if axis == "x" else "get_ydata"
    return np.concatenate([np.asarray(getattr(line, get)(), float).ravel()
                           for line in ax.lines] or [np.empty(0)])


def _nothing_drawn(ax) -> None:
    """An axis with no point to show says so, over the runs' iterations where they have
    some, instead of matplotlib's empty -0.04..0.04 square."""
    xs = _line_data(ax, "x")
    xs = xs[np.isfinite(xs)]
    if xs.size:
        lo, hi = float(xs.min()), float(xs.max())
        ax.set_xlim(lo - 0.5, hi + 0.5) if lo == hi else ax.set_xlim(lo, hi)
    else:
        ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, "nothing to draw: every value is 0 or NaN" if xs.size else
            "no iterations yet", transform=ax.transAxes, ha="center", va="center",
            color="0.35")


def colour(i: int, n: int):
    """Run i's colour of n runs: matplotlib's ten (C0-C9) up to ten, tab20's up to twenty,
    else n hues spread over a perceptual map; with C{i % 10} runs 0, 10 and 20 of a
    30-job sweep were all blue, told apart by dashes too close to see."""
    if n <= 10:
        return f"C{i}"
    if n <= 20:
        return colormaps["tab20"](i)
    return colormaps["turbo"](0.05 + 0.9 * i / (n - 1))


def dashes(i: int):
    """Run i's line style: '-' for the first, else (0, pattern) with a pattern no other
    run has (past the first cycle each gap is longer by the cycle's number)."""
    cycle, k = divmod(i, len(DASHES))
    if DASHES[k] is None:
        return "-" if cycle == 0 else (0.0, (10.0, 2.0 + cycle))
    return (0.0, tuple(x + cycle * (j % 2) for j, x in enumerate(DASHES[k])))


def _marker(i: int) -> str:
    return MARKERS[i % len(MARKERS)]


def _legend(fig: Figure, handles: list, title: str | None = None) -> None:
    """One legend for the figure, below its axes (constrained layout makes room), in as
    many columns (up to LEGEND_COLUMNS) as fit the figure's width; long labels wrap."""
    if not handles:
        return
    chars = int(fig.get_figwidth() * 72 / LEGEND_CHAR_PT) - LEGEND_HANDLE_CHARS
    labels = [textwrap.fill(h.get_label(), chars) for h in handles]
    widest = max(len(line) for label in labels for line in label.splitlines())
    ncols = max(1, min(len(handles), LEGEND_COLUMNS, chars // (widest + LEGEND_HANDLE_CHARS)))
    nrows = -(-len(labels) // ncols)      # matplotlib fills the columns first
    lines = sum(max(label.count("\n") + 1 for label in labels[r::nrows])
                for r in range(nrows))
    # room for the legend beyond one line, so that the axes keep their height
    fig.set_figheight(fig.get_figheight() + LEGEND_LINE_INCHES * (lines + bool(title) - 1))
    fig.legend(handles=handles, labels=labels, loc="outside lower center", fontsize="small",
               ncols=ncols, frameon=False, title=title, title_fontsize="small")


def _title(fig: Figure, what: str, context: str) -> None:
    """'What' above the runs' context, the context wrapped to the figure's width."""
    what = what[:1].upper() + what[1:]
    context = textwrap.fill(context, int(fig.get_figwidth() * 72 / TITLE_CHAR_PT))
    fig.suptitle(f"{what}\n{context}" if context else what, fontsize="medium")


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    return path
