"""Render predictions: a markdown strong-scaling table and a PNG plot (Agg canvas).

Speedups are over layer-serial training on one rank (serial at P = 1), the
paper's measure; the data-parallel serial column shows what the same P buys
without layer parallelism.
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lptrain.metrics import schema as s
from lptrain.metrics.quantities import ITERATION_TIME
from lptrain.model_perf.predict import Prediction

# docs/method.md §7: the paper's strong-scaling results (dataset, cores, speedup)
PAPER_POINTS = (("MNIST", 128, 8.5), ("Peaks", 256, 6.0), ("Indian Pines", 128, 4.4))
MODES = (s.MODE_SERIAL, s.MODE_MGRIT, s.MODE_SIMULTANEOUS)
TITLE_PT, CHAR_EM = 9, 0.6    # the title's font size, and a character's mean width in em
_STYLE = {s.MODE_SERIAL: "C0", s.MODE_MGRIT: "C1", s.MODE_SIMULTANEOUS: "C2"}
_LABEL = {s.MODE_SERIAL: "serial, data-parallel", s.MODE_MGRIT: "mgrit",
          s.MODE_SIMULTANEOUS: "simultaneous"}

Measured = dict  # (mode, P) -> list of measured seconds per iteration


def _t(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{1e3 * x:.4g}"


def _x(baseline: float, x: float | None) -> str:
    return "-" if x is None else f"{baseline / x:.2f}×"


def scaling_table(preds: Sequence[Prediction], baseline: float, max_p: int,
                  measured: Measured | None = None) -> str:
    """One row per P: predicted seconds per optimizer iteration and speedups."""
    measured = measured or {}
    head = ("| P | serial, data-parallel [s] | mgrit [s] | simultaneous [s] "
            "| speedup simultaneous | speedup mgrit | speedup data-parallel serial "
            "| fwd iteration [ms] | adj iteration [ms] | measured iteration time [s] |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
    rows = []
    for p in preds:
        seen = ", ".join(f"{mode} {_t(sum(v) / len(v))}" for mode in MODES
                         for v in [measured.get((mode, p.ranks))] if v) or "-"
        if not p.possible:
            no = f"not possible (P > {max_p} C-intervals)"
            rows.append(f"| {p.ranks} | {_t(p.serial)} | {no} | {no} | - | - "
                        f"| {_x(baseline, p.serial)} | - | - | {seen} |")
            continue
        rows.append(f"| {p.ranks} | {_t(p.serial)} | {_t(p.mgrit)} | {_t(p.simultaneous)} "
                    f"| {_x(baseline, p.simultaneous)} | {_x(baseline, p.mgrit)} "
                    f"| {_x(baseline, p.serial)} | {_ms(p.fwd_iteration)} "
                    f"| {_ms(p.adj_iteration)} | {seen} |")
    return head + "\n".join(rows) + "\n"


def comparison_table(rows: Sequence[tuple]) -> str:
    """(run, predicted seconds or None, note, mismatch list) per measured run."""
    out = ["| run | mode | P | measured iteration time [s] | predicted [s] "
           "| predicted / measured | note |",
           "|---|---|---:|---:|---:|---:|---|"]
    for run, pred, note, differs in rows:
        ratio = "-" if pred is None else f"{pred / run.iteration_time:.2f}"
        if differs:
            note = "; ".join(filter(None, [note, "costs from another config: "
                                           + ", ".join(differs)]))
        out.append(f"| {run.path} | {run.mode} | {run.ranks} | {_t(run.iteration_time)} "
                   f"| {_t(pred)} | {ratio} | {note} |")
    return "\n".join(out) + "\n"


def plot(preds: Sequence[Prediction], baseline: float, path: Path,
         measured: Measured | None = None, paper: bool = False, title: str = "") -> Path:
    """`figure(...)` written to `path`."""
    figure(preds, baseline, measured, paper, title).savefig(path, dpi=120)
    return path


def figure(preds: Sequence[Prediction], baseline: float, measured: Measured | None = None,
           paper: bool = False, title: str = "") -> Figure:
    """Iteration time and speedup against P (log2 axes); measured runs as circles; the
    title (the command) wrapped to the figure's width."""
    fig = Figure(figsize=(11, 4.5))
    FigureCanvasAgg(fig)
    ax_t, ax_s = fig.subplots(1, 2)
    for mode in MODES:
        pts = [(p.ranks, getattr(p, mode)) for p in preds if getattr(p, mode) is not None]
        if pts:
            ps, ts = zip(*pts)
            ax_t.plot(ps, ts, "-", color=_STYLE[mode], label=f"{_LABEL[mode]} (model)")
            ax_s.plot(ps, [baseline / t for t in ts], "-", color=_STYLE[mode],
                      label=f"{_LABEL[mode]} (model)")
        seen = sorted((p, sum(v) / len(v)) for (m, p), v in (measured or {}).items()
                      if m == mode)
        if seen:
            ps, ts = zip(*seen)
            ax_t.plot(ps, ts, "o", color=_STYLE[mode], label=f"{mode} (measured)")
            ax_s.plot(ps, [baseline / t for t in ts], "o", color=_STYLE[mode])
    if paper:
        for i, (name, cores, speedup) in enumerate(PAPER_POINTS):
            ax_s.plot([cores], [speedup], "*", ms=12, color=f"C{4 + i}",
                      label=f"paper: {name} {speedup}× on {cores} cores")
    ax_s.axhline(1.0, color="grey", lw=0.8, ls=":")
    for ax, label in ((ax_t, f"{ITERATION_TIME} [s]"),
                      (ax_s, "speedup over serial on 1 rank")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks P")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    width = int(fig.get_figwidth() * 72 / (TITLE_PT * CHAR_EM))
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in title.splitlines()),
                 fontsize=TITLE_PT)
    fig.tight_layout()
    return fig
