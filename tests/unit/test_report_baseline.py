"""lptrain-report's speedup baseline: which serial runs it is taken from, and that a run
without a timed iteration has no iteration time and never counts toward one."""
import math
from pathlib import Path

import pytest

from lptrain.metrics import schema as s
from lptrain.metrics.quantities import iteration_time
from lptrain.metrics.reader import read_metrics
from lptrain.metrics.writer import MetricsWriter
from lptrain.report.table import COLUMNS, NOTES, add_speedup, summarize, to_markdown

CONFIG = "mode:\n  name: {mode}\nseed: {seed}\n"


def timed_run(run_dir: Path, mode: str, step_times: list[float], seed: int = 0) -> Path:
    """A run directory whose metrics.h5 holds one train/ row per entry of `step_times`."""
    run_dir.mkdir(parents=True)
    path = run_dir / s.FILE_NAME
    w = MetricsWriter(path, {s.MODE: mode, s.WORLD_SIZE: 1, s.SEED: seed,
                             s.CONFIG: CONFIG.format(mode=mode, seed=seed)})
    for i, t in enumerate(step_times, start=1):
        w.log_train(iteration=i, objective=1.0, loss=1.0, accuracy=0.5, step_time=t,
                    wall_time=sum(step_times[:i]))
    w.close()
    return path


def _rows(*paths: Path) -> list[dict]:
    return add_speedup([summarize(p.parent.name, read_metrics(p)) for p in paths])


def test_one_iteration_has_no_iteration_time():
    """Was its first iteration's duration, one-time costs and all, where it was the only
    one (the README leaves the first out of the iteration time)."""
    assert iteration_time([4.0]) is None
    assert iteration_time([4.0, math.nan]) is None
    assert iteration_time([4.0, 1.0]) == 1.0


def test_a_one_iteration_serial_run_is_no_baseline(tmp_path):
    """A 1-iteration serial run beside a 20-iteration one made the baseline the median of
    0.4 s and its cold 0.02 s: speedups of 18.7 and 0.51 in the report."""
    rows = _rows(timed_run(tmp_path / "serial", "serial", [3.0] + [0.4] * 19),
                 timed_run(tmp_path / "one", "serial", [0.02]),
                 timed_run(tmp_path / "sim", "simultaneous", [3.0] + [2.8] * 19))
    assert [r["iteration_time"] for r in rows] == pytest.approx([0.4, None, 2.8])
    assert [r["speedup"] for r in rows] == pytest.approx([1.0, None, 0.4 / 2.8])
    table = to_markdown(rows).splitlines()
    assert table[3].split(" | ")[-6:-2] == ["-", "-", "-", "-"]    # time, fwd, adj, speedup
    assert "'-' for a run of one iteration" in NOTES


def test_the_objective_against_serials_at_the_same_iteration():
    """summary.md showed 0.5911 / 0.5911 / 0.5912 for serial, mgrit and simultaneous: a
    user could not see how closely layer-parallel training followed serial (held-out,
    stop 64)."""
    import numpy as np

    def row(mode, ranks, objectives, seed=0):
        its = np.arange(1, len(objectives) + 1)
        return {"mode": mode, "ranks": ranks, "seed": seed, "iteration_time": 1.0,
                "trajectory": (its, np.array(objectives))}
    rows = add_speedup([row("serial", 2, [4.0, 2.0, 1.0]), row("serial", 1, [4.0, 2.0]),
                        row("mgrit", 2, [4.0, 2.0 + 2e-7]), row("simultaneous", 1, [4.0, 3.0, 1.5]),
                        row("mgrit", 1, [4.0, 2.0, 1.0, 0.5]), row("serial", 1, [8.0], seed=1)])
    got = [r["vs_serial"] for r in rows]
    # on the fewest ranks the serial run of 2 iterations: the 3-iteration runs have none
    assert got[:5] == pytest.approx([None, 0.0, 1e-7, None, None])
    assert got[5] == 0.0                                 # its own seed's serial: itself
    other = add_speedup([row("serial", 1, [4.0, 2.0]), row("mgrit", 1, [3.0, 1.0], seed=1)])
    assert other[1]["vs_serial"] is None and other[1]["speedup"] == 1.0   # another start
    rows[0]["ranks"] = 1                                 # now a serial run to 3 iterations
    assert add_speedup(rows)[3]["vs_serial"] == pytest.approx(0.5)
    assert "objective vs serial" in to_markdown(rows).splitlines()[0]


def test_an_untimed_serial_run_on_fewer_ranks_takes_no_baseline_away():
    rows = [{"mode": m, "ranks": p, "iteration_time": t}
            for m, p, t in (("serial", 1, None), ("serial", 4, 1.0), ("mgrit", 4, 0.5))]
    assert [r["speedup"] for r in add_speedup(rows)] == [None, 1.0, 2.0]


