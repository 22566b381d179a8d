"""One `mpiexec -n 4` launch for the cases that run on up to four ranks, instead of one
launch (four interpreters importing torch) per case.

    mpiexec -n 4 python four_ranks.py OUT ranks module grid ddp

runs each named case of CASES on the launch's world in turn; rank 0 saves {case: its
results} to OUT. The pytest side is the `four_ranks` fixture of tests/mpi/conftest.py,
which names the cases of the test files it collected.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ddp_case  # noqa: E402
import grid_case  # noqa: E402
import module_case  # noqa: E402
import ranks_case  # noqa: E402
from sizes import on_each_size  # noqa: E402

RANKS = 4
SIZES = [2, 3, 4]


def _ranks(comm) -> dict:
    from lptrain.parallel.context import make_exchange
    return on_each_size(lambda sub: ranks_case.run(make_exchange(sub), sub), comm, SIZES)


CASES = {   # name: results on a world of RANKS ranks (rank 0's; others' are dropped)
    "ranks": _ranks,                                                  # {size: results}
    "module": lambda comm: on_each_size(module_case.run, comm, SIZES),  # {size: results}
    "grid": grid_case.run,                                            # {case/grid: results}
    "ddp": ddp_case.on_grids,                                         # {grid-group: results}
}


def main(out: Path, names: list[str]) -> None:
    from lptrain.parallel.context import world
    comm, results = world(), {}
    assert comm.Get_size() == RANKS, comm.Get_size()
    for name in names:
        results[name] = CASES[name](comm)
        comm.Barrier()
    if comm.Get_rank() == 0:
        torch.save(results, out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
