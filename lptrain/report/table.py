"""The summary table of a set of runs: one row of final numbers per run, as markdown.

Pure functions: `summarize` turns a RunMetrics into a row dict, `add_speedup` compares each
row with the serial run of its problem, `to_markdown` renders them. Nothing here reads files.
"""
from __future__ import annotations

import math
from itertools import groupby

import numpy as np
import yaml

from lptrain.metrics import schema as s
from lptrain.metrics.quantities import ITERATION_TIME, iteration_time
from lptrain.metrics.reader import RunMetrics
from lptrain.metrics.timing import TimingSummary
from lptrain.metrics.timing import summarize as summarize_timing
from lptrain.rundir import run_alive

# row key -> (column header, format of a number); significant digits keep their trailing
# zeros (#), so that a column reads alike: 0.3530 under 0.6356, not 0.353 (a whole number's
# trailing point goes: _cell)
COLUMNS = {
    "label": ("run", "{}"),
    "mode": ("mode", "{}"),
    "levels": ("MGRIT levels", "{}"),
    "ranks": ("ranks", "{}"),
    "grid": ("layer x data", "{}"),
    "status": ("status", "{}"),
    "iterations": ("iterations", "{}"),
    "objective": ("final objective", "{:#.4g}"),
    "epoch_objective": ("last epoch objective", "{:#.4g}"),
    "loss": ("final loss", "{:#.4g}"),
    "train_accuracy": ("final train acc", "{:.4f}"),
    "val_accuracy": ("final val acc", "{:.4f}"),
    "best_val_accuracy": ("best val acc", "{:.4f}"),
    "wall_time": ("wall time [s]", "{:.2f}"),
    "iteration_time": (f"{ITERATION_TIME} [s]", "{:#.3g}"),
    "fwd_iterations": ("mean MGRIT fwd it", "{:.2f}"),
    "adj_iterations": ("mean MGRIT adj it", "{:.2f}"),
    "speedup": ("speedup vs serial", "{:.2f}"),
    "vs_serial": ("objective vs serial", "{:+.1e}"),
    "computing": ("computing [%]", "{:.1f}"),
}
# left-aligned; the other columns are numbers
_TEXT = ("label", "mode", "levels", "grid", "status")
MISSING = "-"
# config nodes and keys that say what a run trains: runs that agree on them are the same
# problem, whose speedup is measured against its serial run
PROBLEM_NODES = ("dataset", "network", "optimizer")
PROBLEM_KEYS = ("dtype", "train.batch_size")
KILLED = "killed"   # the table's status of a run whose file says running, with no process
# what the table's derived columns mean, written below it in summary.md
NOTES = ("final objective, loss and train acc: the last train/ row's (with mini-batches "
         "the last batch's; with SGD and Adam at the parameters the last step started "
         "from). last epoch objective: with mini-batches, the mean objective of the last "
         "whole epoch's batches, what a sweep's closing line and its sweeper order "
         "such runs by ('-' for full-batch runs and runs shorter than an epoch). "
         f"{ITERATION_TIME}: the median duration of an optimizer iteration "
         "(train/step_time: its objective and gradient evaluations with their MGRIT solves, "
         "no validation or checkpoints), the first iteration (one-time costs) left out, so "
         "'-' for a run of one iteration, which no speedup counts. wall time: from the "
         "start of training to the last iteration, all included. speedup vs serial: the "
         f"{ITERATION_TIME} of the serial run of the same problem (dataset, network, "
         "optimizer, dtype, batch size; on the fewest ranks; of the same seed where "
         "one is, else of all seeds; the median of several) over this run's, '-' where "
         "the set has no such run with an iteration time. objective vs serial: this "
         "run's final objective less that serial run's of the same seed at the same "
         "iteration, relative to it (the serial run itself +0; mode=simultaneous: its "
         "own objective, from its inexact forward solve), '-' where no serial run of the "
         "problem and seed reached that iteration; on a long L-BFGS run a large value "
         "need not be the mode's error: round-off differences grow along the path "
         "(default network: mode=mgrit 1e-6 from serial after 50 iterations, +23 % "
         "after 300). layer x data: the grid of "
         "the ranks, ranks per layer group (MGRIT across the layers) x data groups "
         "(shards of the batch). mean MGRIT fwd / adj it: the MGRIT iterations of the "
         "accepted point's forward and adjoint solve, averaged over the iterations "
         "(mgrit/fwd_iterations, adj_iterations; line-search trials and repeated "
         "evaluations: mgrit/fwd_total). computing: the "
         "share of the ranks' time (timing/) spent computing rather than communicating or "
         "waiting, on the run's last grid (a run resumed on another: the iterations on "
         f"that one). status {KILLED}: metrics.h5 says running, but no lptrain process holds "
         "the run (a kill, or an error on another rank that ended the job first).\n")
