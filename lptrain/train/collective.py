"""Failures that happen on some ranks only end every rank alike.

A file operation that only rank 0 performs (creating or reopening metrics.h5, writing
model.pt or a checkpoint) or that each rank performs on its own part (reading its
checkpoint entry) may fail on one rank; the others would then wait forever in the next
collective. These helpers turn such a failure into the same error on every rank: the
failing rank raises its own, the others an LptrainError with the first failing rank's
message (naming that rank) and exit status, so that the job ends with one line and one
exit code.
"""
from __future__ import annotations

import socket

from lptrain.errors import LptrainError, RunFileError, reason


def agree_on_error(exchange, error: Exception | None) -> None:
    """Collective: raise on every rank when any rank has `error`."""
    if exchange.size == 1:
        if error is not None:
            raise error
        return
    mine = None if error is None else (str(error), getattr(error, "exit_code", 1))
    errors = exchange.allgather(mine)
    if error is not None:
        raise error
    failed = [rank for rank, e in enumerate(errors) if e is not None]
    if failed:      # the rank that says it is not the one that failed: name that one
        message, status = errors[failed[0]]
        raise LptrainError(f"{message} (on rank {failed[0]})", exit_code=status)


def os_error(exc: OSError) -> RunFileError:
    """An OSError as one line naming the file and the system's reason."""
    where = f"{exc.filename}: " if exc.filename else ""
    return RunFileError(f"{where}{reason(exc)}")


def collectively(exchange, fn, enabled: bool = True):
    """fn() where `enabled` (None elsewhere); collective: an LptrainError or OSError on
    any rank is raised on every rank (agree_on_error)."""
    result, error = None, None
    if enabled:
        result, error = _attempt(fn)
    agree_on_error(exchange, error)
    return result


def in_turns(exchange, fn):
    """fn() on every rank, the ranks of one host one after another, so that what fn
    holds while it runs (a resume's old warm starts) does not add up over a node; errors
    as in `collectively`."""
    hosts = exchange.allgather(socket.gethostname())
    mine = hosts[:exchange.rank].count(hosts[exchange.rank])
    result, error = None, None
    for turn in range(max(hosts.count(h) for h in hosts)):
        if turn == mine:
            result, error = _attempt(fn)
        if exchange.size > 1:
            exchange.allreduce_sum(0.0)       # every rank ends the turn together
    agree_on_error(exchange, error)
    return result


def _attempt(fn):
    """(fn(), None), or (None, the error) for an LptrainError or OSError."""
    try:
        return fn(), None
    except LptrainError as exc:
        return None, exc
    except OSError as exc:
        return None, os_error(exc)
