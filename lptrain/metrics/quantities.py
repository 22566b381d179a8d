"""Quantities that the console, lptrain-report, TensorBoard and lptrain-model all show,
defined once so that one name means one number everywhere.

Iteration time: the median duration of a run's optimizer iterations, in seconds. The
duration of one iteration is `train/step_time` in metrics.h5: every objective and gradient
evaluation of the step (line-search trials and MGRIT solves included), not validation and
not checkpoints, which the wall time also holds. The first iteration pays one-time costs
(allocation, a cold-started MGRIT solve) and is always left out, so a run of one iteration
has no iteration time (never one made of its one-time costs); the median keeps a few slow
iterations (a long line search, a busy machine) from moving it.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

ITERATION_TIME = "iteration time"       # its name on screen, in tables and plots


def iteration_time(step_times: Sequence[float] | np.ndarray | None) -> float | None:
    """The iteration time [s] of a run whose iterations took `step_times` seconds, in
    order (see the module docstring); None when no iteration after the first has a finite
    duration (a run of one iteration included)."""
    t = np.asarray(step_times if step_times is not None else [], dtype=np.float64)[1:]
    t = t[np.isfinite(t)]
    return float(np.median(t)) if t.size else None


def format_duration(seconds: float) -> str:
    """'h:mm:ss' of a number of seconds (rounded down), '-:--:--' when not finite."""
    if not math.isfinite(seconds):
        return "-:--:--"
    s = max(int(seconds), 0)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
