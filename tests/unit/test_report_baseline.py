"""lptrain-report's speedup baseline: which serial runs it is taken from, and that a run
without a timed iteration has no iteration time and never counts toward one."""
import math
from pathlib import Path

import pytest

from lptrain.metrics import schema as s
from lptrain.metrics.quantities import iteration_time
from lptrain.metrics.reader import read_metrics
from lptrain.metrics.writer import MetricsWriter
from lptrain.report.table import NOTES, add_speedup, summarize, to_markdown

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
    assert table[3].split(" | ")[-5:-1] == ["-", "-", "-", "-"]    # time, fwd, adj, speedup
    assert "'-' for a run of one iteration" in NOTES
