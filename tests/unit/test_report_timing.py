"""Time per rank (metrics/timing.py): the tally of the last grid, its 80- and
narrower-column text, and the report's section of it."""
import math
import re

import numpy as np
import pytest

from helpers import fake_run
from lptrain.metrics import schema as s
from lptrain.metrics.reader import read_metrics
from lptrain.metrics.timing import LISTED, TallyingWriter, TimingTally, text_lines
from lptrain.metrics.timing import summarize as summarize_timing
from lptrain.metrics.writer import MetricsWriter
from lptrain.report.cli import main
from lptrain.report.table import rank_times


# -- time per rank (metrics/timing.py) ---------------------------------------------------
def test_time_per_rank_sums_the_rows_of_the_last_grid():
    nan = math.nan
    # two iterations on 3 ranks, then (resumed) two on 2: the 2-rank rows count
    compute = np.array([[9.0, 9.0, 9.0], [9.0, 9.0, 9.0], [1.0, 3.0, nan], [2.0, 4.0, nan]])
    comm = np.array([[5.0] * 3, [5.0] * 3, [0.5, 0.25, nan], [0.5, 0.75, nan]])
    wait = np.array([[5.0] * 3, [5.0] * 3, [1.5, 0.0, nan], [0.5, 0.0, nan]])
    t = summarize_timing(compute, comm, wait, np.array([3, 3, 2, 2]))
    assert t.iterations == 2 and t.size == 2
    assert [(r.compute, r.communication, r.waiting) for r in t.ranks] == \
        [(3.0, 1.0, 2.0), (7.0, 1.0, 0.0)]
    assert t.ranks[0].share(t.ranks[0].waiting) == pytest.approx(100 * 2 / 6)
    assert t.compute_share == pytest.approx(100 * 10 / 14)
    assert t.imbalance == pytest.approx(7 / 5)
    assert summarize_timing(np.empty((0, 2)), np.empty((0, 2)), np.empty((0, 2))) is None


@pytest.mark.parametrize("ranks", [2, LISTED, 64])
def test_time_per_rank_fits_80_columns_and_names_the_extremes(ranks):
    tally = TimingTally()
    for i in range(3):      # rank r computes (r * 37 mod ranks) + 1 s, seconds up to 1e5
        tally.add([1e4 * ((r * 37) % ranks + 1) for r in range(ranks)], [1.5] * ranks,
                  [123.25] * ranks)
    t = tally.summary()
    lines = text_lines(t)
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert lines[0].startswith(f"time per rank over 3 iterations: {t.compute_share:.1f} %")
    # a resumed run's tally is its last start's (beside the whole run's wall time)
    assert text_lines(t, 3)[0] == lines[0]
    assert text_lines(t, 300)[0].startswith("time per rank over iterations 298-300: ")
    # each heading ends where its column's cells do (was centred: 'compute [s]' ended
    # 4 columns before its numbers' cells)
    heads = ("compute [s]", "communication [s]", "waiting [s]", "total [s]")
    assert [lines[1].index(h) + len(h) for h in heads] == \
        [m.end() for m in re.finditer(r"%\)|\S+$", lines[2])]
    rows = [line.split()[0] for line in lines[2:]]
    if ranks <= LISTED:
        assert rows == [str(r) for r in range(ranks)]
        return
    least = min(range(ranks), key=lambda r: (r * 37) % ranks)
    most = max(range(ranks), key=lambda r: (r * 37) % ranks)
    assert rows[0] == str(least) and rows[2] == str(most) and "(median)" in lines[3]