PER_RANK_NOTE = "Each run's time per rank, where it ran on several, follows below.\n"


def shown_status(run: RunMetrics) -> str:
    """The run's status; `running` only while a process holds the run (rundir.run_alive),
    else KILLED."""
    if run.status == s.RUNNING and not run_alive(run.path.parent):
        return KILLED
    return run.status


def summarize(label: str, run: RunMetrics) -> dict:
    """The row of one run; a quantity the file does not hold is None.

    iteration_time is metrics/quantities.py's; the MGRIT means ignore iterations without
    a recorded solve.
    """
    train, val, mgrit = run.train, run.validation, run.mgrit
    n, timing = run.n_iterations, rank_times(run)
    config = flat_config(run.attrs.get(s.CONFIG, ""))
    return {
        "label": label,
        "mode": run.mode,
        "levels": run.attrs.get(s.MGRIT_LEVELS),
        "ranks": run.attrs.get(s.WORLD_SIZE),
        "grid": _grid(run.attrs, run.timing),
        "status": shown_status(run),
        "iterations": n,
        "objective": _last(train.get(s.OBJECTIVE)),
        "epoch_objective": run.attrs.get(s.EPOCH_OBJECTIVE),
        "loss": _last(train.get(s.LOSS)),
        "train_accuracy": _last(train.get(s.ACCURACY)),
        "val_accuracy": _last(val.get(s.ACCURACY)),
        "best_val_accuracy": _max(val.get(s.ACCURACY)),
        "wall_time": _last(train.get(s.WALL_TIME)),
        "iteration_time": iteration_time(train.get(s.STEP_TIME)),
        "fwd_iterations": _mean(_counts(mgrit.get(s.FWD_ITERATIONS))),
        "adj_iterations": _mean(_counts(mgrit.get(s.ADJ_ITERATIONS))),
        "speedup": None,
        "vs_serial": None,
        "trajectory": (train.get(s.ITERATION), train.get(s.OBJECTIVE)),
        "computing": None if timing is None else timing.compute_share,
        "problem": problem_of(config),
        "seed": config.get("seed"),
    }


def _grid(attrs, timing: dict) -> str | None:
    """'L x D' of a run's last grid (metrics.h5's root attributes), after the grids it
    ran on before where it was resumed on another ('1 x 1 → 2 x 1': its iteration time
    counts them all, its computing share the last); None in files written before the
    grid was recorded."""
    layer, data = attrs.get(s.LAYER_RANKS), attrs.get(s.DATA_RANKS)
    if layer is None or data is None:
        return None
    rows = zip(timing.get(s.LAYER_RANKS, ()), timing.get(s.DATA_RANKS, ()))
    grids = [f"{int(lr)} x {int(dr)}" for lr, dr in rows if lr > 0 and dr > 0]  # -1: unknown
    return " → ".join(g for g, _ in groupby([*grids, f"{int(layer)} x {int(data)}"]))


def flat_config(text: str) -> dict:
    """The YAML config as {'dotted.key': value}; unparsable text gives {}."""
    try:
        tree = yaml.safe_load(text) if text else {}
    except yaml.YAMLError:
        return {}
    flat: dict = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                flat[f"{prefix}{key}"] = value
    if isinstance(tree, dict):
        walk(tree, "")
    return flat


def problem_of(config: dict) -> tuple:
    """What the run of flat `config` trains: its dataset, network, optimizer, dtype and
    batch size, as a comparable tuple (not the mode, MGRIT, ranks, seed or length)."""
    return tuple(sorted((key, repr(value)) for key, value in config.items()
                        if key.split(".")[0] in PROBLEM_NODES or key in PROBLEM_KEYS))


def rank_times(run: RunMetrics) -> TimingSummary | None:
    """The per-rank totals of the run's timing/ rows of its last grid (metrics/timing.py)."""
    t = run.timing
    if not all(k in t for k in (s.COMPUTE, s.COMMUNICATION, s.WAITING)):
        return None
    return summarize_timing(t[s.COMPUTE], t[s.COMMUNICATION], t[s.WAITING],
                            t.get(s.WORLD_SIZE))


