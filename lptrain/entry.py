"""The `lptrain` command's first module: the stop handlers, then the command.

lptrain.cli imports Hydra, h5py and numpy before anything else. A
SIGINT there had raised a KeyboardInterrupt traceback and a SIGTERM had ended the rank
without a word; with the handlers installed first, such a signal stops the command as
one that lands while torch and MPI load does (lptrain/train/stop.py, cli.main).
"""
from __future__ import annotations

import importlib


def main(command: str = "lptrain.cli") -> None:
    """Install the stop handlers, then import `command` and run its main with them."""
    import sys

    from lptrain.metrics.streams import encodable
    from lptrain.train.stop import StopSignals    # torch-free and light
    early = StopSignals().install()
    encodable(sys.stdout, sys.stderr)
    importlib.import_module(command).main(early)
