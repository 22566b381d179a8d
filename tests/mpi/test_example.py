"""examples/fashion_resnet.py at a smoke size: on 2 ranks as in one process.

The script runs as `__main__` with its arguments in the tests' servers (tests/launch.py):
a process forked from one that has imported lptrain, and the ranks of the shared 2-rank
launch."""
from pathlib import Path

import pytest

from launch import ENV, python
from lptrain.data.mnist import FashionMnistOptions, fashion_idx

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fashion_resnet.py"
SMOKE = ["--steps", "3", "--train", "200", "--layers", "8"]
# the example reads Fashion-MNIST where the lptrain command does (.ci/run installs it)
INSTALLED = fashion_idx(FashionMnistOptions())
pytestmark = [pytest.mark.mpi, pytest.mark.slow,
              pytest.mark.skipif(not INSTALLED, reason="no Fashion-MNIST IDX files: "
                                 "apt-get install dataset-fashion-mnist")]


def run(ranks: int) -> list[str]:
    proc = python(EXAMPLE, SMOKE, ranks=ranks, timeout=200,
                  env={**ENV, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def test_the_example_trains_the_same_on_two_ranks():
    one, two = run(1), run(2)
    assert one[-1].startswith("validation accuracy") and len(one) == 3
    assert two == one       # printed to 4 digits: the same training on either
