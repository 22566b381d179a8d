"""Render predictions: a markdown strong-scaling table and a PNG plot (Agg canvas).

Speedups are over layer-serial training on one rank (serial at P = 1), the
paper's measure; the data-parallel serial column shows what the same P buys
without layer parallelism.
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

from lptrain.metrics import schema as s
from lptrain.metrics.quantities import ITERATION_TIME
from lptrain.model_perf.predict import Prediction
from lptrain.modes import LAYERED

# docs/method.md §7: the paper's strong-scaling results (dataset, cores, speedup)
PAPER_POINTS = (("MNIST", 128, 8.5), ("Peaks", 256, 6.0), ("Indian Pines", 128, 4.4))
PAPER_NAMES = {"mnist": "MNIST", "peaks": "Peaks", "indian_pines": "Indian Pines"}
_PLAIN = FuncFormatter(lambda value, _: f"{value:g}")
MODES = (s.MODE_SERIAL, s.MODE_MGRIT, s.MODE_SIMULTANEOUS)
TITLE_PT, CHAR_EM = 9, 0.6    # the title's font size, and a character's mean width in em
_STYLE = {s.MODE_SERIAL: "C0", s.MODE_MGRIT: "C1", s.MODE_SIMULTANEOUS: "C2"}
_LABEL = {s.MODE_SERIAL: "serial, data-parallel", s.MODE_MGRIT: "mgrit",
          s.MODE_SIMULTANEOUS: "simultaneous"}

Measured = dict  # (mode, P, split 'LxD') -> measured seconds per iteration of those runs


def on_line(mode: str, p: int, split: str) -> bool:
    """Whether a run's split is the one the model's line of `mode` predicts at P."""
    return split == (f"1x{p}" if mode == s.MODE_SERIAL else f"{p}x1")


def _mean(values) -> float:
    return sum(values) / len(values)


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
        seen = ", ".join(f"{mode} {split} {_t(_mean(v))}" for mode in MODES
                         for (m, q, split), v in sorted(measured.items())
                         if (m, q) == (mode, p.ranks)) or "-"
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
            note = "; ".join(filter(None, [note, "another configuration, not predicted "
                                           "(lptrain-model with the overrides that run "
                                           "had predicts it); it differs in "
                                           + ", ".join(differs)]))
        out.append(f"| {run.path} | {run.mode} | {run.ranks} | {_t(run.iteration_time)} "
                   f"| {_t(pred)} | {ratio} | {note} |")
    return "\n".join(out) + "\n"


FEW_RANKS = 12     # rank counts labelled one by one; more: the log axis's powers of 2


def plot(preds: Sequence[Prediction], baseline: float, path: Path,
         measured: Measured | None = None, paper: bool = False, title: str = "",
         dataset: str = "", auto: dict | None = None, left_out: int = 0) -> Path:
    """`figure(...)` written to `path`."""
    figure(preds, baseline, measured, paper, title, dataset, auto,
           left_out).savefig(path, dpi=120)
    return path


def _on_the_line(chosen: list, pts: list) -> bool:
    """Whether the auto split's (P, seconds) are the model line's at every P (the
    split auto takes is P x 1 there): drawn dashed, they lay hidden under the line
    while the legend named them."""
    line = dict(pts)
    return all(p in line and math.isclose(t, line[p], rel_tol=1e-9) for p, t in chosen)


def figure(preds: Sequence[Prediction], baseline: float, measured: Measured | None = None,
           paper: bool = False, title: str = "", dataset: str = "",
           auto: dict | None = None, left_out: int = 0) -> Figure:
    """Iteration time and speedup against P (log2 axes, ticks as plain numbers); the
    model's lines with a dot at each P predicted (mgrit and simultaneous on P x 1 layer
    ranks, as far as the layers allow), and dashed the split `layer_ranks=auto` takes
    (`auto`: {(P, mode): predicted seconds}); measured runs of the modelled configuration
    as filled circles on the line's split (serial 1 x P, the others P x 1), hollow on
    another split, and the count of `left_out` runs of another configuration said in
    the legend; measured speedups over the measured serial run on one rank where there
    is one (else over the model's serial time, said in the legend); the paper's
    speedups of `dataset` (all three where it has none); the title (the command)
    wrapped to the figure's width."""
    fig = Figure(figsize=(11, 5.5), layout="constrained")   # room for the legends below
    FigureCanvasAgg(fig)
    ax_t, ax_s = fig.subplots(1, 2)
    measured = measured or {}
    ranks = sorted({p.ranks for p in preds} | {p for _, p, _ in measured})
    own = measured.get((s.MODE_SERIAL, 1, "1x1"))
    base_seen = _mean(own) if own else baseline
    for mode in MODES:
        pts = [(p.ranks, getattr(p, mode)) for p in preds if getattr(p, mode) is not None]
        chosen = sorted((p, t) for (p, m), t in (auto or {}).items()
                        if m == mode and t is not None)
        hidden = bool(chosen) and _on_the_line(chosen, pts)   # a dash under the line
        if pts:
            ps, ts = zip(*pts)
            label = f"{_LABEL[mode]} (model{'; also the auto split' if hidden else ''})"
            ax_t.plot(ps, ts, ".-", color=_STYLE[mode], label=label)
            ax_s.plot(ps, [baseline / t for t in ts], ".-", color=_STYLE[mode], label=label)
        if chosen and not hidden:
            ps, ts = zip(*chosen)
            for ax, ys in ((ax_t, ts), (ax_s, [baseline / t for t in ts])):
                ax.plot(ps, ys, "--", color=_STYLE[mode], lw=1,
                        label=f"{_LABEL[mode]}, auto split (model)")
        line_split = "1 x P" if mode == s.MODE_SERIAL else "P x 1"   # the model line's
        for line, face, what in ((True, _STYLE[mode], "measured"),
                                 (False, "none", f"measured, not {line_split}")):
            seen = sorted((p, _mean(v)) for (m, p, split), v in measured.items()
                          if m == mode and on_line(m, p, split) == line)
            if seen:
                ps, ts = zip(*seen)
                ax_t.plot(ps, ts, "o", color=_STYLE[mode], markerfacecolor=face,
                          label=f"{mode} ({what})")
                over = "" if own else ", over the model's serial"   # base_seen's
                ax_s.plot(ps, [base_seen / t for t in ts], "o", color=_STYLE[mode],
                          markerfacecolor=face, label=f"{mode} ({what}{over})")
    starred = set()       # the paper's core counts: ticks of the speedup panel too
    if paper:
        points = [pt for pt in PAPER_POINTS if pt[0] == PAPER_NAMES.get(dataset)]
        for i, (name, cores, speedup) in enumerate(points or PAPER_POINTS):
            starred.add(cores)
            ax_s.plot([cores], [speedup], "*", ms=12, color=f"C{4 + i}",
                      label=f"paper: {name} {speedup}× on {cores} cores")
    if left_out:      # said where the runs are looked for, not left out unsaid
        ax_t.plot([], [], " ", label=f"{left_out} measured run{'s' if left_out > 1 else ''}"
                  f" of other settings: not drawn")
    ax_s.axhline(1.0, color="grey", lw=0.8, ls=":")
    for ax, label in ((ax_t, f"{ITERATION_TIME} [s]"),
                      (ax_s, "speedup over serial on 1 rank")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        # ticks at 1, 2, 5 × 10^k on y (a span under a decade keeps labels), powers of 2
        # on x, labelled 0.2, 5, 128 rather than 2×10⁻¹, 2⁷
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ticks = sorted(set(ranks) | (starred if ax is ax_s else set()))
        if len(ticks) <= FEW_RANKS:     # every P shown (3 had none), where they fit
            ax.xaxis.set_major_locator(FixedLocator(ticks))
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(_PLAIN)
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("ranks P")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        # below the axes: inside, "best" covered a line and a measured point
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=2,
                  frameon=False)
    width = int(fig.get_figwidth() * 72 / (TITLE_PT * CHAR_EM))
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in title.splitlines()),
                 fontsize=TITLE_PT)
    for ax in (ax_t, ax_s, ax_t):     # the second panel's ticks may move the first's
        _apart(ax)
    return fig


