"""An optimizer's state by parameter name (parallel/optimizer_state.py) on one rank: a
saved and reloaded Adam continues bitwise; mismatched networks are refused. The same on
2–4 ranks, and from 2–4 ranks into one, in tests/mpi/module_case.py (`resumed`)."""
import pytest
import torch
from torch import nn

from lptrain import LayerParallel, MGRITOptions
from lptrain.errors import ConfigError
from lptrain.parallel.optimizer_state import load_optimizer_state_dict, optimizer_state_dict


def net(seed=0):
    torch.manual_seed(seed)
    body = LayerParallel(lambda n: nn.Sequential(nn.Linear(3, 3), nn.Tanh()), T=1.0,
                         n_layers=4, mgrit=MGRITOptions(levels=2, cfactor0=2, tol=0.0,
                                                        max_iter=2, adj_max_iter=2))
    return nn.Sequential(nn.Linear(2, 3), body, nn.Linear(3, 2)).double()


def steps(m, opt, n):
    x = torch.randn(5, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for _ in range(n):
        opt.zero_grad()
        m(x).square().sum().backward()
        opt.step()
    return [p.detach().clone() for p in m.parameters()]


def test_a_reloaded_optimizer_continues_as_the_first_would():
    whole = net()
    want = steps(whole, torch.optim.Adam(whole.parameters(), lr=0.1), 4)
    first = net()
    opt = torch.optim.Adam(first.parameters(), lr=0.1)
    steps(first, opt, 2)
    saved = optimizer_state_dict(opt, first, first[1])
    assert list(saved["state"]) == [n for n, _ in first.named_parameters()]
    for _ in range(2):           # twice from one dict: loading copies its tensors
        again = net(seed=7)
        again.load_state_dict(first.state_dict())
        opt = torch.optim.Adam(again.parameters(), lr=0.5)      # the saved lr wins
        load_optimizer_state_dict(opt, again, saved)
        assert all(torch.equal(a, b) for a, b in zip(steps(again, opt, 2), want))


def test_other_networks_and_foreign_parameters_are_refused():
    first = net()
    opt = torch.optim.SGD(first.parameters(), lr=0.1, momentum=0.9)
    steps(first, opt, 1)
    saved = optimizer_state_dict(opt, first, first[1])
    two = net()
    split = torch.optim.SGD([{"params": two[0].parameters()},
                             {"params": [*two[1].parameters(), *two[2].parameters()]}],
                            lr=0.1, momentum=0.9)
    with pytest.raises(ConfigError, match="1 parameter groups saved, the optimizer has 2"):
        load_optimizer_state_dict(split, two, saved)
    saved["param_groups"][0]["params"].remove("2.bias")
    with pytest.raises(ConfigError, match="'2.bias' is not in its group"):
        load_optimizer_state_dict(torch.optim.SGD(two.parameters(), lr=0.1), two, saved)
    foreign = torch.optim.SGD([*first.parameters(), nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ConfigError, match="not in the module given"):
        optimizer_state_dict(foreign, first, first[1])
