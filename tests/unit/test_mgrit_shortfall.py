"""mode=mgrit promises exact gradients: a solve that stops at mgrit.max_iter above its
tolerance is said (once) and counted in metrics.h5, instead of a run that reports
`completed` with gradients off by 1e-3 and nothing in the run noticing."""
import logging

from helpers import composed
from lptrain import app
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics

TINY = ["mode=mgrit", "network.layers=8", "network.width=4", "dataset.n_train=100",
        "dataset.n_val=20", "mgrit.levels=2", "mgrit.cfactor0=2", "train.iterations=3"]


def _run(tmp_path, caplog, *overrides):
    with caplog.at_level(logging.INFO, logger="lptrain"):
        app.run(composed(*TINY, *overrides), None, tmp_path)
    said = [m for m in caplog.messages if "stopped at mgrit.max_iter" in m]
    return read_metrics(tmp_path / ms.FILE_NAME).mgrit["unconverged"], said


def test_solves_cut_short_are_said_once_and_counted(tmp_path, caplog):
    counts, said = _run(tmp_path, caplog, "mgrit.max_iter=1")
    assert list(counts) == [2, 2, 2]            # the forward and the adjoint of each
    assert len(said) == 1 and said[0].startswith("iteration 1: 2 MGRIT solve(s) ")


def test_converged_solves_count_none(tmp_path, caplog):
    counts, said = _run(tmp_path, caplog)
    assert list(counts) == [0, 0, 0] and said == []


def test_one_shot_solves_are_inexact_by_design(tmp_path, caplog):
    counts, said = _run(tmp_path, caplog, "mode=simultaneous")
    assert list(counts) == [0, 0, 0] and said == []


def test_solves_without_a_tolerance_are_never_short(tmp_path, caplog):
    """tol = rtol = 0 asks for exactly max_iter iterations: every solve was counted."""
    counts, said = _run(tmp_path, caplog, "mgrit.tol=0", "mgrit.rtol=0", "mgrit.max_iter=2")
    assert list(counts) == [0, 0, 0] and said == []
