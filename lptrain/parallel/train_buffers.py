"""Buffers that layers in training mode update as they compute (BatchNorm's running
statistics, spectral normalisation's power-iteration vectors), under MGRIT.

A serial forward evaluates each f_n once, at its input state: a BatchNorm in training
mode folds that batch's statistics into its running ones, a spectrally normalised
weight takes one power iteration from its vectors before it is used. MGRIT evaluates
f_n many times per solve (relaxations, coarse steps, residuals, the adjoint's
linearisations), mostly at states that are not yet the solution. So during a solve
every evaluation of f_n starts from fresh copies of the buffers as they were before
it (`ModuleSteps.pinned`): each is then the serial forward's evaluation of f_n, the
same function every time. After the solve the layers get their own buffers back, and
the forward evaluates each owned f_n once at its solved state, which updates them as
the serial forward would (exactly so when the solve converged).
"""
from __future__ import annotations

import torch


def lend_copies(steps, layers,
                pins: dict | None = None) -> list[tuple[dict, str, torch.Tensor]]:
    """Pin the buffers of the submodules in training mode of these layers for a solve
    (none for layers in eval mode or without buffers): `steps.pinned` gives each
    evaluation of f_n fresh copies of their values now, or of `pins` (a forward's
    `steps.pinned`, for its backward: the f its graph would hold). Returns what
    `take_back` restores; the graphs a solve builds keep the copies, so restoring
    writes into nothing they saved."""
    lent, pinned = [], {}
    for n in layers:
        for m in steps.module(n).modules():
            if m.training:
                for name, buf in m._buffers.items():
                    if buf is not None:
                        lent.append((m._buffers, name, buf))
                        if pins is None:
                            pinned.setdefault(n, []).append((m._buffers, name,
                                                             buf.detach().clone()))
    steps.pinned = pinned if pins is None else pins
    return lent


def take_back(lent: list[tuple[dict, str, torch.Tensor]], steps) -> bool:
    """The buffers as they were before `lend_copies`, unpinned; whether f changed a copy
    (then the forward's `update_once` is due)."""
    steps.pinned = {}
    changed = False
    for buffers, name, buf in lent:
        changed = changed or not torch.equal(buffers[name], buf)
        buffers[name] = buf
    return changed


def update_once(steps, layers, state) -> None:
    """f_n once at its input state(n) for each layer n (no graph, its own buffers): the
    update of its buffers a serial forward makes."""
    with torch.no_grad():
        for n in layers:
            steps.f(n, state(n))
