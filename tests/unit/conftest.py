"""Fixtures of several tests/unit files."""
import pytest

from helpers import TTY_VARS, fake_run
from lptrain.metrics import schema as s


@pytest.fixture
def two_runs(tmp_path):
    """A multirun directory: serial at 0.4 s/iteration, simultaneous at 0.1 s/iteration
    (lptrain-report's tests)."""
    root = tmp_path / "multirun"
    fake_run(root / "0", s.MODE_SERIAL, 0.4)
    fake_run(root / "1", s.MODE_SIMULTANEOUS, 0.1, ranks=4)
    return root


@pytest.fixture
def plain_env(monkeypatch):
    """No variable that makes rich take a stream for a terminal (the console's tests)."""
    for name in TTY_VARS:
        monkeypatch.delenv(name, raising=False)
