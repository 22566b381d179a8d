"""Entry points of `lptrain-eval`, `lptrain-report` and `lptrain-model`.

Each puts its SIGINT/SIGTERM handling in place (`errors.stops_on_signals`) before it
imports its command, whose imports (torch, matplotlib) take seconds: a Ctrl-C at any
moment ends the command with one line and 128 + the signal. `lptrain` itself is
lptrain/entry.py and cli.py, which stop a run after an iteration instead.

`lptrain-eval` and `lptrain-report` use no MPI: started by `mpiexec -n P`, rank 0 runs
the command and the other ranks end at once with 0 (each rank printed every line, and
wrote the same files). `lptrain-model` under mpiexec measures the link between ranks 0
and 1 and goes on on rank 0 (model_perf/cli.py `link`): every rank runs it.
"""
from __future__ import annotations

from lptrain.errors import stops_on_signals


def _once(prog: str, load) -> int:
    """`stops_on_signals(prog, load)` on the launcher's rank 0; 0 on any other rank."""
    from lptrain.command_args import launched_rank
    return _written(prog, lambda: stops_on_signals(prog, load)) if launched_rank() == 0 \
        else 0


def _written(prog: str, run) -> int:
    """run(), its output flushed; a write that fails (stdout to a full disk or /dev/full,
    an image on a full disk) ends it in one line and 1, not a traceback and Python's
    "Exception ignored" for the buffer it could not flush at exit."""
    import sys

    from lptrain.metrics.streams import encodable
    encodable(sys.stdout, sys.stderr)
    try:
        try:
            status = run()
        except SystemExit:       # argparse's --help, --version and usage: their text too
            sys.stdout.flush()
            raise
        sys.stdout.flush()
        return status
    except OSError as exc:
        if exc.filename is not None or exc.strerror is None:    # a file named: main's
            raise                                              # own one-line errors
        from lptrain.metrics.streams import output_lost
        output_lost(prog, exc)
        return 1


def evaluate() -> int:
    def load():
        from lptrain.evaluate import main
        return main
    return _once("lptrain-eval", load)


def report() -> int:
    def load():
        from lptrain.report.cli import main
        return main
    return _once("lptrain-report", load)


def model() -> int:
    def load():
        from lptrain.model_perf.cli import main
        return main
    return _written("lptrain-model", lambda: stops_on_signals("lptrain-model", load))