@pytest.mark.parametrize("ranks", [2, 64])
def test_time_per_rank_narrower_than_80_columns_shows_the_seconds(ranks):
    """A console of 60 columns folded each 80-column row into two (rich wraps at its
    width); narrower than 80 the table drops the shares and keeps one row per rank."""
    tally = TimingTally()
    tally.add([1e4 * (r + 1) for r in range(ranks)], [1.5] * ranks, [123.25] * ranks)
    t = tally.summary()
    wide, narrow = text_lines(t), text_lines(t, width=60)
    assert narrow[0] == wide[0] and len(narrow) == len(wide)
    assert all(len(line) <= 57 for line in narrow[1:]), max(narrow[1:], key=len)
    heads = ("compute", "comm.", "waiting", "total")
    assert narrow[1].startswith("rank, seconds ")
    for line, (label, r) in zip(narrow[2:], t.shown()):   # labels: '12 (least)'
        assert line.startswith(label)
        assert [13 + m.end() for m in re.finditer(r"\S+", line[13:])] == \
            [narrow[1].index(h) + len(h) for h in heads]
        assert [float(v) for v in line[13:].split()] == pytest.approx(
            [r.compute, r.communication, r.waiting, r.total], rel=1e-3)


def test_tallying_writer_keeps_what_the_file_holds(tmp_path):
    path = tmp_path / s.FILE_NAME
    inner = MetricsWriter(path, {s.MODE: s.MODE_MGRIT, s.WORLD_SIZE: 2, s.SEED: 0,
                                 s.CONFIG: ""})
    w = TallyingWriter(inner)
    for i in range(1, 4):
        w.log_train(iteration=i, objective=1.0)
        w.log_timing(i, [0.5 * i, 0.25], [0.125, 0.0], [0.0, 0.375 * i])
    w.close()
    assert inner._closed      # calls other than log_timing reach the writer
    kept, filed = w.tally.summary(), rank_times(read_metrics(path))
    assert kept == filed and kept.ranks[1].waiting == pytest.approx(2.25)
    assert text_lines(kept) == text_lines(filed)


def test_report_shows_time_per_rank_of_runs_on_several_ranks(tmp_path):
    fake_run(tmp_path / "runs" / "0", s.MODE_SERIAL, 0.4, timing=True)
    fake_run(tmp_path / "runs" / "1", s.MODE_MGRIT, 0.2, ranks=3, timing=True)
    out = tmp_path / "report"
    assert main([str(tmp_path / "runs"), "--out", str(out)]) == 0
    text = (out / "summary.md").read_text()
    table, _, per_rank = text.partition("## Time per rank")
    assert table.rstrip().endswith("Each run's time per rank, where it ran on several, "
                                   "follows below.")
    # 4 iterations: rank r computes 10 (r + 1) s, communicates 1 s, waits 0.8 r s
    share = 100 * 60 / (60 + 3 + 2.4)
    assert table.splitlines()[3].endswith(f"| {share:.1f} |")      # the mgrit run
    assert table.splitlines()[2].endswith(f"| {100 * 10 / 11:.1f} |")   # serial, 1 rank
    assert "### serial" not in per_rank and "### mgrit P=3" in per_rank
    assert "| 2 | 30.000 (92.0 %) | 1.000 (3.1 %) | 1.600 (4.9 %) | 32.600 |" in per_rank
    assert sum(line.startswith("|") for line in per_rank.splitlines()) == 5   # 3 ranks


@pytest.mark.parametrize("ranks", [2, 64])
@pytest.mark.parametrize("width", [20, 40, 56])
def test_time_per_rank_narrower_than_the_seconds_names_each_rank(ranks, width):
    """At 40 columns the 57-column rows broke between words under their headers; narrower
    than those rows each rank's seconds are named, broken between them at the width."""
    tally = TimingTally()
    tally.add([1e4 * (r + 1) for r in range(ranks)], [1.5] * ranks, [123.25] * ranks)
    t = tally.summary()
    lines = text_lines(t, width=width)
    assert lines[0] == text_lines(t)[0]
    # a part wider than the width has its line alone ('  compute 10000.000 s' at 20)
    assert all(len(line) <= width or "  " not in line.strip() for line in lines[1:])
    blocks = " ".join(lines[1:]).split("rank ")[1:]
    assert len(blocks) == len(t.shown())
    for block, (label, r) in zip(blocks, t.shown()):
        assert block.startswith(label + " ")
        got = dict(re.findall(r"(compute|comm\.|waiting|total) (\S+) s", block))
        assert [float(got[h]) for h in ("compute", "comm.", "waiting", "total")] == \
            pytest.approx([r.compute, r.communication, r.waiting, r.total], rel=1e-3)