def _apart(ax) -> None:
    """Fixed P ticks without labels that overlap (P = 4096 beside 10000 on a log2 axis):
    each kept where its label starts right of the last kept one's."""
    if not isinstance(ax.xaxis.get_major_locator(), FixedLocator):
        return
    renderer = ax.figure.canvas.get_renderer()
    ax.figure.draw_without_rendering()          # the constrained layout: final positions
    kept, right = [], -float("inf")
    for tick in ax.xaxis.get_major_ticks():
        label = tick.label1
        if not label.get_visible() or not label.get_text():
            continue
        box = label.get_window_extent(renderer)
        if box.x0 > right + 2:
            kept.append(tick.get_loc())
            right = box.x1
    ax.xaxis.set_major_locator(FixedLocator(kept))


def grid_section(ranks, auto: dict, grids) -> str:
    """For each P and mode: the split auto takes and the one these costs favour."""
    lines = ["## Layer x data split", "",
             "`auto`: the split `parallel.layer_ranks=auto` takes (lptrain decides on the "
             "kernel costs measured on this host for this configuration, kept per host; "
             "memory permitting). `these costs`: the fastest split with the costs above, its "
             f"predicted {ITERATION_TIME} [s] in brackets.", "",
             "| P | mgrit: auto | mgrit: these costs | simultaneous: auto "
             "| simultaneous: these costs |", "|---|---|---|---|---|"]
    for p in ranks:
        cells = []
        for mode in LAYERED:
            a = auto[(p, mode)]
            g, times = grids[(p, mode)]
            t = times.get(g)
            cells += [f"{a.layer} x {a.data}",
                      f"{g.layer} x {g.data}" + (f" ({t:.3g})" if t is not None else "")]
        lines.append(f"| {p} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"
