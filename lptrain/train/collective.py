"""Failures that happen on some ranks only end every rank alike.

A file operation that only rank 0 performs (creating or reopening metrics.h5, writing
model.pt or a checkpoint) or that each rank performs on its own part (reading its
checkpoint entry) may fail on one rank; the others would then wait forever in the next
collective. These helpers turn such a failure into the same error on every rank: the
failing rank raises its own, the others an LptrainError with the first failing rank's
message and exit status, so that the job ends with one line and one exit code.
"""
from __future__ import annotations

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
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise LptrainError(first[0], exit_code=first[1])


def os_error(exc: OSError) -> RunFileError:
    """An OSError as one line naming the file and the system's reason."""
    where = f"{exc.filename}: " if exc.filename else ""
    return RunFileError(f"{where}{reason(exc)}")


def collectively(exchange, fn, enabled: bool = True):
    """fn() where `enabled` (None elsewhere); collective: an LptrainError or OSError on
    any rank is raised on every rank (agree_on_error)."""
    result, error = None, None
    if enabled:
        try:
            result = fn()
        except LptrainError as exc:
            error = exc
        except OSError as exc:
            error = os_error(exc)
    agree_on_error(exchange, error)
    return result
