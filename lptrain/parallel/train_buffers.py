"""Buffers that layers in training mode update as they compute (BatchNorm's running
statistics), under MGRIT.

A serial forward evaluates each f_n once, at its input state, and a BatchNorm in
training mode folds that batch's statistics into its running ones. MGRIT evaluates
f_n many times per solve (relaxations, coarse steps, residuals, the adjoint's
linearisations), mostly at states that are not yet the solution. So a solve computes
with copies of those buffers, the layers get their own back after it, and the forward
then evaluates each owned f_n once at its solved state, which updates them as the
serial forward would (exactly so when the solve converged).
"""
from __future__ import annotations

import torch


def lend_copies(steps, layers) -> list[tuple[dict, str, torch.Tensor]]:
    """Give each buffer of a submodule in training mode of these layers a copy to
    compute with (none for layers in eval mode or without buffers); returns what
    `take_back` restores. The graphs a solve builds keep the copies, so restoring
    writes into nothing they saved."""
    lent = []
    for n in layers:
        for m in steps.module(n).modules():
            if m.training:
                for name, buf in m._buffers.items():
                    if buf is not None:
                        lent.append((m._buffers, name, buf))
                        m._buffers[name] = buf.detach().clone()
    return lent


def take_back(lent: list[tuple[dict, str, torch.Tensor]]) -> bool:
    """The buffers as they were before `lend_copies`; whether a copy had changed."""
    changed = False
    for buffers, name, buf in lent:
        changed = changed or not torch.equal(buffers[name], buf)
        buffers[name] = buf
    return changed


def update_once(steps, layers, state) -> None:
    """f_n once at its input state(n) for each layer n (no graph): the update of its
    buffers a serial forward makes."""
    with torch.no_grad():
        for n in layers:
            steps.f(n, state(n))
