"""The run's model files, written on rank 0 from a guard.Progress: model.pt, the best
validated parameters so far, and model-last.pt, the last good ones (model/saved.py),
beside every checkpoint (train/checkpoint.py) and at the end (app.py)."""
from __future__ import annotations

from pathlib import Path

from lptrain.model.saved import MODEL_FILES, model_record, save_torch
from lptrain.train.collective import collectively

CONSOLE_COLUMNS = 80     # the lines naming the files fit a terminal this wide


class ModelSaver:
    """Writes the run's models on rank 0 from a Progress: model.pt, the best validated
    parameters so far, and model-last.pt, the last good ones (model/saved.py)."""

    def __init__(self, run_dir: Path, net, config_yaml: str, dtype: str, data,
                 enabled: bool, chunk: int | None = None):
        self.paths = {which: Path(run_dir) / name for which, name in MODEL_FILES.items()}
        self.net, self.config_yaml, self.chunk = net, config_yaml, chunk
        self.dtype, self.data, self.enabled = dtype, data, enabled
        self.written: dict[str, int] = {}   # which -> the iteration its file holds
        self.held_below: int | None = None   # resumed with θ pending: see hold()

    def hold(self, iteration: int) -> None:
        """A run resumed from a checkpoint of iteration k whose θ is unchecked (SGD, Adam):
        the files hold what the earlier start left (θ after k passed at its end); they are
        not rewritten with the parameters before until θ is checked, or fails (`rollback`)."""
        self.held_below = iteration

    def _due(self, progress, rollback: bool = False) -> dict[str, tuple]:
        """which -> (iteration, θ, validation) of each file not holding its parameters yet."""
        if self.held_below is not None and progress.iteration >= self.held_below:
            self.held_below = None
        if self.held_below is not None and not rollback:
            return {}
        held = {"last": (progress.iteration, progress.theta,
                         progress.validation_of(progress.iteration))}
        if progress.best is not None:
            b = progress.best
            held["best"] = (b.iteration, b.theta, (b.loss, b.accuracy))
        return {w: h for w, h in held.items() if self.written.get(w) != h[0]}

    def _write(self, due: dict[str, tuple]) -> None:
        for which, (iteration, theta, validation) in due.items():
            save_torch(model_record(theta, self.net, self.config_yaml, self.dtype, self.data,
                                    iteration, which, validation, self.chunk),
                       self.paths[which])

    def save(self, progress, exchange) -> None:
        """Write the files not up to date, and fail on every rank alike (RunFileError) if
        rank 0 could not; nothing to do when both hold their parameters already."""
        due = self._due(progress)
        if not due:
            return
        collectively(exchange, lambda: self._write(due), self.enabled)
        self.written.update({w: h[0] for w, h in due.items()})

    def save_quietly(self, progress, rollback: bool = False) -> None:
        """Best effort while another error ends the run: that error is the one reported
        (`rollback`: a divergence, whose files go back to the checked parameters)."""
        if self.enabled:
            try:
                self._write(self._due(progress, rollback))
            except Exception:  # noqa: BLE001 - the run's own error is already propagating
                pass

    def describe(self, progress) -> list[str]:
        """The console's lines naming both files: the path alone on the first (lines of
        their own: a table cell would fold a long path), what each holds below it, in
        80 columns."""
        best, last = progress.best, f"{self.paths['last'].name}: iteration {progress.iteration}"
        held = [last] if best is None else [
            f"best validation accuracy {best.accuracy:.4f} at iteration {best.iteration}", last]
        one = "  " + "; ".join(held)
        return [f"model: {self.paths['best']}",
                *([one] if len(one) <= CONSOLE_COLUMNS else ["  " + h for h in held])]
