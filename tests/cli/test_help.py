"""`lptrain --help` is the configuration reference, and schema nodes are refused as
choices, in subprocesses: exit statuses, one line, no run directory."""
from __future__ import annotations

import os

import pytest

from launch import lptrain
from lptrain.config import yaml_choices
from lptrain.config.reference import config_groups
from lptrain.errors import REFUSED

pytestmark = pytest.mark.cli

TIMEOUT = 120


def test_help_is_the_configuration_reference(tmp_path):
    proc = lptrain(["--help"], cwd=tmp_path, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    words = {w for line in proc.stdout.splitlines() for w in line.split()[:2]}
    for group in config_groups():
        assert {group, *yaml_choices(group)} <= words, group
    assert {"train.iterations", "mgrit.grad_tol", "optimizer.momentum",
            "dataset.variant"} <= words
    assert "_schema" not in proc.stdout
    assert list(tmp_path.iterdir()) == []          # nothing written
    # through a pipe (as here, COLUMNS unset) 80 columns, as the progress lines: was 100
    if "COLUMNS" not in os.environ:
        assert max(map(len, proc.stdout.splitlines())) <= 80


@pytest.mark.parametrize("args", [["mode=mode_schema"], ["-m", "dataset=peaks,peaks_schema"]])
def test_a_schema_node_is_refused_before_any_run(tmp_path, args):
    proc = lptrain([*args, "train.iterations=1"], cwd=tmp_path, timeout=TIMEOUT)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == REFUSED, proc.stderr
    assert len(lines) == 1 and " the schema the " in lines[0], proc.stderr
    assert lines[0].startswith(f"lptrain: error: {args[-1].split('=')[0]}=")
    assert list(tmp_path.iterdir()) == []
