"""Stop requests: SIGINT, SIGHUP and SIGTERM only set a flag, which the ranks agree on.

Torch-free, so that the `lptrain` command installs these handlers before its heavy
imports: a signal from the first moment on stops the run cleanly (train/guard.py says
when the ranks check it).
"""
from __future__ import annotations

import signal

from lptrain.errors import Interrupted, RunFileError

# signal -> the value a rank contributes to the agreement sum, weakest first: SIGHUP (a
# closed terminal) dominates SIGINTs, SIGTERM (a scheduler's cancel) both, for up to
# 2^14 - 1 ranks receiving each (sums of float64 are exact far beyond)
_WEIGHT = {signal.SIGINT: 1.0, signal.SIGHUP: 2.0 ** 14, signal.SIGTERM: 2.0 ** 28}
_FAILED = 2.0 ** 42     # a rank's metrics writer failed: larger than any sum of the above
# how it failed, rank 0 alone contributing _FAILED times one of these
ROWS_KEPT, ROWS_LOST = 1, 2     # the iteration's rows are in metrics.h5 / could not be written


class StopSignals:
    """SIGINT/SIGHUP/SIGTERM handlers that record the signal instead of raising."""

    def __init__(self):
        self.received: int | None = None

    def install(self) -> StopSignals:
        for sig in _WEIGHT:
            signal.signal(sig, self._handle)
        return self

    @staticmethod
    def ignore() -> None:
        """Ignore the stop signals from here on (a command whose work is done)."""
        for sig in _WEIGHT:
            signal.signal(sig, signal.SIG_IGN)

    def _handle(self, signum, frame) -> None:
        if self.received is None or _WEIGHT[signum] > _WEIGHT[self.received]:
            self.received = signum            # keep the stronger request

    def agreed(self, exchange, failed: int = 0) -> tuple[int | None, int]:
        """(the signal every rank stops for or None, how a rank's writer failed: 0 not,
        else ROWS_KEPT or ROWS_LOST, the `failed` of the one rank that writes).

        Collective: every rank calls it at the same point.
        """
        mine = _WEIGHT.get(self.received, 0.0) if self.received is not None else 0.0
        mine += _FAILED * int(failed)
        total = exchange.allreduce_sum(mine) if exchange.size > 1 else mine
        failed_somewhere = int(total // _FAILED)
        total %= _FAILED
        if total <= 0:
            return None, failed_somewhere
        sig = max((s for s, w in _WEIGHT.items() if total >= w), key=_WEIGHT.get)
        return sig, failed_somewhere

    def check(self, exchange, iteration: int, writer=None, signals: bool = True) -> None:
        """Raise on every rank alike: the writer's failure (rank 0 holds the message),
        else (where `signals`) Interrupted once any rank received a signal; without
        `signals` a received one stays pending for `agreed`."""
        failure = getattr(writer, "failure", None)
        how = 0 if failure is None else \
            ROWS_LOST if getattr(writer, "rows_lost", False) else ROWS_KEPT
        signum, failed = self.agreed(exchange, how)
        if failed:
            error = failure or RunFileError("rank 0 could not write its metrics file")
            error.rows_lost = failed == ROWS_LOST     # then no checkpoint of this iteration
            raise error
        if signum is not None and signals:
            raise Interrupted(int(signum), iteration)


class NoStop(StopSignals):
    """A stop check without signal handlers (library use, tests): only writer failures."""
