"""examples/fashion_resnet.py at a smoke size: on 2 ranks as in one process."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fashion_resnet.py"
MPIEXEC = Path(sys.executable).parent / "mpiexec"
SMOKE = ["--steps", "3", "--train", "200", "--layers", "8"]
pytestmark = [pytest.mark.mpi, pytest.mark.slow]


def run(ranks: int) -> list[str]:
    env = dict(os.environ, MPIR_CVAR_ENABLE_HEAVY_YIELD="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(EXAMPLE), *SMOKE]
    if ranks > 1:
        cmd = [str(MPIEXEC), "-n", str(ranks), *cmd]
    proc = subprocess.run(["timeout", "200", *cmd], env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def test_the_example_trains_the_same_on_two_ranks():
    one, two = run(1), run(2)
    assert one[-1].startswith("validation accuracy") and len(one) == 3
    assert two == one       # printed to 4 digits: the same training on either