def test_a_second_serial_seed_takes_no_baseline_away():
    """With serial runs of seeds 0 and 1, a run of seed 20 lost the speedup it had
    beside seed 0 alone: only serial runs of its own seed were kept, and there were none.
    Now the runs of its seed where there are any, else all of them."""
    def rows(*serial):
        return [{"mode": "serial", "ranks": 1, "seed": seed, "iteration_time": t}
                for seed, t in serial] + \
            [{"mode": "simultaneous", "ranks": 1, "seed": seed, "iteration_time": 0.5}
             for seed in (20, 1)]
    assert [r["speedup"] for r in add_speedup(rows((0, 1.0)))][-2:] == [2.0, 2.0]
    assert [r["speedup"] for r in add_speedup(rows((0, 1.0), (1, 2.0)))][-2:] == \
        [3.0, 4.0]                                    # seed 20: all (median 1.5); 1: its own
    assert "else of all seeds" in NOTES


def test_a_sweep_of_seeds_in_files_pairs_seeds_and_falls_back_to_all(tmp_path):
    paths = [timed_run(tmp_path / f"s{seed}", "serial", [9.0, t], seed=seed)
             for seed, t in ((0, 1.0), (1, 3.0))]
    paths.append(timed_run(tmp_path / "sim20", "simultaneous", [9.0, 0.5], seed=20))
    paths.append(timed_run(tmp_path / "sim1", "simultaneous", [9.0, 0.5], seed=1))
    assert [r["seed"] for r in _rows(*paths)] == [0, 1, 20, 1]
    assert [r["speedup"] for r in _rows(*paths)] == pytest.approx([1.0, 1.0, 4.0, 6.0])


def test_a_one_iteration_runs_mgrit_figures_tick_that_iteration_on_log_axes(tmp_path):
    """A 1-iteration mgrit run's MGRIT figures ticked 0.96, 0.98, 1.00, ... and drew its
    one residual per panel on a linear axis offset by 1e-11."""
    from lptrain.report.plots import figures
    path = tmp_path / "one" / s.FILE_NAME
    path.parent.mkdir()
    w = MetricsWriter(path, {s.MODE: s.MODE_MGRIT, s.WORLD_SIZE: 1, s.SEED: 0,
                             s.CONFIG: CONFIG.format(mode="mgrit", seed=0)})
    w.log_train(iteration=1, objective=1.0, loss=1.0, accuracy=0.5, step_time=0.1,
                wall_time=0.1)
    w.log_mgrit(iteration=1, fwd_history=[1.0, 1e-2, 1.09e-11], adj_history=[1.0, 2.4e-12])
    w.close()
    figs = figures([("one", read_metrics(path))])
    for name in ("mgrit_residuals", "mgrit_factors"):
        for ax in figs[name].axes:
            assert list(ax.get_xticks()) == [1.0], (name, ax.get_xticks())
    assert [ax.get_yscale() for ax in figs["mgrit_residuals"].axes] == ["log", "log"]


def _at(key: str) -> int:
    """The place of column `key` in a table line split at ' | '."""
    return list(COLUMNS).index(key)


def test_a_columns_numbers_keep_their_significant_zeros():
    """summary.md showed a final loss of 0.353 under 0.6356: '{:.4g}' drops zeros."""
    rows = [{"loss": loss, "objective": loss, "iteration_time": t}
            for loss, t in ((0.353, 0.018), (0.6356, 0.104), (12.0, 2.5))]
    cells = [line.split(" | ") for line in to_markdown(rows).splitlines()[2:]]
    assert [c[_at("loss")] for c in cells] == ["0.3530", "0.6356", "12.00"]
    assert [c[_at("iteration_time")] for c in cells] == ["0.0180", "0.104", "2.50"]


@pytest.mark.parametrize("value, objective, time", [
    (1234.0, "1234", "1.23e+03"), (123.4, "123.4", "123"), (100.0, "100.0", "100"),
    (5000.0, "5000", "5.00e+03"), (12345.0, "1.234e+04", "1.23e+04"), (10.0, "10.00", "10.0"),
    (1.0, "1.000", "1.00"), (-987.0, "-987.0", "-987")])
def test_a_whole_number_that_fills_its_digits_has_no_bare_point(value, objective, time):
    """'{:#.4g}' wrote an objective of 1234.0 as '1234.' and '{:#.3g}' an iteration time
    of 123.4 as '123.': the '#' that keeps significant zeros kept the point too."""
    cells = to_markdown([{"objective": value, "iteration_time": value}]).splitlines()[2]
    cells = cells.split(" | ")
    assert (cells[_at("objective")], cells[_at("iteration_time")]) == (objective, time)
