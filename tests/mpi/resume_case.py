"""Runs stopped on one grid and resumed on another, in process (app.run).

`python resume_case.py BASE` under `mpiexec -n 2` (L-BFGS's pairs split over the two
ranks, train/shards.py, as on a large θ): for every case and 2-rank grid it
resumes BASE/one/CASE (stopped on one rank) into BASE/from_one/CASE/GRID, stops a run of
its own into BASE/two/CASE/GRID, then resumes each of those on the other 2-rank grid
into BASE/across/CASE/GRID (a copy). test_resume_grids.py does the one-rank parts and
compares every metrics.h5 with the uninterrupted run.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

from lptrain import app, config
from lptrain.config.schema import register_configs
from lptrain.errors import Interrupted

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import StopAt  # noqa: E402

CONF = Path(config.CONF_DIR)
TINY = ["network.layers=8", "network.width=4", "dataset.n_train=200", "dataset.n_val=50",
        "seed=5", "eval_every=2", "mgrit.levels=2", "mgrit.cfactor0=2"]
CASES = {   # name: (overrides, stop after, iterations)
    "simultaneous-lbfgs": (["mode=simultaneous"], 4, 8),
    # 4 batches an epoch: the resumed epoch's batches start from warm starts
    "simultaneous-adam-batches": (["mode=simultaneous", "optimizer=adam",
                                   "train.batch_size=50"], 6, 10),
    # 10 batches of 3, 6 kept warm: evictions, and data groups without a batch's samples
    "simultaneous-sgd-small-batches": (["mode=simultaneous", "optimizer=sgd",
                                        "train.batch_size=3", "dataset.n_train=30",
                                        "mode.warm_batches=6"], 13, 22),
    "mgrit-lbfgs": (["mode=mgrit", "mgrit.tol=1e-13"], 4, 8),
    "serial-lbfgs": (["mode=serial"], 4, 8),
}
GRIDS = {"2x1": 2, "1x2": 1}        # name: parallel.layer_ranks on 2 ranks


def grids(case: str) -> list[str]:
    """The 2-rank grids of a case (serial mode distributes only the batch)."""
    return ["1x2"] if case.startswith("serial") else list(GRIDS)


def cfg(case: str, iterations: int, layer_ranks: int = 1):
    register_configs()
    overrides = CASES[case][0]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config",
                       overrides=[*TINY, *overrides, f"train.iterations={iterations}",
                                  f"parallel.layer_ranks={layer_ranks}"])


def stopped(case: str, comm, run_dir: Path, layer_ranks: int = 1) -> None:
    """A run of `case` stopped after its `stop after` iteration (checkpoint written)."""
    _, at, total = CASES[case]
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        app.run(cfg(case, total, layer_ranks), comm, run_dir, StopAt(at))
    except Interrupted:
        return
    raise AssertionError(f"{case}: the run was not stopped")


def resumed(case: str, comm, source: Path, run_dir: Path, layer_ranks: int = 1) -> None:
    """Copy the stopped run `source` to `run_dir` and resume it there to the end."""
    if comm is None or comm.Get_rank() == 0:
        shutil.copytree(source, run_dir)
    if comm is not None:
        comm.Barrier()
    app.run(cfg(case, CASES[case][2], layer_ranks), comm, run_dir, resume=True)


def main(base: Path) -> None:
    from lptrain.parallel.context import world
    from lptrain.train import shards
    comm = world()
    least, shards.LEAST = shards.LEAST, 1    # L-BFGS's pairs split over the 2 ranks
    try:
        _all_cases(comm, base)
    finally:
        shards.LEAST = least


def _all_cases(comm, base: Path) -> None:
    for case in CASES:
        for grid in grids(case):
            resumed(case, comm, base / "one" / case, base / "from_one" / case / grid,
                    GRIDS[grid])
            stopped(case, comm, base / "two" / case / grid, GRIDS[grid])
        if len(grids(case)) == 2:
            for grid, other in (("2x1", "1x2"), ("1x2", "2x1")):
                resumed(case, comm, base / "two" / case / grid,
                        base / "across" / case / grid, GRIDS[other])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
