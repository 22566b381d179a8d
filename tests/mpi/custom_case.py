"""network=custom on however many ranks this runs on, in process (app.run).

`python custom_case.py BASE STOPPED` under mpiexec: each case of CASES trains the
two-convolution GroupNorm step of tests/custom_step_pkg into BASE/CASE (every rank writes
its part, rank 0 the files), then the run STOPPED (stopped on one rank) is resumed into
BASE/resumed. test_custom_ranks.py runs the same cases on one rank and compares.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # custom_step_pkg
from lptrain import app, config  # noqa: E402
from lptrain.config.schema import register_configs  # noqa: E402

BASE = ["dataset=mnist", "dataset.n_train=20", "dataset.n_val=10", "network=custom",
        "network.step._target_=custom_step_pkg.MyStep", "+network.step.channels=2",
        "+network.step.hidden=4", "+network.step.groups=2", "network.channels=2",
        "network.opening=conv", "network.pool=4", "network.layers=8", "network.T=2.0",
        "dtype=float64", "train.batch_size=null", "optimizer=lbfgs", "seed=3",
        "train.iterations=4", "eval_every=2", "mgrit.levels=2", "mgrit.cfactor0=2",
        "mgrit.cfactor=2"]
CASES = {   # name: overrides (the layer groups: parallel.layer_ranks)
    "serial": ["mode=serial"],
    "mgrit": ["mode=mgrit", "mgrit.tol=1e-13", "mgrit.max_iter=40"],
    "simultaneous": ["mode=simultaneous", "mgrit.calibrate_every=0"],
    "simultaneous-adam": ["mode=simultaneous", "optimizer=adam", "train.batch_size=10",
                          "mgrit.calibrate_every=0"],
}


# a step that fails on rank 1 alone when it is built or tried at start-up (preflight):
# was a ConfigError on rank 1 while rank 0 went on into a collective and waited for ever
REFUSED = {"refused-on-rank-1": "FailsOnRankOne", "unbuilt-on-rank-1": "UnbuiltOnRankOne"}


def cfg(case: str, layer_ranks: int = 1):
    register_configs()
    extra = ["mode=mgrit", f"network.step._target_=custom_step_pkg.{REFUSED[case]}"] \
        if case in REFUSED else CASES[case]
    with initialize_config_dir(config_dir=config.CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=[
            *BASE, *extra, f"parallel.layer_ranks={layer_ranks}"])


def refused(comm, run_dir: Path, case: str) -> None:
    """Start a REFUSED case; rank 0 writes its error's exit status and message to
    run_dir/error.txt (every rank must end with an error, none wait)."""
    from lptrain.errors import LptrainError
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        app.run(cfg(case, comm.Get_size()), comm, run_dir)
    except LptrainError as exc:
        if comm.Get_rank() == 0:
            (run_dir / "error.txt").write_text(f"{exc.exit_code} {exc}")
    else:
        raise AssertionError(f"{case}: the step that fails on rank 1 was not refused")


def layer_ranks(case: str, size: int) -> int:
    """Serial mode splits only the batch; the others put every rank on the layers."""
    return 1 if case == "serial" else size


STOPPED = "simultaneous"   # a run of this case stopped on one rank (test side) and resumed
STOP_AT = 2                # here: its warm starts move to this grid (train/regrid.py)


def resume(comm, stopped: Path, run_dir: Path) -> None:
    """Copy the stopped run to run_dir and resume it there on this world's ranks."""
    if comm.Get_rank() == 0:
        shutil.copytree(stopped, run_dir)
    comm.Barrier()
    app.run(cfg(STOPPED, layer_ranks(STOPPED, comm.Get_size())), comm, run_dir, resume=True)


def main(base: Path, stopped: Path) -> None:
    from lptrain.parallel.context import world
    comm = world()
    for case in CASES:
        run_dir = base / case
        run_dir.mkdir(parents=True, exist_ok=True)
        app.run(cfg(case, layer_ranks(case, comm.Get_size())), comm, run_dir)
    resume(comm, stopped, base / "resumed")
    for case in REFUSED:
        refused(comm, base / case, case)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
