"""Settings a run does not read: a note for each key typed on the command line that the
chosen mode, controller, batch, MGRIT hierarchy or network leaves unused.

Such a key is accepted (a sweep may cross it with a mode that reads it), but a run it
cannot change should say so: `mode=serial mgrit.levels=2,3,4` is three identical runs.
The rules are checked against training itself in tests/unit/test_inert_settings.py: a
run with the keys changed is bitwise the run without them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from lptrain.config import override_key
from lptrain.modes import MGRIT, SERIAL, SIMULTANEOUS

# read by the one-shot controller and its oracle only (train/oneshot.py, control.py)
SIMULTANEOUS_ONLY = ("mgrit.fwd_iters", "mgrit.adj_iters", "mgrit.control", "mgrit.grad_tol",
                     "mgrit.control_min_iters", "mgrit.control_max_iters",
                     "mgrit.calibrate_every", "mgrit.adaptive", "mgrit.adaptive_ratio",
                     "mgrit.adaptive_max_extra")


@dataclass(frozen=True)
class Built:
    """What the run built that decides what it reads: whether its states are images
    (None: not known), and the levels of its MGRIT hierarchy (None: no MGRIT, or not
    known)."""

    images: bool | None = False
    levels: int | None = None


# the hierarchy's settings below the finest level, and those of any MGRIT iteration
COARSER = ("mgrit.cfactor", "mgrit.nrelax", "mgrit.cycle")
ITERATING = COARSER + ("mgrit.nrelax0", "mgrit.coarse_weights", "mgrit.warm_down",
                       "mgrit.skip_first_down", "mgrit.level_ops")
# ... and how many iterations a solve takes: one level solves in one serial sweep
ONE_SWEEP = ITERATING + ("mgrit.tol", "mgrit.rtol", "mgrit.max_iter", "mgrit.adj_tol",
                         "mgrit.adj_max_iter") + SIMULTANEOUS_ONLY


@dataclass(frozen=True)
class Unused:
    """`keys` (a key ending in '.' stands for its whole group) are not read by a run
    where `applies(opts, built)` holds; `why` says what makes them so."""

    keys: tuple[str, ...]
    why: str
    applies: Callable[..., bool]

    def covers(self, key: str) -> bool:
        return any(key == k or (k.endswith(".") and (key + ".").startswith(k))
                   for k in self.keys)


RULES = (
    Unused(("mgrit.",), "mode=serial runs no MGRIT", lambda o, b: o.mode.name == SERIAL),
    Unused(SIMULTANEOUS_ONLY, "read by mode=simultaneous only",
           lambda o, b: o.mode.name == MGRIT),
    Unused(ONE_SWEEP, "one MGRIT level: the layers are stepped serially",
           lambda o, b: b.levels == 1),
    Unused(COARSER, "two MGRIT levels: the coarse one is stepped serially",
           lambda o, b: b.levels == 2),
    Unused(("mode.warm_batches",), "kept by mode=simultaneous on mini-batches only",
           lambda o, b: o.mode.name != SIMULTANEOUS or o.train.batch_size is None),
    Unused(("mgrit.grad_tol", "mgrit.control_min_iters", "mgrit.control_max_iters"),
           "mgrit.control=fixed runs fwd_iters / adj_iters",
           lambda o, b: o.mgrit.control == "fixed"),
    Unused(("mgrit.adaptive_ratio", "mgrit.adaptive_max_extra"), "mgrit.adaptive is off",
           lambda o, b: not o.mgrit.adaptive),
    Unused(("optimizer.lr_min",), "optimizer.schedule=constant",
           lambda o, b: getattr(o.optimizer, "schedule", None) == "constant"),
    Unused(("network.channels",), "the states are feature vectors: network.width",
           lambda o, b: b.images is False),
    Unused(("network.width",), "the states are images: network.channels",
           lambda o, b: b.images is True),
    Unused(("network.bias", "network.init_hidden"),
           "network=custom: the step module makes its weights",
           lambda o, b: o.network.name == "custom"),
)


def _rule(opts, built: Built, key: str) -> int | None:
    """The index of the first rule that leaves `key` unused in this run, else None."""
    return next((i for i, rule in enumerate(RULES)
                 if rule.covers(key) and rule.applies(opts, built)), None)


def reads(opts, built: Built, key: str) -> bool:
    """Whether a run of `opts` that built `built` reads `key` (no rule leaves it unused)."""
    return _rule(opts, built, key) is None


def unused(opts, overrides: Sequence[str], built: Built) -> list[tuple[list[str], str]]:
    """[(the overrides, why)] per rule that leaves typed keys unused; each override under
    the first rule that covers it and applies."""
    found: dict[int, list[str]] = {}
    for override in overrides:
        i = _rule(opts, built, override_key(override))
        if i is not None:
            found.setdefault(i, []).append(override.lstrip("+"))
    return [(found[i], RULES[i].why) for i in sorted(found)]


def unused_notes(opts, overrides: Sequence[str], built: Built) -> list[str]:
    """The notes under the run's title that name the unused overrides, one per rule (the
    console breaks them at its width)."""
    return [f"not used: {' '.join(typed)} ({why})"
            for typed, why in unused(opts, overrides, built)]
