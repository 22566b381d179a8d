"""LayerParallel when its work fails on some of its ranks only.

Each rank builds and runs its own layers, so a user's layer can fail on one rank alone
(a factory that breaks for layer 12, an f that raises on some states). The other ranks
would then wait for that rank's messages forever. Building ends with an agreement: every
rank raises the same ConfigError, which the caller may catch. A failure inside a solve
cannot be agreed on, the others being inside the solve already: the failing rank
reports it and ends every rank (MPI_Abort), as `python -m mpi4py` does for any uncaught
exception. A collective call that only some ranks make (`if rank == 0:
net.state_dict()`, an evaluation on rank 0 alone) would wait for the others forever;
each collective call starts by gathering every rank's call: different calls are refused
on every rank, and a rank that waits PATIENCE seconds says so.
"""
from __future__ import annotations

import os
import sys
import time
import traceback
import zlib
from contextlib import contextmanager
from pathlib import Path

import torch

from lptrain.errors import ConfigError


PATIENCE = 60.0     # seconds a rank waits in a collective call before it says so
SPINS = 2000        # tests of the request before polling with sleeps (ranks in step)
CALLS = ("forward", "forward without gradients", "backward", "state_dict()",
         "optimizer_state_dict()")


def all_arrived(exchange, call: str, numbers: int = 0, settings: dict | None = None) -> None:
    """Wait until every rank has reached a collective call, and check that it is the same
    `call` on a tensor of as many `numbers`, with the same `settings` (what the solve
    depends on besides the data: iteration limits, dtype, training mode), everywhere:
    ConfigError on every rank where not (`if rank == 0: net.state_dict()` meets the
    others' next forward; an evaluation on rank 0 alone meets their training; one rank's
    max_iter=1 would stop its part of the solve while the others wait for its messages).
    After PATIENCE seconds say once on stderr what this rank waits for, then wait on
    (the others may be slow, or outside every collective call)."""
    if exchange.size == 1:
        return
    digest = zlib.crc32(repr(settings).encode())    # the same text, the same number
    request, table = exchange.iallgather_ints([CALLS.index(call), numbers, digest])
    spins, start, said = 0, time.monotonic(), False
    while not request.Test():
        spins += 1
        if spins < SPINS:
            continue
        time.sleep(0.001)
        if not said and time.monotonic() - start > PATIENCE:
            said = True
            print(f"LayerParallel: rank {exchange.rank} has waited {PATIENCE:g} s in "
                  f"{call} for the other ranks: every rank must make this call (it is "
                  f"collective), e.g. state = net.state_dict() on every rank, then save it "
                  f"on rank 0 alone", file=sys.stderr, flush=True)
    calls = [(int(k), int(n)) for k, n, _ in table]
    if len(set(calls)) > 1:
        where = "; ".join(f"rank {r}: {CALLS[k]}" + (f" of {n} numbers" if n else "")
                          for r, (k, n) in enumerate(calls))
        raise ConfigError(f"LayerParallel: the ranks are in different collective calls "
                          f"({where}); every rank must make the same calls in the same "
                          f"order with the same batch, e.g. state = net.state_dict() on "
                          f"every rank, then save it on rank 0 alone")
    if len({int(d) for d in table[:, 2]}) > 1:      # every rank sees it: one more gather
        raise ConfigError(f"LayerParallel: the ranks call {call} with different settings "
                          f"({differences(exchange.allgather(settings))}); every rank "
                          f"must build the module and call it alike")


def differences(settings: list[dict | None]) -> str:
    """'key: rank 0 a, rank 1 b' for each key whose value differs between the ranks'
    `settings` (one dict per rank)."""
    keys = dict.fromkeys(k for s in settings for k in (s or {}))
    return "; ".join(f"{k}: " + ", ".join(f"rank {r} {(s or {}).get(k)!r}"
                                          for r, s in enumerate(settings))
                     for k in keys if len({repr((s or {}).get(k)) for s in settings}) > 1)


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
    the user's frames of the traceback and a last line naming it, then ends every rank
    (the others wait for its messages); on one rank the exception goes to the caller."""
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