def add_speedup(rows: list[dict]) -> list[dict]:
    """Copies of `rows` with speedup = the baseline's iteration time / this row's.

    A row's baseline is the serial run of its problem (`problem`: the same dataset,
    network, optimizer, dtype and batch size; rows without the key share one) on the
    fewest ranks, as a scaling study compares with serial training on one rank; runs
    without an iteration time count nowhere. Of those, the ones of the row's seed where
    there are any (a sweep over modes and seeds pairs them), else all of them, so that
    more runs never take a baseline away; several (a baseline timed again) give the
    median of their iteration times. Where the set holds no timed serial run of the
    problem, the speedup stays None.
    """
    return [{**row, "speedup": _ratio(_baseline(row, rows), row),
             "vs_serial": _against_serial(row, rows)} for row in rows]


def _serial_runs(row: dict, rows: list[dict], timed_only: bool,
                 other_seeds: bool) -> list[dict]:
    """The serial runs `row` is compared with: of its problem, on the fewest ranks, of its
    seed where there are any, else (with `other_seeds`) of any seed; with `timed_only`
    only those with an iteration time."""
    serial = [r for r in rows if r["mode"] == s.MODE_SERIAL and r.get("problem") ==
              row.get("problem") and (not timed_only or r["iteration_time"] is not None)]
    fewest = min((r.get("ranks") or 1 for r in serial), default=None)
    fewer = [r for r in serial if (r.get("ranks") or 1) == fewest]
    paired = [r for r in fewer if r.get("seed") == row.get("seed")]
    return paired or (fewer if other_seeds else [])


def _baseline(row: dict, rows: list[dict]) -> float | None:
    """The baseline's iteration time for `row` (add_speedup), None where there is none."""
    # an iteration's time hardly depends on the seed: another seed's run will do
    times = [r["iteration_time"] for r in _serial_runs(row, rows, timed_only=True,
                                                        other_seeds=True)]
    return float(np.median(times)) if times else None


def _against_serial(row: dict, rows: list[dict]) -> float | None:
    """(row's last objective − serial's at that iteration) / |serial's|, of the first
    serial run (_serial_runs) that reached the iteration; None where none did."""
    its, values = row.get("trajectory") or (None, None)
    if its is None or values is None or not len(its):
        return None
    # another seed's objective is another start's: no baseline for this one
    for base in _serial_runs(row, rows, timed_only=False, other_seeds=False):
        b_its, b_values = base.get("trajectory") or (None, None)
        at = np.flatnonzero(np.asarray(b_its if b_its is not None else []) == its[-1])
        if at.size and b_values[at[0]] != 0:
            return float((values[-1] - b_values[at[0]]) / abs(b_values[at[0]]))
    return None


def _ratio(base: float | None, row: dict) -> float | None:
    t = row["iteration_time"]
    return base / t if base is not None and t is not None and t > 0 else None


def to_markdown(rows: list[dict]) -> str:
    """A markdown table with one line per row, numbers right-aligned, gaps shown as '-'."""
    headers = [header for header, _ in COLUMNS.values()]
    align = [":---" if key in _TEXT else "---:" for key in COLUMNS]
    lines = [_line(headers), _line(align)]
    for row in rows:
        lines.append(_line([_cell(row.get(key), fmt) for key, (_, fmt) in COLUMNS.items()]))
    return "\n".join(lines) + "\n"


def _line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    text = fmt.format(value)
    # '#' keeps the zeros, and also the point of a number that fills the digits with its
    # integer part (1234.0 -> '1234.', 123.4 -> '123.'): a bare point reads as a typo
    if text.endswith("."):
        text = text[:-1]
    return text.replace("|", "\\|")


def _last(a: np.ndarray | None) -> float | None:
    return float(a[-1]) if a is not None and len(a) else None


def _finite(a: np.ndarray | None) -> np.ndarray:
    if a is None:
        return np.empty(0)
    a = np.asarray(a, dtype=np.float64)
    return a[np.isfinite(a)]


def _mean(a: np.ndarray | None) -> float | None:
    a = _finite(a)
    return float(a.mean()) if a.size else None


def _max(a: np.ndarray | None) -> float | None:
    a = _finite(a)
    return float(a.max()) if a.size else None


def _counts(a: np.ndarray | None) -> np.ndarray | None:
    """Iteration counts with the fill value (-1, not recorded) removed."""
    return None if a is None else a[a >= 0]
