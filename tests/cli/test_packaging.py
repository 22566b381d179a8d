"""How lptrain is started and installed: informational flags, `python -m lptrain`."""
from __future__ import annotations

import subprocess
import sys

import pytest

from launch import ENV, lptrain

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
