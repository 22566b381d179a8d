"""Entry points of `lptrain-eval`, `lptrain-report` and `lptrain-model`.

Each puts its SIGINT/SIGTERM handling in place (`errors.stops_on_signals`) before it
imports its command, whose imports (torch, matplotlib) take seconds: a Ctrl-C at any
moment ends the command with one line and 128 + the signal. `lptrain` itself is
lptrain/cli.py, which stops a run after an iteration instead.
"""
from __future__ import annotations

from lptrain.errors import stops_on_signals


def evaluate() -> int:
    def load():
        from lptrain.evaluate import main
        return main
    return stops_on_signals("lptrain-eval", load)


def report() -> int:
    def load():
        from lptrain.report.cli import main
        return main
    return stops_on_signals("lptrain-report", load)


def model() -> int:
    def load():
        from lptrain.model_perf.cli import main
        return main
    return stops_on_signals("lptrain-model", load)
