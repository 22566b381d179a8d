"""What `lptrain-model` prints: the predictions in lines that fit an 80-column terminal.

The full report (inputs, every kernel's cost, per-cycle times, the layer × data splits,
measured runs) is the markdown file beside the plot; the terminal gets the numbers a
reader compares first: seconds per iteration and speedup of each mode for each P, the
split `parallel.layer_ranks=auto` takes, and predicted / measured for measured runs.
"""
from __future__ import annotations

import textwrap
from typing import Sequence

from lptrain.metrics.quantities import ITERATION_TIME
from lptrain.model_perf.predict import Prediction
from lptrain.modes import MGRIT, SERIAL, SIMULTANEOUS

WIDTH = 80         # the table's lines fit it; a long title or path may not
CELL = 19
_MODES = (SERIAL, MGRIT, SIMULTANEOUS)
_HEAD = ("serial 1 x P", "mgrit P x 1", "simultaneous P x 1")


def _cell(t: float | None, baseline: float) -> str:
    """Seconds and speedup over serial on one rank, CELL characters."""
    if t is None:
        return f"{'-':<{CELL}}"
    x = baseline / t
    return f"{t:<9.4g} {x:>6.2f}×  " if x < 100 else f"{t:<9.4g} {x:>6.0f}×  "


def scaling_lines(preds: Sequence[Prediction], baseline: float, max_p: int,
                  auto: dict, auto_times: dict | None = None) -> list[str]:
    """One line per P: each mode's seconds and speedup, then auto's split for mgrit and
    simultaneous (auto[(P, mode)]: a Grid); below, the predicted seconds of an auto
    split that is not P x 1 (auto_times[(P, mode)]), which the P x 1 columns are not."""
    lines = [f"{ITERATION_TIME} [s], speedup over serial on 1 rank ({baseline:.4g} s)",
             f"{'P':>5}  " + "".join(f"{h:<{CELL}}" for h in _HEAD) + "auto split"]
    for p in preds:
        cells = "".join(_cell(getattr(p, mode), baseline) for mode in _MODES)
        split = " / ".join(f"{g.layer}x{g.data}" for g in
                           (auto.get((p.ranks, MGRIT)), auto.get((p.ranks, SIMULTANEOUS)))
                           if g is not None)
        lines.append(f"{p.ranks:>5}  {cells}{split}".rstrip())
    lines.append("L x D: L layer ranks, D data ranks; auto split: mgrit / simultaneous")
    for p in preds:
        other = [(mode, auto[(p.ranks, mode)], (auto_times or {}).get((p.ranks, mode)))
                 for mode in (MGRIT, SIMULTANEOUS) if (p.ranks, mode) in auto]
        # each mode's split, time and speedup on one line (\0: a space not to break at)
        shown = [f"{mode}\0{g.layer}x{g.data}\0{t:.4g}\0s\0({baseline / t:.2f}×)"
                 for mode, g, t in other if g.data > 1 and t]
        if shown:
            lines += [part.replace("\0", " ") for part in textwrap.wrap(
                f"P = {p.ranks} as auto splits it: " + ", ".join(shown), WIDTH,
                subsequent_indent="  ")]
    if any(not p.possible for p in preds):
        lines.append(f"-: more layer ranks than the {max_p} C-intervals of the finest level")
    return lines



def measured_lines(rows: Sequence[tuple]) -> list[str]:
    """Predicted against measured for each measured run ((run, predicted, note, differs)),
    each named by its directory (below the runs' common one); where name and figures
    pass WIDTH, the figures on a line of their own."""
    out = []
    for (run, pred, _, differs), name in zip(rows, run_names([r[0].path for r in rows])):
        ratio = "-" if pred is None else f"{pred / run.iteration_time:.2f}"
        shown = "-" if pred is None else f"{pred:.4g} s"
        line = (f"{run.mode} {split_of(run)}: {run.iteration_time:.4g} s measured, {shown} "
                f"predicted ({ratio})" + (", other\0config" if differs else ""))
        joined = f"{name}  {line}"
        lines = [joined] if len(joined) <= WIDTH else [name, *textwrap.wrap(
            line, WIDTH, initial_indent="    ", subsequent_indent="      ")]
        out += [part.replace("\0", " ") for part in lines]
    if out:
        out.append("(L x D: the run's split; predicted / measured in brackets)")
    return out


def run_names(paths: Sequence) -> list[str]:
    """Each metrics file's directory below the directories' common one (its own name
    where there is one run, or the common one is itself)."""
    import os
    dirs = [os.path.dirname(os.path.abspath(p)) for p in paths]
    if not dirs:
        return []
    common = os.path.commonpath(dirs)
    return [os.path.relpath(d, common) if d != common else os.path.basename(d) or d
            for d in dirs]


def split_of(run) -> str:
    """'LxD' of a measured run (serial: 1 x P; '?xP' where its file does not say)."""
    layer = 1 if run.mode == SERIAL else run.layer
    return f"{layer}x{run.ranks // layer}" if layer else f"?x{run.ranks}"


def summary(title: str, setup: Sequence[str], preds: Sequence[Prediction], baseline: float,
            max_p: int, auto: dict, compared: Sequence[tuple], files: Sequence,
            auto_times: dict | None = None) -> str:
    """The terminal text: title, a few setup lines, the table, measured runs, the files."""
    lines = [title, *setup, "", *scaling_lines(preds, baseline, max_p, auto, auto_times)]
    if compared:
        lines += ["", "measured runs:", *measured_lines(compared)]
    lines += ["", f"full report: {files[0]}", f"plot: {files[1]}"]
    return "\n".join(lines) + "\n"
