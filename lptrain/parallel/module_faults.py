"""LayerParallel when its work fails on some of its ranks only.

Each rank builds and runs its own layers, so a user's layer can fail on one rank alone
(a factory that breaks for layer 12, an f that raises on some states). The other ranks
would then wait for that rank's messages forever. Building ends with an agreement: every
rank raises the same ConfigError, which the caller may catch. A failure inside a solve
cannot be agreed on, the others being inside the solve already: the failing rank
reports it and ends every rank (MPI_Abort), as `python -m mpi4py` does for any uncaught
exception.
"""
from __future__ import annotations

import os
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

import torch

from lptrain.errors import ConfigError


def refuse_tied(layers: dict) -> None:
    """ConfigError if two of `layers` ({n: module}, a rank's own) share a parameter (one
    module for several layers, a time-invariant f): on several ranks each would hold a
    part of its gradient and step its own copy of it."""
    first: dict[int, tuple[int, str]] = {}
    for n, module in sorted(layers.items()):
        for name, p in module.named_parameters():
            if id(p) in first and first[id(p)][0] != n:
                m, other = first[id(p)]
                raise ConfigError(
                    f"layers {m} and {n} share a parameter ({other!r} of layer {m} is "
                    f"{name!r} of layer {n}): on several ranks each would hold only part "
                    f"of its gradient; give every layer a module of its own, or run on "
                    f"one rank (comm=None)")
            first.setdefault(id(p), (n, name))


def agreed(exchange, build, what: str):
    """build() on every rank, or a ConfigError on every rank where it raised on any
    (naming the first such rank and its error); a collective call on several ranks."""
    error, result = None, None
    try:
        result = build()
    except Exception as exc:         # reported to every rank below
        if exchange.size == 1:
            raise
        error = exc
    if exchange.size > 1:
        said = None if error is None else str(error) if isinstance(error, ConfigError) \
            else f"{type(error).__name__}: {error}"
        failed = [(r, e) for r, e in enumerate(exchange.allgather(said)) if e]
        if failed:
            rank, message = failed[0]
            raise ConfigError(f"LayerParallel: {what} failed on rank {rank}: "
                              f"{message}") from error
    return result


@contextmanager
def ends_every_rank(exchange, what: str):
    """A part of a collective solve: where it raises on a rank of several, that rank prints
    the traceback and a last line naming it, then ends every rank (the others wait for
    its messages); on one rank the exception goes to the caller."""
    try:
        yield
    except Exception as exc:
        if exchange.size == 1:
            raise
        frames = users_frames(exc.__traceback__)
        if frames:
            print("Traceback (the frames outside lptrain and torch):\n"
                  + "".join(traceback.format_list(frames)), end="", file=sys.stderr)
        print(f"LayerParallel: rank {exchange.rank}: {type(exc).__name__}: {exc} "
              f"(in the {what}); the other ranks wait for this one's messages: ending "
              f"every rank (MPI_Abort)", file=sys.stderr, flush=True)
        exchange.abort(1)
        os._exit(1)          # MPI_Abort ends this process too, but not always at once


def users_frames(tb) -> list:
    """The frames of a traceback in neither lptrain's nor torch's code: the user's."""
    skip = (str(Path(__file__).resolve().parents[1]), str(Path(torch.__file__).parent))
    return [f for f in traceback.extract_tb(tb)
            if not str(Path(f.filename).resolve()).startswith(skip)]
