"""Settings a run does not read: a note for each key typed on the command line that the
chosen mode, controller, batch or network leaves unused.

Such a key is accepted (a sweep may cross it with a mode that reads it), but a run it
cannot change should say so: `mode=serial mgrit.levels=2,3,4` is three identical runs.
The rules are checked against training itself in tests/unit/test_inert_settings.py: a
run with the keys changed is bitwise the run without them.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Callable, Sequence

from lptrain.modes import MGRIT, SERIAL, SIMULTANEOUS

# read by the one-shot controller and its oracle only (train/oneshot.py, control.py)
SIMULTANEOUS_ONLY = ("mgrit.fwd_iters", "mgrit.adj_iters", "mgrit.control", "mgrit.grad_tol",
                     "mgrit.control_min_iters", "mgrit.control_max_iters",
                     "mgrit.calibrate_every", "mgrit.adaptive", "mgrit.adaptive_ratio",
                     "mgrit.adaptive_max_extra")


@dataclass(frozen=True)
class Unused:
    """`keys` (a key ending in '.' stands for its whole group) are not read by a run
    where `applies(opts, images)` holds; `why` says what makes them so."""

    keys: tuple[str, ...]
    why: str
    applies: Callable[..., bool]

    def covers(self, key: str) -> bool:
        return any(key == k or (k.endswith(".") and (key + ".").startswith(k))
                   for k in self.keys)


RULES = (
    Unused(("mgrit.",), "mode=serial runs no MGRIT", lambda o, images: o.mode.name == SERIAL),
    Unused(SIMULTANEOUS_ONLY, "read by mode=simultaneous only",
           lambda o, images: o.mode.name == MGRIT),
    Unused(("mode.warm_batches",), "kept by mode=simultaneous on mini-batches only",
           lambda o, images: o.mode.name != SIMULTANEOUS or o.train.batch_size is None),
    Unused(("mgrit.grad_tol", "mgrit.control_min_iters", "mgrit.control_max_iters"),
           "mgrit.control=fixed runs fwd_iters / adj_iters",
           lambda o, images: o.mgrit.control == "fixed"),
    Unused(("mgrit.adaptive_ratio", "mgrit.adaptive_max_extra"), "mgrit.adaptive is off",
           lambda o, images: not o.mgrit.adaptive),
    Unused(("optimizer.lr_min",), "optimizer.schedule=constant",
           lambda o, images: getattr(o.optimizer, "schedule", None) == "constant"),
    Unused(("network.channels",), "the states are feature vectors: network.width",
           lambda o, images: not images),
    Unused(("network.width",), "the states are images: network.channels",
           lambda o, images: images),
    Unused(("network.bias", "network.init_hidden"), "network=custom: the step module makes its weights",
           lambda o, images: o.network.name == "custom"),
)


def typed_key(override: str) -> str:
    """The dotted key (or group) of a command-line override: `+a.b=1` -> `a.b`."""
    return override.split("=", 1)[0].lstrip("+~")


def unused(opts, overrides: Sequence[str], images: bool) -> list[tuple[list[str], str]]:
    """[(the overrides, why)] per rule that leaves typed keys unused; each override under
    the first rule that covers it and applies."""
    found: dict[int, list[str]] = {}
    for override in overrides:
        key = typed_key(override)
        for i, rule in enumerate(RULES):
            if rule.covers(key) and rule.applies(opts, images):
                found.setdefault(i, []).append(override.lstrip("+"))
                break
    return [(found[i], RULES[i].why) for i in sorted(found)]


def unused_notes(opts, overrides: Sequence[str], images: bool, width: int = 80) -> list[str]:
    """The console lines under the run's title that name the unused overrides."""
    lines = []
    for typed, why in unused(opts, overrides, images):
        text = f"not used: {' '.join(typed)} ({why})"
        lines += textwrap.wrap(text, width - 1, subsequent_indent="  ",
                               break_on_hyphens=False)
    return lines
