"""Whether every rank called a collective module with the same tensor.

LayerParallel reads u_0 on its first rank and λ_N on its last; the other ranks' are
ignored. A rank fed other data (each rank loading its own shard, as data-parallel code
does) would train on the first and last ranks' samples without a word. A fingerprint of
the tensor (sums in float64) is gathered once per kind, shape, dtype and device and
compared with tolerance: a tensor computed alike on every rank (the same opening on the
same input) may differ in its last bits across machines, other samples by far more.
"""
from __future__ import annotations

import torch

from lptrain.errors import ConfigError

RTOL = 1e-4      # of Σ|x|: rounding across machines is ~1e-7 (float32), other data ~n^−½
# x projected on a fixed normal vector repeated with each period: entries moved by a
# multiple of one period (rows of that many swapped) change the other projection
PERIODS = (1021, 1019)


def fingerprint(t: torch.Tensor) -> tuple:
    """(shape, dtype, Σ|x|, projections) in float64 sums, with memory for x's |x| and
    the short vectors only (no float64 copy of a large tensor): two samples that agree in
    all at RTOL hold the same values in the same places, up to rounding."""
    x = t.detach().reshape(-1)
    size = float(torch.sum(x.abs(), dtype=torch.float64))
    return (tuple(t.shape), str(t.dtype), size, *(_projection(x, n) for n in PERIODS))


def _projection(x: torch.Tensor, period: int) -> float:
    r = torch.randn(period, generator=torch.Generator().manual_seed(period),
                    dtype=torch.float64).to(device=x.device, dtype=x.dtype)
    whole = x.numel() // period * period
    total = torch.sum(x[:whole].view(-1, period) @ r, dtype=torch.float64) if whole else 0.0
    rest = x[whole:]
    return float(total) + float(torch.sum(rest * r[:rest.numel()], dtype=torch.float64))


def differing(prints: list) -> list[int]:
    """The ranks whose fingerprint differs from rank 0's."""
    shape, dtype, size, *proj = prints[0]
    tol = RTOL * size
    return [r for r, (s, d, a, *p) in enumerate(prints)
            if (s, d) != (shape, dtype) or abs(a - size) > tol
            or any(abs(u - v) > tol for u, v in zip(p, proj))]


def check_same(exchange, t: torch.Tensor, what: str, checked: set) -> None:
    """ConfigError on every rank if the ranks' `t` differ; once per (what, shape, dtype,
    device), remembered in `checked` (a collective call the first time)."""
    if exchange.size == 1:
        return
    key = (what, tuple(t.shape), t.dtype, t.device)
    if key in checked:
        return
    others = differing(exchange.allgather(fingerprint(t)))
    if others:
        ranks = ", ".join(map(str, others))
        raise ConfigError(
            f"LayerParallel: the {what} on rank(s) {ranks} differs from rank 0's: every "
            f"rank of comm must call it with the same batch (it reads the first rank's); "
            f"for other data per rank, split the ranks into layer and data groups "
            f"(README: Data parallelism)")
    checked.add(key)
