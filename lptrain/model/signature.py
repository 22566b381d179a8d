"""Whether parameters saved by a run fit the network that loads them.

A model file and a checkpoint keep θ with its signature (ResNet.signature: the blocks'
names and shapes, and those of each layer of a user's step). A step class changed since
the run would read θ in another layout, silently (fewer values) or failing deep inside
torch (more): it is refused in one line instead.
"""
from __future__ import annotations

import torch

from lptrain.errors import InputFileError


def signature_difference(saved: dict | None, size: int, net) -> str | None:
    """Where a θ of `size` values saved with signature `saved` (ResNet.signature; None:
    written before one was kept, only its size is known) does not fit `net`; None where
    it does."""
    now = net.signature()
    if saved is None:
        return None if size == net.layout.size else \
            f"it holds {size} parameter values, the network built now has {net.layout.size}"
    for part, what, noun, all_ in (
            ("step", "the step's parameter", "parameter", "the step's parameters"),
            ("blocks", "block", "block", "θ's blocks")):
        before, after = dict(_pairs(saved.get(part))), dict(_pairs(now[part]))
        for name in {**before, **after}:
            if before.get(name) != after.get(name):
                return _differs(f"{what} {name!r}", noun, before.get(name), after.get(name))
        if list(before) != list(after):
            return f"{all_} come in another order ({', '.join(after)} now)"
    return None


def check_fits(net, signature: dict | None, theta: torch.Tensor, source: str) -> None:
    """InputFileError unless the parameters saved in `source` with `signature` fit `net`
    as built now (a user's step class changed since: its layers would read the wrong
    values, or fail)."""
    problem = signature_difference(signature, theta.numel(), net)
    if problem is None:
        return
    step = net.opts.step.get("_target_") if net.opts.step else None
    where = (f"; use it where the step class it was trained with ({step}) is importable"
             if step else "")
    raise InputFileError(f"{source}: its parameters do not fit the network: {problem}"
                         f"{where}")


def _pairs(items) -> list[tuple[str, tuple]]:
    return [(str(name), tuple(shape)) for name, shape in items or []]


def _differs(what: str, noun: str, before: tuple | None, after: tuple | None) -> str:
    """How one parameter or block (`noun`) differs: its shapes, or which side lacks it."""
    if after is None:
        return f"{what} was {before}, the network built now has no such {noun}"
    if before is None:
        return f"{what} of the network built now, {after}, was not saved"
    return f"{what} was {before}, the network built now has {after}"
