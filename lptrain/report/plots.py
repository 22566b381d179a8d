"""Draw the report's PNG figures: loss, accuracy and MGRIT convergence of several runs.

Uses matplotlib's object API with the Agg canvas (no pyplot, no global backend), so it
runs headless and does not disturb other matplotlib users in the same process.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lptrain.metrics import schema as s
from lptrain.metrics.reader import RunMetrics

Runs = Sequence[tuple[str, RunMetrics]]  # (label, metrics) per run
_X_LABELS = {s.ITERATION: "optimizer iteration", s.WALL_TIME: "wall time [s]"}


def write_plots(runs: Runs, out: Path) -> list[Path]:
    """Write every figure for `runs` into directory `out`; return the paths written.

    Loss and accuracy against iteration and against wall time always; MGRIT residuals
    and convergence factors only when some run has an mgrit/ group.
    """
    written = []
    for x in (s.ITERATION, s.WALL_TIME):
        written.append(_save(_loss_figure(runs, x), out / f"loss_vs_{x}.png"))
        written.append(_save(_accuracy_figure(runs, x), out / f"accuracy_vs_{x}.png"))
    if any(run.mgrit for _, run in runs):
        written.append(_save(_mgrit_figure(runs, (s.FWD_RESIDUAL, s.ADJ_RESIDUAL), True,
                                           "final residual"), out / "mgrit_residuals.png"))
        written.append(_save(_mgrit_figure(runs, (s.FWD_FACTOR, s.ADJ_FACTOR), False,
                                           "convergence factor"), out / "mgrit_factors.png"))
    return written


def _loss_figure(runs: Runs, x: str) -> Figure:
    """Training loss (solid) and validation loss (dashed) of each run."""
    fig, (ax,) = _figure(1)
    for i, (label, run) in enumerate(runs):
        ax.plot(_x(run, s.TRAIN, x), run.train.get(s.LOSS, []), f"C{i}-", label=label)
        ax.plot(_x(run, s.VALIDATION, x), run.validation.get(s.LOSS, []), f"C{i}--",
                label=f"{label} (validation)")
    _finish(ax, x, "loss (solid: training, dashed: validation)", log=True)
    return fig


def _accuracy_figure(runs: Runs, x: str) -> Figure:
    """Validation accuracy (solid) and training accuracy (dashed) of each run."""
    fig, (ax,) = _figure(1)
    for i, (label, run) in enumerate(runs):
        ax.plot(_x(run, s.VALIDATION, x), run.validation.get(s.ACCURACY, []), f"C{i}-",
                label=label)
        ax.plot(_x(run, s.TRAIN, x), run.train.get(s.ACCURACY, []), f"C{i}--",
                label=f"{label} (training)")
    _finish(ax, x, "accuracy (solid: validation, dashed: training)", log=False)
    return fig


def _mgrit_figure(runs: Runs, names: tuple[str, str], log: bool, what: str) -> Figure:
    """One panel per solve (forward, adjoint): `names` against optimizer iteration."""
    fig, axes = _figure(2)
    for ax, name, solve in zip(axes, names, ("forward", "adjoint")):
        for i, (label, run) in enumerate(runs):
            if run.mgrit:
                ax.plot(run.mgrit[s.ITERATION], run.mgrit.get(name, []), f"C{i}.-",
                        label=label)
        _finish(ax, s.ITERATION, f"{solve} MGRIT {what}", log=log)
    return fig


def _x(run: RunMetrics, group: str, x: str) -> np.ndarray:
    """Abscissa of `group`'s rows; validation rows get the wall time of their iteration."""
    data = run.group(group)
    iterations = data.get(s.ITERATION, np.empty(0))
    if x == s.ITERATION:
        return iterations
    unknown = np.full(len(iterations), np.nan)
    if group == s.TRAIN:
        return data.get(x, unknown)
    train_it, wall = run.train.get(s.ITERATION), run.train.get(s.WALL_TIME)
    if train_it is None or wall is None or len(train_it) == 0:
        return unknown
    return np.interp(iterations, train_it, wall)


def _figure(panels: int) -> tuple[Figure, list]:
    fig = Figure(figsize=(6.4 * panels, 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, panels, squeeze=False)[0]
    return fig, list(axes)


def _finish(ax, x: str, ylabel: str, log: bool) -> None:
    ax.set_xlabel(_X_LABELS[x])
    ax.set_ylabel(ylabel)
    # a log axis needs a positive value to show (NaN compares False)
    if log and any(np.any(np.asarray(line.get_ydata(), float) > 0) for line in ax.lines):
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    solid = [(h, lab) for h, lab in zip(handles, labels) if h.get_linestyle() != "--"]
    if solid:  # one legend entry per run; the dashed partner shares its colour
        ax.legend(*zip(*solid), fontsize="small")


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    return path
