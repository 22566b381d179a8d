"""Learning-rate schedules: the rate of optimizer step k (0-based) of a run of K steps.

Each maps (lr, lr_min, k, K) to a rate; pure, so that a resumed run recomputes the
rate from its step count alone.
"""
from __future__ import annotations

import math


def constant(lr: float, lr_min: float, k: int, total: int) -> float:
    """lr at every step."""
    return lr


def cosine(lr: float, lr_min: float, k: int, total: int) -> float:
    """Half a cosine from lr at step 0 down to lr_min at step K (and after)."""
    t = min(k, total) / total
    return lr_min + (lr - lr_min) * 0.5 * (1.0 + math.cos(math.pi * t))


def linear(lr: float, lr_min: float, k: int, total: int) -> float:
    """A straight line from lr at step 0 down to lr_min at step K (and after)."""
    t = min(k, total) / total
    return lr + (lr_min - lr) * t


SCHEDULES = {"constant": constant, "cosine": cosine, "linear": linear}
