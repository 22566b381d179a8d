"""Learning-rate schedules: their values, their options, and resume in the middle."""
import math

import pytest
import torch

from lptrain.config.schema import AdamOptions, SGDOptions
from lptrain.errors import ConfigError
from lptrain.train.optimizers import SGD, Adam
from lptrain.train.schedules import SCHEDULES, constant, cosine, linear


def test_schedules_start_at_lr_and_end_at_lr_min():
    for rate in (cosine, linear):
        assert rate(0.1, 0.001, 0, 50) == 0.1
        assert rate(0.1, 0.001, 50, 50) == pytest.approx(0.001, abs=1e-15)
        assert rate(0.1, 0.001, 80, 50) == pytest.approx(0.001, abs=1e-15)  # past K
    assert cosine(0.1, 0.0, 25, 50) == pytest.approx(0.05, abs=1e-15)       # half-way
    assert cosine(0.1, 0.0, 10, 40) == pytest.approx(0.05 * (1 + math.cos(math.pi / 4)))
    assert linear(0.1, 0.0, 10, 40) == pytest.approx(0.075)
    assert constant(0.1, 0.0, 37, 40) == 0.1
    assert set(SCHEDULES) == {"constant", "cosine", "linear"}


def test_sgd_steps_with_the_scheduled_rate():
    """Momentum-free SGD moves θ by exactly rate(k)·g at step k."""
    opt = SGD(SGDOptions(lr=0.2, momentum=0.0, schedule="cosine", lr_min=0.02), total=6)
    theta, g = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    for k in range(8):
        new, lr = opt.update(theta, g)
        assert lr == cosine(0.2, 0.02, k, 6)
        torch.testing.assert_close(theta - new, lr * g, rtol=1e-12, atol=0)
        theta = new


def test_a_resumed_schedule_continues_where_it_stopped():
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(5, generator=gen, dtype=torch.float64) for _ in range(10)]
    opts = AdamOptions(lr=0.05, schedule="linear", lr_min=0.005)
    straight, theta = Adam(opts, total=10), torch.zeros(5, dtype=torch.float64)
    for g in grads:
        theta, _ = straight.update(theta, g)
    first, part = Adam(opts, total=10), torch.zeros(5, dtype=torch.float64)
    for g in grads[:4]:
        part, _ = first.update(part, g)
    again = Adam(opts, total=10)
    again.load_state_dict(first.state_dict())
    rates = []
    for g in grads[4:]:
        part, lr = again.update(part, g)
        rates.append(lr)
    assert rates[0] == linear(0.05, 0.005, 4, 10)
    torch.testing.assert_close(part, theta, rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize("kwargs, key", [({"schedule": "exp"}, "optimizer.schedule"),
                                         ({"lr_min": 0.5}, "optimizer.lr_min"),
                                         ({"lr_min": -1.0}, "optimizer.lr_min")])
def test_bad_schedule_options_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        AdamOptions(lr=0.01, **kwargs)
