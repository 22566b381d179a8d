"""Whether a run's mini-batch fits its data and its optimizer: checked before a run
starts (preflight) and for every job of a sweep before any runs (config.check_command)."""
from __future__ import annotations

from lptrain.errors import require


def check_batch(batch_size: int | None, optimizer: str, n_train: int) -> None:
    """ConfigError where the mini-batch `batch_size` (None: the full batch) does not fit
    the `n_train` training samples or the optimizer named `optimizer`."""
    # (a dataset's recipe sets it where the command does not: say how to change it)
    require(batch_size is None or batch_size <= n_train, "train.batch_size", batch_size,
            f"larger than the {n_train} training samples; give train.batch_size={n_train} "
            f"or less, or null for the full batch")
    require(batch_size is None or optimizer != "lbfgs", "train.batch_size", batch_size,
            "optimizer=lbfgs is full batch: set train.batch_size=null or use sgd/adam")
