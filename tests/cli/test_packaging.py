"""How lptrain is started and installed: informational flags, `python -m lptrain`."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from launch import ENV, REPO, lptrain
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics

pytestmark = pytest.mark.cli

TIMEOUT = 120


@pytest.mark.parametrize("flags, expect", [
    (["--cfg", "job", "network.width=3"], "width: 3"),
    (["--info", "config"], "Config search path"),
    (["--info"], "Defaults Tree"),
])
def test_informational_flags_write_no_run_directory(flags, expect, tmp_path):
    proc = lptrain(flags, cwd=tmp_path, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert expect in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_python_dash_m_is_the_command(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "lptrain", "--help"], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert "== Config ==" in proc.stdout and "mgrit: default, " in proc.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_regular_install_runs_with_its_packaged_configs(tmp_path):
    """`pip install .` (not editable) into a folder of its own, then run from there: the
    Hydra configs must come with the package."""
    src, target = tmp_path / "src", tmp_path / "site"
    src.mkdir()
    shutil.copy(REPO / "pyproject.toml", src / "pyproject.toml")
    shutil.copytree(REPO / "lptrain", src / "lptrain",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--no-build-isolation", "--target", str(target), str(src)],
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert pip.returncode == 0, pip.stderr
    env = {**ENV, "PYTHONPATH": str(target)}
    code = "import lptrain.cli; print(lptrain.cli.__file__)"
    where = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=TIMEOUT)
    assert where.stdout.strip() == str(target / "lptrain" / "cli.py"), where.stderr
    run = subprocess.run([str(target / "bin" / "lptrain"), "hydra.run.dir=run",
                          "experiment=peaks_paper", "network.layers=2", "train.iterations=2",
                          "dataset.n_train=50", "dataset.n_val=10"],
                         cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr
    assert read_metrics(tmp_path / "run" / ms.FILE_NAME).status == ms.COMPLETED
    assert "metrics: " in (tmp_path / "run" / "lptrain.log").read_text()
