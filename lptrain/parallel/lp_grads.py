"""Whole-network gradient operations for a network with a LayerParallel body, whose
layers' gradients live on their owners: sums over data groups and over layer ranks."""
from __future__ import annotations

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


def clip_grad_norm_(parameters, max_norm: float, body) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ (2-norm) for a network whose LayerParallel `body`
    spans several layer ranks: the norm is that of the whole network's gradient, each
    rank's own layers summed over the layer ranks and every other parameter (alike on
    every rank) counted once, so every rank scales by the same factor, as serial
    training would. A collective over `body`'s ranks; returns the total norm."""
    params = [p for p in parameters if p.grad is not None]
    layers = set(map(id, body.parameters()))

    def squares(ps) -> float:
        zero = torch.zeros((), dtype=torch.float64)
        return float(sum((p.grad.detach().double().pow(2).sum() for p in ps), zero))
    own = squares(p for p in params if id(p) in layers)
    rest = squares(p for p in params if id(p) not in layers)
    total = (body.exchange.allreduce_sum(own) + rest) ** 0.5
    coef = max_norm / (total + 1e-6)      # torch's clip coefficient
    if coef < 1.0:
        for p in params:
            p.grad.detach().mul_(coef)
    return torch.tensor(total, dtype=torch.float64)
