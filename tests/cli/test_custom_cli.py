"""`lptrain network=custom network.step._target_=...` end to end, in subprocesses: a run,
lptrain-eval on its model, and bad steps refused in one line (exit 2). The step's
package (tests/custom_step_pkg) reaches the command through PYTHONPATH, as a user's would.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch import ENV, lptrain
from lptrain.errors import REFUSED
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics

pytestmark = pytest.mark.cli
TESTS = Path(__file__).resolve().parents[1]
PKG_ENV = {**ENV, "PYTHONPATH": os.pathsep.join(
    [str(TESTS), *filter(None, [ENV.get("PYTHONPATH")])])}
STEP = ["network=custom", "network.step._target_=custom_step_pkg.DenseStep",
        "+network.step.width=${network.width}", "+network.step.hidden=3", "network.width=4"]
TINY = ["network.layers=4", "dataset.n_train=100", "dataset.n_val=40", "train.iterations=3",
        "eval_every=3", "seed=2", "mgrit.levels=2", "mgrit.cfactor0=2"]


def test_a_custom_step_trains_and_its_model_evaluates(tmp_path):
    proc = lptrain(["hydra.run.dir=run", "mode=mgrit", *STEP, *TINY], cwd=tmp_path,
                   env=PKG_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_metrics(tmp_path / "run" / ms.FILE_NAME)
    assert m.status == ms.COMPLETED and m.n_iterations == 3
    cmd = [str(Path(sys.executable).parent / "lptrain-eval"), "run", "--which", "last"]
    ev = subprocess.run(cmd, cwd=tmp_path, env=PKG_ENV, capture_output=True, text=True,
                        timeout=120)
    assert ev.returncode == 0, ev.stderr
    assert f"loss {float(m.validation[ms.LOSS][-1]):.6g}," in ev.stdout, ev.stdout
    # resume reads the saved overrides as typed, the README's interpolation included
    # (was an OmegaConf traceback: the list resolved ${network.width} against itself)
    proc = lptrain(["resume=run", "train.iterations=5"], cwd=tmp_path, env=PKG_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_metrics(tmp_path / "run" / ms.FILE_NAME).n_iterations == 5


BAD = {   # name: (overrides, what the one line says)
    "no_target": (["network=custom"], "network.step: name your step's class, e.g."),
    "no_module": (["network=custom", "network.step._target_=nopkg_xyz.Step"],
                  "no module 'nopkg_xyz' to import"),
    "no_class": (["network=custom", "network.step._target_=custom_step_pkg.Nope"],
                 "custom_step_pkg has no attribute 'Nope'"),
    "wrong_shape": (["network=custom", "network.step._target_=custom_step_pkg.Widening",
                     "+network.step.width=8"], "a residual branch must keep the shape"),
    "bad_keyword": ([*STEP, "+network.step.depth=2"], "failed: TypeError"),
    "keyword_without_plus": ([*STEP, "network.step.depth=2"],
                             "add a keyword argument of the step with +network.step.depth="),
    "not_custom": (["+network.step.width=2"], "only network=custom takes a step"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_step_is_refused_in_one_line(case, tmp_path):
    overrides, fragment = BAD[case]
    proc = lptrain(["hydra.run.dir=run", *overrides, *TINY], cwd=tmp_path, env=PKG_ENV)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == REFUSED, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("lptrain: error: "), proc.stderr
    assert fragment in lines[0], lines[0]
    assert not (tmp_path / "run" / ms.FILE_NAME).exists()


def test_an_error_every_rank_hits_is_said_once(tmp_path):
    """An unexpected error on both ranks of a data split: each rank said its own
    'lptrain: error: rank r: ...' line before the abort."""
    step = ["network=custom", "network.step._target_=custom_step_pkg.FailsLater",
            "+network.step.width=${network.width}", "network.width=4"]
    proc = lptrain(["hydra.run.dir=run", *step, *TINY, "train.iterations=5"], cwd=tmp_path,
                   env=PKG_ENV, ranks=2, fresh=True)
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("lptrain: error:")]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert len(ours) == 1 and ours[0].startswith("lptrain: error: rank 0: RuntimeError: "
                                                 "fails at call "), proc.stderr[-3000:]
    assert (tmp_path / "run" / "error-rank0.log").is_file()


@pytest.mark.parametrize("how, name", [("exit", "SystemExit: 3"),
                                       ("interrupt", "KeyboardInterrupt")])
def test_a_step_that_exits_on_one_rank_ends_every_rank_in_one_line(how, name, tmp_path):
    """A step's sys.exit (or KeyboardInterrupt) on rank 1 of a layer split left rank 0
    waiting in its next message: the job hung, with no line (held-out)."""
    step = ["network=custom", "network.step._target_=custom_step_pkg.ExitsOnRankOne",
            "+network.step.width=${network.width}", f"+network.step.how={how}",
            "network.width=4", "mode=simultaneous", "parallel.layer_ranks=2"]
    proc = lptrain(["hydra.run.dir=run", *step, *TINY, "train.iterations=5"], cwd=tmp_path,
                   env=PKG_ENV, ranks=2, fresh=True)
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("lptrain: error:")]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert ours == [f"lptrain: error: rank 1: {name} (traceback in "
                    f"{tmp_path / 'run' / 'error-rank1.log'})"], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
