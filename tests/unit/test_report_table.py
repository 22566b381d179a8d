"""lptrain-report's summary table: the final numbers of each run, the speedup
against its serial baseline, and the markdown it is written as."""
import math

import h5py
import numpy as np
import pytest

from helpers import fake_run
from lptrain.metrics import schema as s
from lptrain.metrics.reader import read_metrics
from lptrain.report.cli import find_metrics
from lptrain.report.labels import run_labels
from lptrain.report.table import COLUMNS, add_speedup, summarize, to_markdown


def _rows(root):
    runs = [read_metrics(p) for p in find_metrics([root])]
    return add_speedup([summarize(label, run) for label, run in zip(run_labels(runs), runs)])


def test_summary_rows_hold_the_final_numbers(two_runs):
    serial, simultaneous = _rows(two_runs)
    assert serial["iterations"] == 4 and serial["ranks"] == 1
    assert serial["objective"] == 0.25 and serial["loss"] == 0.125
    assert serial["train_accuracy"] == pytest.approx(0.8)
    assert serial["val_accuracy"] == 0.8 and serial["best_val_accuracy"] == 0.9
    assert serial["wall_time"] == pytest.approx(2.1)
    assert serial["iteration_time"] == pytest.approx(0.4)
    assert serial["fwd_iterations"] is None and serial["status"] == s.COMPLETED
    assert serial["levels"] is None and simultaneous["levels"] == "16/4"
    # histories of length 2, 1, 2, 1 and 3, 3, 3, 3
    assert simultaneous["fwd_iterations"] == 1.5 and simultaneous["adj_iterations"] == 3


def test_the_table_shows_each_runs_grid(tmp_path):
    """A mode comparison on 2 ranks ran mgrit as 1 x 2 and simultaneous as 2 x 1 (auto),
    and the table said `ranks 2` for both (held-out check)."""
    fake_run(tmp_path / "0", s.MODE_SERIAL, 0.4, ranks=2)
    fake_run(tmp_path / "1", s.MODE_SIMULTANEOUS, 0.1, ranks=2)
    with h5py.File(fake_run(tmp_path / "2", s.MODE_MGRIT, 0.2), "a") as f:
        del f.attrs[s.LAYER_RANKS]         # a file written before the grid was recorded
    rows = _rows(tmp_path)
    assert [r["grid"] for r in rows] == ["1 x 2", "2 x 1", None]
    header, _, *lines = to_markdown(rows).splitlines()
    column = header.split(" | ").index("layer x data")
    assert [line.split(" | ")[column] for line in lines] == ["1 x 2", "2 x 1", "-"]


def test_a_run_resumed_on_another_grid_names_each_grid():
    """A run resumed from 1 x 1 on 2 x 1 showed `2 x 1` beside an iteration time of both
    grids' iterations (held-out check): the column names each, in order."""
    from lptrain.report.table import _grid
    attrs = {s.LAYER_RANKS: 2, s.DATA_RANKS: 1}
    timing = {s.LAYER_RANKS: np.array([1, 1, 2, 2]), s.DATA_RANKS: np.array([1, 1, 1, 1])}
    assert _grid(attrs, timing) == "1 x 1 → 2 x 1"
    there_and_back = {s.LAYER_RANKS: np.array([2, 1, 1, 2]), s.DATA_RANKS: np.array([1, 2, 2, 1])}
    assert _grid(attrs, there_and_back) == "2 x 1 → 1 x 2 → 2 x 1"
    assert _grid(attrs, {s.LAYER_RANKS: np.array([2, -1]), s.DATA_RANKS: np.array([1, -1])}) \
        == "2 x 1"          # a row without its grid (-1) names none
    assert _grid(attrs, {}) == "2 x 1" and _grid({}, timing) is None


def test_speedup_against_the_serial_run(two_runs):
    serial, simultaneous = _rows(two_runs)
    assert serial["speedup"] == pytest.approx(1.0)
    assert simultaneous["speedup"] == pytest.approx(4.0)


def test_no_speedup_without_a_serial_baseline():
    rows = [{"mode": m, "iteration_time": 0.5, "ranks": 1} for m in ("mgrit", "simultaneous")]
    assert [r["speedup"] for r in add_speedup(rows)] == [None, None]


