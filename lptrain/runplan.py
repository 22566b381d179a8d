"""What a Makefile target does with a run directory it is about to fill again
(`make reproduce-*`, `compare-modes`): keep a run that completed with the same overrides,
resume one stopped with them that has a checkpoint, start afresh otherwise.

`python -m lptrain.runplan DIR OVERRIDE...` prints `kept`, `resume` or `fresh`.
"""
from __future__ import annotations

import sys
from pathlib import Path

from lptrain.errors import LptrainError
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import run_status
from lptrain.rundir import saved_overrides
from lptrain.train.checkpoint import CHECKPOINT_FILE

KEPT, RESUME, FRESH = "kept", "resume", "fresh"
ENDED = (ms.COMPLETED, ms.STALLED, ms.DIVERGED)    # nothing to carry on


def plan(run_dir: str | Path, overrides: list[str]) -> str:
    """KEPT where the run in `run_dir` ended with exactly these overrides, RESUME where it
    stopped (interrupted, failed, killed) with them and left a checkpoint, else FRESH."""
    run_dir = Path(run_dir)
    overrides = [a for a in overrides if a and not a.startswith("hydra.")]   # not saved
    saved = run_dir / ".hydra" / "overrides.yaml"
    try:
        same = saved.is_file() and sorted(saved_overrides(saved)) == sorted(overrides)
    except LptrainError:
        same = False
    if not same or not (run_dir / ms.FILE_NAME).is_file():
        return FRESH
    status, _ = run_status(run_dir / ms.FILE_NAME)
    if status in ENDED:
        return KEPT
    return RESUME if (run_dir / CHECKPOINT_FILE).is_file() else FRESH


if __name__ == "__main__":
    print(plan(sys.argv[1], sys.argv[2:]))
