"""The one four-rank launch the tests of this folder share (four_ranks.py).

A test file takes part by naming its case in FOUR_RANKS; the launch runs the cases of
the files collected in this session only, so that one file run alone pays for its own.
"""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import four_ranks as launcher  # noqa: E402
from launch import ENV, python  # noqa: E402
from tiers import SHARED_LAUNCH  # noqa: E402


@pytest.fixture(scope="session")
def four_ranks(request, tmp_path_factory) -> dict:
    """{case: rank 0's results} of one `mpiexec -n 4` launch of the collected cases."""
    files = {item.nodeid.split("::")[0]: getattr(getattr(item, "module", None), "FOUR_RANKS",
                                                 None) for item in request.session.items}
    names = sorted(set(files.values()) - {None})
    assert set(names) <= set(launcher.CASES), names
    # pytest-xdist keeps these files on one worker, so that the launch runs once
    assert {f for f, name in files.items() if name} <= SHARED_LAUNCH, files
    out = tmp_path_factory.mktemp("four_ranks") / "out.pt"
    # in the ranks of the tests' 4-rank launch (tests/rankserver.py), which the 4-rank
    # CLI run of tests/cli/test_cli_mgrit.py shares
    proc = python(launcher.__file__, [out, *names], ranks=launcher.RANKS, timeout=900,
                  env={**ENV, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]  # e.g. torch resizing an out=
    return torch.load(out)
