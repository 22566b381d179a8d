"""Small trainings on every layer × data grid of the ranks this runs on.

Run under mpiexec: rank 0 saves {case/grid: results} to argv[1]; the pytest
side (test_grid_ranks.py) compares them with the same cases on one rank.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from lptrain import config
from lptrain.app import build, options
from lptrain.config.schema import register_configs
from lptrain.metrics.console import Console
from lptrain.parallel.grid import divisors
from lptrain.train import shards
from lptrain.train.loop import train
from lptrain.train.optimizers import LBFGS

CONF = Path(config.CONF_DIR)
# Peaks on a dense net with 4 C-intervals (N = 16, c = 4): up to 4 layer ranks
COMMON = ["dataset=peaks", "dataset.n_train=60", "dataset.n_val=20", "network.width=4",
          "network.layers=16", "mgrit.levels=2", "mgrit.cfactor0=4", "train.iterations=4",
          "eval_every=2", "seed=3"]
CASES = {
    "lbfgs-serial": ["mode=serial"],
    "lbfgs-mgrit": ["mode=mgrit", "mgrit.tol=1e-13", "mgrit.max_iter=30"],
    "lbfgs-simultaneous": ["mode=simultaneous"],
    # mini-batches of 3 and 2 samples: with 4 data groups some groups get none
    "sgd-simultaneous": ["mode=simultaneous", "optimizer=sgd", "train.batch_size=3"],
    "adam-serial": ["mode=serial", "optimizer=adam", "train.batch_size=2"],
}


MGRIT_KEPT = ("fwd_iterations", "adj_iterations", "fwd_total", "adj_total", "fwd_history",
              "adj_history", "fwd_residual", "adj_residual", "grad_error", "fwd_plan")


class Rows:
    """A writer that keeps the rows it is given."""

    def __init__(self):
        self.train, self.val, self.mgrit = [], [], []

    def log_train(self, **f):
        self.train.append([f["objective"], f["loss"], f["accuracy"], f["grad_norm"]])

    def log_validation(self, **f):
        self.val.append([f["loss"], f["accuracy"]])

    def log_mgrit(self, **f):
        self.mgrit.append({k: f[k] for k in MGRIT_KEPT})

    def log_timing(self, **f):
        pass


def run_case(overrides: list[str], comm, layer_ranks: int) -> dict:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config",
                      overrides=[*COMMON, *overrides, f"parallel.layer_ranks={layer_ranks}"])
    opts = options(cfg)
    ex, data, net, theta, oracle, opt = build(opts, comm)
    rows = Rows()
    theta, _ = train(theta, opt, oracle, data, opts, rows, Console(False, 1), ex)
    out = {"train": torch.tensor(rows.train, dtype=torch.float64),
           "val": torch.tensor(rows.val, dtype=torch.float64), "theta": theta,
           "mgrit": rows.mgrit}
    if isinstance(opt, LBFGS):
        out.update(lbfgs_parts(opt, comm))
    return out


def lbfgs_parts(opt, comm) -> dict:
    """This rank's part lengths of the pairs, the whole pairs a checkpoint gathers (rank
    0), and whether every rank's parts come back bitwise from the whole ones."""
    state = opt.state_dict()            # collective: the parts gathered on rank 0
    whole = state if comm is None else comm.bcast(state, root=0)
    again = LBFGS(opt.o, shards=opt.shards)
    again.load_state_dict(whole)
    same = all(torch.equal(a, b) for old, new in zip(opt.mem, again.mem)
               for a, b in zip(old[:2], new[:2])) and len(again.mem) == len(opt.mem)
    return {"part": [len(v) for s, y, _ in opt.mem for v in (s, y)],
            "pairs": None if state is None else
            torch.stack([v for s, y, _ in state["mem"] for v in (s, y)]),
            "reloaded": same if comm is None else all(comm.allgather(same))}


def grids(size: int, mode_overrides: list[str]) -> list[int]:
    """Layer ranks of every grid (serial: 1 only)."""
    return [1] if "mode=serial" in mode_overrides else divisors(size)


def run(comm) -> dict:
    size = 1 if comm is None else comm.Get_size()
    out = {}
    least, shards.LEAST = shards.LEAST, 1    # split L-BFGS's pairs of this small θ too
    try:
        for name, overrides in CASES.items():
            for layer in grids(size, overrides):
                out[f"{name}/{layer}x{size // layer}"] = run_case(overrides, comm, layer)
    finally:
        shards.LEAST = least
    return out


if __name__ == "__main__":
    from lptrain.parallel.context import world
    comm = world()
    results = run(comm)
    if comm.Get_rank() == 0:
        torch.save(results, sys.argv[1])
