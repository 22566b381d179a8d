"""Whole-network gradient operations for a network with a LayerParallel body, whose
layers' gradients live on their owners: sums over data groups and over layer ranks."""
from __future__ import annotations

import math

import torch
from torch import nn


def average_gradients(module: nn.Module, data_exchange) -> None:
    """Mean of every parameter's gradient over the data groups of a layer × data grid
    (`data_exchange`: lptrain.parallel.context.grid_exchanges(...).data): the ranks
    holding the same layers on other shards of the batch."""
    size = data_exchange.size
    if size == 1:
        return
    for p in module.parameters():
        if p.grad is not None:
            p.grad.copy_(data_exchange.allreduce_tensor(p.grad) / size)


def clip_grad_norm_(parameters, max_norm: float, body, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach=None) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ for a network whose LayerParallel `body` spans
    several layer ranks: the norm (any p, or inf) is that of the whole network's
    gradient, each rank's own layers taken over the layer ranks and every other
    parameter (alike on every rank) counted once, so every rank scales by the same
    factor, as serial training would. `parameters` may be one tensor; `foreach` is
    accepted for torch's signature. A collective over `body`'s ranks; returns the
    total norm (float64)."""
    if not hasattr(body, "exchange"):
        raise TypeError(f"body={body!r}: the network's LayerParallel module (lptrain's "
                        f"clip_grad_norm_(parameters, max_norm, body, norm_type=2.0))")
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    params = [p for p in parameters if p.grad is not None]
    layers, p_norm = set(map(id, body.parameters())), float(norm_type)
    own = _powers([p for p in params if id(p) in layers], p_norm)
    rest = _powers([p for p in params if id(p) not in layers], p_norm)
    if p_norm == math.inf:
        total = max(max(body.exchange.allgather(own)), rest)
    else:
        total = (body.exchange.allreduce_sum(own) + rest) ** (1 / p_norm)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"the total norm of order {norm_type} of the gradients is "
                           f"{total}, so it cannot be clipped; error_if_nonfinite=False "
                           f"clips anyway")
    coef = max_norm / (total + 1e-6)      # torch's clip coefficient
    if coef < 1.0:
        for p in params:
            p.grad.detach().mul_(coef)
    return torch.tensor(total, dtype=torch.float64)


def _powers(params, p: float) -> float:
    """Σ|g|^p over the gradients of `params` (their largest |g| for p = inf), in float64:
    what ranks add (or take the max of) before the p-th root."""
    grads = [q.grad.detach().double() for q in params]
    if p == math.inf:
        return max((float(g.abs().max()) for g in grads if g.numel()), default=0.0)
    zero = torch.zeros((), dtype=torch.float64)
    return float(sum((g.abs().pow(p).sum() for g in grads), zero))
