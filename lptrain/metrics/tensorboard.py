"""Optional TensorBoard scalars beside metrics.h5 (`logger=tensorboard`, rank 0).

`Scalars` wraps the run's metrics writer: every call goes on to it unchanged, and the
scalar fields of train/, validation/ and mgrit/ are also written as TensorBoard scalars
`<group>/<field>` at step `iteration` into `<run dir>/tensorboard/`. metrics.h5 stays the
complete record; histories and per-rank timings are not repeated here.
"""
from __future__ import annotations

import contextlib
import importlib.util
import math
from numbers import Real
from pathlib import Path

from lptrain.errors import MissingPackageError, install_hint
from lptrain.metrics import schema as s

LOGGERS = ("none", "tensorboard")
DIR_NAME = "tensorboard"


def check_available(logger: str) -> None:
    """MissingPackageError unless the packages `logger` needs are installed (call on every
    rank)."""
    if logger == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
        raise MissingPackageError(f"logger=tensorboard: the tensorboard package is not "
                                  f"installed; {install_hint('tensorboard')}")


class Scalars:
    """The metrics writer `inner`, with TensorBoard scalars added (see the module doc)."""

    def __init__(self, inner, directory: Path):
        from torch.utils.tensorboard import SummaryWriter
        self.inner = inner
        self.tb = SummaryWriter(log_dir=str(directory), flush_secs=10)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _scalars(self, group: str, fields: dict) -> None:
        step = int(fields[s.ITERATION])
        for name, value in fields.items():
            if name != s.ITERATION and isinstance(value, Real) and math.isfinite(value):
                self.tb.add_scalar(f"{group}/{name}", float(value), step)

    def log_train(self, **fields) -> None:
        self.inner.log_train(**fields)
        self._scalars(s.TRAIN, fields)

    def log_validation(self, iteration: int, loss: float, accuracy: float) -> None:
        self.inner.log_validation(iteration, loss, accuracy)
        self._scalars(s.VALIDATION, {s.ITERATION: iteration, s.LOSS: loss,
                                     s.ACCURACY: accuracy})

    def log_mgrit(self, **fields) -> None:
        self.inner.log_mgrit(**fields)
        self._scalars(s.MGRIT, fields)

    def close_scalars(self) -> None:
        self.tb.close()


@contextlib.contextmanager
def with_logger(writer, logger: str, run_dir: Path, enabled: bool):
    """`writer`, or a `Scalars` around it for logger=tensorboard on the writing rank."""
    if logger != "tensorboard" or not enabled:
        yield writer
        return
    scalars = Scalars(writer, Path(run_dir) / DIR_NAME)
    try:
        yield scalars
    finally:
        scalars.close_scalars()
