"""What a Makefile target does with a run directory it is about to fill again
(`make reproduce-*`, `compare-modes`): keep a run that ended as this command would run
it, resume one stopped so, start afresh otherwise; a run still going is left alone,
also where the target is told to start every run afresh (`FRESH=1`).

`python -m lptrain.runplan [--fresh] DIR RANKS OVERRIDE...` prints `kept`, `kept-failed`
(kept, but it diverged: running it again with the same settings diverges again),
`resume`, `fresh` or `running`; for a kept run it says on stderr how the run ended.
"""
from __future__ import annotations

import sys
from pathlib import Path

from lptrain.errors import LptrainError
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import last_iteration, root_attrs, run_status
from lptrain.rundir import run_alive, saved_overrides
from lptrain.train.checkpoint import CHECKPOINT_FILE

KEPT, KEPT_FAILED, RESUME, FRESH, RUNNING = "kept", "kept-failed", "resume", "fresh", "running"
ENDED = (ms.COMPLETED, ms.STALLED, ms.DIVERGED)    # nothing to carry on


def _hydra(arg: str) -> bool:
    """An override of Hydra's own config, which Hydra does not save with the run's."""
    return arg.lstrip("+~").startswith("hydra")


def plan(run_dir: str | Path, ranks: int, overrides: list[str], fresh: bool = False) -> str:
    """RUNNING where a process still holds the run; else FRESH where `fresh` asks for
    it; KEPT where it ended as these overrides on `ranks` ranks would run it now (its
    configuration, conf files included, equal to theirs), KEPT_FAILED where it diverged
    so; RESUME where it stopped so
    with a checkpoint and iterations left; else FRESH."""
    run_dir, given = Path(run_dir), [a for a in overrides if a and not _hydra(a)]
    metrics = run_dir / ms.FILE_NAME
    if not metrics.is_file():
        return FRESH
    if run_alive(run_dir):
        return RUNNING
    if fresh:
        return FRESH
    config = _same(run_dir, ranks, given)
    if config is None:
        return FRESH
    status, _ = run_status(metrics)
    if status in ENDED:
        return KEPT_FAILED if status == ms.DIVERGED else KEPT
    left = last_iteration(metrics) < config["train"]["iterations"]
    return RESUME if left and (run_dir / CHECKPOINT_FILE).is_file() else FRESH


def _same(run_dir: Path, ranks: int, overrides: list[str]) -> dict | None:
    """The run's configuration where it was given these overrides on `ranks` ranks and
    its configuration is what they compose to now, else None."""
    import yaml

    from lptrain.config import compose
    saved = run_dir / ".hydra" / "overrides.yaml"
    world, text = root_attrs(run_dir / ms.FILE_NAME, ms.WORLD_SIZE, ms.CONFIG)
    try:
        if not saved.is_file() or sorted(saved_overrides(saved)) != sorted(overrides) or \
                world != ranks:
            return None
        config = yaml.safe_load(text or "")
        return config if config == compose(overrides)[1] else None
    except (LptrainError, yaml.YAMLError):
        return None


def kept_line(run_dir: str | Path) -> str:
    """What the target says of a run it keeps: how the run ended, and how to run it
    again."""
    metrics = Path(run_dir) / ms.FILE_NAME
    status, _ = run_status(metrics)
    last = last_iteration(metrics)
    how = f"diverged at iteration {last}" if status == ms.DIVERGED else \
        f"{status} after {last} iterations"
    return f"{run_dir}: kept ({how}, with these settings; FRESH=1 runs it again)"


def replaced_line(run_dir: str | Path, ranks: int, fresh: bool) -> str | None:
    """What the target says of a run it is about to replace (None: the folder holds
    none): why, so that a run on another rank count is not lost unseen."""
    run_dir = Path(run_dir)
    metrics = run_dir / ms.FILE_NAME
    if not metrics.is_file():
        return None
    if fresh:
        why = "FRESH=1"
    else:
        try:
            world = root_attrs(metrics, ms.WORLD_SIZE)[0]
        except LptrainError:
            world = None
        why = f"it ran on {_ranks(world)}, this on {_ranks(ranks)}" \
            if world not in (None, ranks) else "it ran with other settings"
    return f"{run_dir}: its run is replaced ({why}; OUT=DIR keeps both)"


def _ranks(n: int) -> str:
    return f"{n} rank" + ("s" if n != 1 else "")


def main(argv: list[str]) -> str:
    """plan() of the command line `[--fresh] DIR RANKS OVERRIDE...`; a kept or replaced
    run's line on stderr."""
    from lptrain.metrics.streams import say       # a terminal's lines broken between words
    fresh = argv[:1] == ["--fresh"]
    run_dir, ranks, *overrides = argv[fresh:]
    action = plan(run_dir, int(ranks), overrides, fresh)
    if action in (KEPT, KEPT_FAILED):
        say(kept_line(run_dir))
    line = replaced_line(run_dir, int(ranks), fresh) if action == FRESH else None
    if line is not None:
        say(line)
    return action


if __name__ == "__main__":
    print(main(sys.argv[1:]))
