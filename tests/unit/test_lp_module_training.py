"""One-shot training with LayerParallel: warm starts reach serial quality, and the README's
example trains."""
import pytest
import torch
from torch import nn

from helpers import dense
from lptrain import LayerParallel, MGRITOptions


# -- one-shot training -------------------------------------------------------------------
class Net(nn.Module):
    """A user's network: an opening, 8 layer-parallel residual layers, a classifier."""

    def __init__(self, mgrit, warm_start):
        super().__init__()
        torch.manual_seed(0)
        self.open, self.cls = nn.Linear(2, 8).double(), nn.Linear(8, 3).double()
        self.body = LayerParallel(lambda n: dense(n, 8, 0.5), T=5.0, n_layers=8,
                                  mgrit=mgrit, warm_start=warm_start)

    def forward(self, x, serial=False):
        u = self.open(x)
        return self.cls(self.body.serial(u) if serial else self.body(u))


def train(mgrit, warm_start, serial=False, steps=100):
    """Loss of the exact (serial) network after Adam steps on a fixed batch."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(100, 2, generator=gen, dtype=torch.float64) * 4 - 2
    y = ((x[:, 0] ** 2 + torch.sin(3 * x[:, 1])) > 1).long() + (x[:, 0] > 1).long()
    net = Net(mgrit, warm_start)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x, serial), y).backward()
        opt.step()
    with torch.no_grad():
        return float(nn.functional.cross_entropy(net(x, serial=True), y))


@pytest.mark.slow
def test_one_shot_training_with_warm_starts_reaches_serial_quality():
    # two iterations per solve of a two-level MGRIT with coarse steps of 4 layers
    # (h = 0.625): from a cold start each solve is too rough to train the network
    # (a loss ~5x serial's); from the last solve's states they follow the training
    # to within ~8 % of the serial network's loss
    one_shot = dict(levels=2, cfactor0=4, tol=0.0, max_iter=2, adj_max_iter=2)
    reference = train(MGRITOptions(), False, serial=True)
    warm = train(MGRITOptions(**one_shot), True)
    cold = train(MGRITOptions(**one_shot), False)
    assert warm <= 1.15 * reference, (warm, reference)
    assert cold >= 2 * reference, (cold, reference)


@pytest.mark.slow
def test_the_readme_example_trains():
    import contextlib
    import io
    import re
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S)
                if "LayerParallel(" in b]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {})
    losses = [float(line.split()[1]) for line in out.getvalue().splitlines()]
    assert len(losses) == 5 and losses[-1] < losses[0]
