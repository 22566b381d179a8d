"""Layers that share parameters, found on one rank (parallel/module_faults.py)."""
import pytest
from torch import nn

from lptrain.errors import ConfigError
from lptrain.parallel.module_faults import refuse_tied


def test_layers_sharing_a_module_or_one_parameter_are_refused():
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    refuse_tied({0: a, 1: b, 2: nn.Sequential(nn.Linear(2, 2))})    # each its own
    with pytest.raises(ConfigError, match=r"layers 0 and 2 share a parameter \('weight' "
                                          r"of layer 0 is 'weight' of layer 2\)"):
        refuse_tied({0: a, 1: b, 2: a})
    c = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
    c[0].bias = b.bias                                   # one tied tensor is enough
    with pytest.raises(ConfigError, match=r"layers 1 and 3 .*'bias' of layer 1 is "
                                          r"'0.bias' of layer 3"):
        refuse_tied({1: b, 3: c})
