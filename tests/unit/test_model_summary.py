"""What lptrain-model prints: its predictions in 80 columns (model_perf/summary.py)."""
from __future__ import annotations

from lptrain.model_perf.predict import Prediction
from lptrain.model_perf.summary import WIDTH, scaling_lines
from lptrain.modes import MGRIT, SIMULTANEOUS
from lptrain.parallel.grid import Grid


def _preds():
    return [Prediction(1, 0.3187, 3.092, 1.495, 0.34, 0.27),
            Prediction(16, 0.05965, 0.2383, 0.1113, 0.027, 0.017),
            Prediction(1024, 0.0004568)]


def _auto():
    return {(1, MGRIT): Grid(1, 1), (1, SIMULTANEOUS): Grid(1, 1),
            (16, MGRIT): Grid(4, 4), (16, SIMULTANEOUS): Grid(16, 1),
            (1024, MGRIT): Grid(256, 4), (1024, SIMULTANEOUS): Grid(128, 8)}


def test_each_row_has_every_mode_s_time_and_speedup_and_auto_s_splits():
    lines = scaling_lines(_preds(), 0.3187, 256, _auto())
    row = next(line for line in lines if line.split()[:1] == ["16"])
    assert row.split() == ["16", "0.05965", "5.34×", "0.2383", "1.34×", "0.1113", "2.86×",
                           "4x4", "/", "16x1"]
    first = next(line for line in lines if line.split()[:1] == ["1"])
    assert first.split()[1:3] == ["0.3187", "1.00×"]


def test_a_grid_beyond_the_c_intervals_shows_dashes_and_says_why():
    lines = scaling_lines(_preds(), 0.3187, 256, _auto())
    row = next(line for line in lines if line.split()[:1] == ["1024"])
    assert row.split() == ["1024", "0.0004568", "698×", "-", "-", "256x4", "/", "128x8"]
    assert any("256 C-intervals" in line for line in lines)
    assert not any("C-intervals" in line
                   for line in scaling_lines(_preds()[:2], 0.3187, 256, _auto()))


def test_the_table_fits_an_80_column_terminal():
    slow = [Prediction(p, 123.456789, 1234.5678, 0.000123456, 1.0, 1.0) for p in (1, 1024)]
    auto = {(1, MGRIT): Grid(1, 1), (1, SIMULTANEOUS): Grid(1, 1),
            (1024, MGRIT): Grid(1024, 1), (1024, SIMULTANEOUS): Grid(1, 1024)}
    for lines in (scaling_lines(_preds(), 0.3187, 256, _auto()),
                  scaling_lines(slow, 1e-6, 1024, auto)):
        assert max(len(line) for line in lines) <= WIDTH


def test_an_auto_split_that_is_not_p_by_1_gets_its_own_time():
    """peaks_deep at P = 64: the row's simultaneous 64 x 1 said 4.98x, auto took 32 x 2
    (0.0416 s, 6.3x), whose time the terminal never showed."""
    times = {(16, MGRIT): 0.2, (16, SIMULTANEOUS): 0.1113, (1024, MGRIT): 0.004,
             (1024, SIMULTANEOUS): 0.002}
    lines = scaling_lines(_preds(), 0.3187, 256, _auto(), times)
    assert "P = 16 as auto splits it: mgrit 4x4 0.2 s (1.59×)" in lines
    assert any(line.startswith("P = 1024 as auto splits it: mgrit 256x4 0.004 s (79.67×),")
               for line in lines)
    assert not any(line.startswith("P = 1 ") for line in lines)          # 1 x 1 is P x 1
    assert all(len(line) <= WIDTH for line in lines)
    assert not any("as auto splits" in line
                   for line in scaling_lines(_preds(), 0.3187, 256, _auto()))


def test_an_auto_splits_time_keeps_its_unit_and_speedup_on_its_line():
    """'simultaneous 4x4 0.01297' ended a line and '  s (1.10×)' began the next at 80
    columns (held-out check)."""
    times = {(16, MGRIT): 0.02396, (16, SIMULTANEOUS): 0.01297}
    auto = {**_auto(), (16, SIMULTANEOUS): Grid(4, 4)}
    lines = scaling_lines(_preds(), 0.01427, 256, auto, times)
    at16 = [line for line in lines if "as auto splits it" in line and "P = 16" in line]
    at16 = lines[lines.index(at16[0]):lines.index(at16[0]) + 2]
    assert at16 == ["P = 16 as auto splits it: mgrit 4x4 0.02396 s (0.60×),",
                    "  simultaneous 4x4 0.01297 s (1.10×)"]
