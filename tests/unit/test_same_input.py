"""Fingerprints that tell a collective module's inputs apart across ranks."""
import torch

from lptrain.parallel.same_input import differing, fingerprint


def sample(seed, shape=(100, 8, 14, 14), dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_rounding_passes_and_other_samples_do_not():
    x = sample(0)
    rounded = x * (1 + 1e-6 * torch.sign(sample(9)))       # float32 rounding, and more
    prints = [fingerprint(t) for t in (x, rounded, sample(1), x.flip(0), x.double(),
                                       x[:50], x * 1.01)]
    assert differing(prints) == [2, 3, 4, 5, 6]


def test_small_batches_and_zero_inputs():
    x = sample(0, (2, 3), torch.float64)
    y = x.clone()
    y[1, 2] += 1e-3 * x.abs().sum()          # one entry off by far more than rounding
    zeros = torch.zeros(2, 3)
    assert differing([fingerprint(t) for t in (x, x.clone(), y)]) == [2]
    assert differing([fingerprint(zeros), fingerprint(zeros.clone())]) == []


def test_rows_as_long_as_a_period_swapped_and_low_precision():
    x = sample(0, (4, 1021), torch.float64)
    swapped = x[[1, 0, 2, 3]]
    assert differing([fingerprint(x), fingerprint(swapped)]) == [1]
    h = sample(4, (6, 50)).bfloat16()
    assert differing([fingerprint(h), fingerprint(h.clone()), fingerprint(h.flip(1))]) == [2]