def test_a_repeated_baseline_gives_the_median_of_its_times():
    """Was '-' in every row, the serial runs' own too: a serial baseline run twice (a
    timing repeated into the same tree) left no single baseline."""
    rows = [{"mode": m, "iteration_time": t, "ranks": 1, "seed": 0}
            for m, t in (("serial", 0.4), ("serial", 0.8), ("serial", 0.6), ("mgrit", 0.2))]
    assert [r["speedup"] for r in add_speedup(rows)] == pytest.approx([1.5, 0.75, 1.0, 3.0])


def test_speedup_of_a_scaling_study_is_against_serial_on_the_fewest_ranks():
    rows = [{"mode": m, "ranks": p, "iteration_time": t}
            for m, p, t in (("serial", 4, 0.25), ("serial", 1, 1.0), ("simultaneous", 4, 0.5),
                            ("serial", 2, 0.5))]
    assert [r["speedup"] for r in add_speedup(rows)] == [4.0, 1.0, 2.0, 2.0]


def test_speedup_is_against_the_serial_run_of_the_same_problem(tmp_path):
    """A serial run of another problem (here another learning rate; in a report of
    several experiments, another network) is no baseline; a mode × seed sweep pairs each
    run with the serial run of its seed."""
    for name, mode, t, lr in (("a", "serial", 0.4, 1.0), ("b", "mgrit", 0.1, 1.0),
                              ("c", "mgrit", 0.1, 0.5)):
        fake_run(tmp_path / name, mode, t, lr=lr)
    assert [r["speedup"] for r in _rows(tmp_path)] == [pytest.approx(1.0),
                                                      pytest.approx(4.0), None]
    rows = [{"mode": m, "ranks": 1, "seed": seed, "iteration_time": t, "problem": ()}
            for m, seed, t in (("serial", 0, 1.0), ("serial", 1, 2.0),
                               ("simultaneous", 0, 0.5), ("simultaneous", 1, 0.5),
                               ("simultaneous", 2, 0.5))]
    assert [r["speedup"] for r in add_speedup(rows)] == [1.0, 1.0, 2.0, 4.0, 3.0]


def test_markdown_table():
    row = {key: None for key in COLUMNS}
    row.update(label="a|b", mode="mgrit", levels="32/8/2", ranks=8, iterations=12,
               loss=0.0123456, val_accuracy=0.5, speedup=2.345, objective=math.nan)
    lines = to_markdown([row]).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("| run | mode | MGRIT levels | ranks | layer x data | status "
                               "| iterations |")
    assert lines[1].startswith("| :--- | :--- | :--- | ---: | :--- | :--- | ---: |")
    cells = [c.strip() for c in lines[2].strip("|").split(" | ")]
    assert len(cells) == len(COLUMNS)
    got = dict(zip(COLUMNS, cells))
    assert got["label"] == "a\\|b" and got["ranks"] == "8" and got["loss"] == "0.01235"
    assert got["levels"] == "32/8/2"
    assert got["val_accuracy"] == "0.5000" and got["speedup"] == "2.35"
    assert got["objective"] == "-" and got["wall_time"] == "-"


def test_iteration_time_is_the_median_after_the_first(tmp_path):
    path = fake_run(tmp_path / "run", s.MODE_SERIAL, 0.4)
    with h5py.File(path, "a", locking=False) as f:
        f[s.TRAIN][s.STEP_TIME][:] = [5.0, 0.3, 0.9, 0.4]   # a cold first iteration
    assert summarize("x", read_metrics(path))["iteration_time"] == pytest.approx(0.4)


def test_the_table_shows_what_a_sweep_ranks_a_mini_batch_run_by(tmp_path):
    """An Optuna sweep's closing line named job 5 at 1.01937, a number the report did not
    show (its final objective, one batch's, put job 1 first; held-out)."""
    fake_run(tmp_path / "0", s.MODE_SERIAL, 0.4)
    with h5py.File(fake_run(tmp_path / "1", s.MODE_SERIAL, 0.4), "a") as f:
        f.attrs[s.EPOCH_OBJECTIVE] = 1.0193697
    rows = _rows(tmp_path)
    assert [r["epoch_objective"] for r in rows] == [None, 1.0193697]
    header, _, *lines = to_markdown(rows).splitlines()
    column = header.split(" | ").index("last epoch objective")
    assert [line.split(" | ")[column] for line in lines] == ["-", "1.019"]
