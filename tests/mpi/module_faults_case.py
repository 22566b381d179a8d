"""Run under `mpiexec -n 2`: a layer factory that fails on rank 1 only, one module for
every layer, state_dict() and an evaluation on rank 0 alone, ranks that call with other
limits or modes, a shallower network's
state_dict loaded, a rank late to state_dict(), then a layer
whose f raises on rank 1 only in a forward solve (tests/mpi/test_module_faults.py)."""
from __future__ import annotations

import copy
import io
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from lptrain.errors import ConfigError  # noqa: E402
from lptrain.parallel import module_faults  # noqa: E402
from lptrain.parallel.context import world  # noqa: E402
from lptrain.parallel.lp_module import LayerParallel  # noqa: E402


class Step(nn.Module):
    """tanh(Linear(u)); layer `broken` raises when built (`at == "build"`) or in f."""

    def __init__(self, n: int, broken: int, at: str):
        super().__init__()
        if at == "build" and n == broken:
            raise ValueError(f"no layer {n} here")
        self.n, self.broken, self.lin = n, broken, nn.Linear(3, 3)

    def forward(self, u):
        if self.n == self.broken:
            raise RuntimeError(f"f of layer {self.n} failed")
        return torch.tanh(self.lin(u))


comm = world()
rank = comm.Get_rank()
try:
    LayerParallel(lambda n: Step(n, 12, "build"), n_layers=16, comm=comm)
except ConfigError as exc:        # on every rank: the script may go on
    print(f"rank {rank} caught: {exc}", flush=True)
try:                              # a coarse step averaging across the ranks' layers of
    LayerParallel(lambda n: Step(n, -1, "") if n < 6 else nn.Sequential(   # two structures
        nn.Linear(3, 5), nn.Linear(5, 3)), n_layers=12, comm=comm)
except ConfigError as exc:        # (was an abort from inside the solve on one rank)
    print(f"rank {rank} caught: {exc}", flush=True)
shared = Step(0, -1, "")
try:                              # one module for every layer: refused on several ranks
    LayerParallel([shared] * 16, comm=comm)
except ConfigError as exc:
    print(f"rank {rank} caught: {exc}", flush=True)
mod = LayerParallel(lambda n: Step(n, 12, "f"), n_layers=16, comm=comm)   # rank 1 owns 12
try:                              # the data-parallel habit: state_dict() on rank 0 alone
    if rank == 0:
        mod.state_dict()
    else:
        mod(torch.ones(2, 3))
except ConfigError as exc:
    print(f"rank {rank} caught: {exc}", flush=True)
try:                              # an evaluation on rank 0 alone, the others training
    if rank == 0:
        with torch.no_grad():
            mod(torch.ones(5, 3))
    else:
        mod(torch.ones(2, 3)).sum().backward()
except ConfigError as exc:
    print(f"rank {rank} caught: {exc}", flush=True)
try:                              # one rank's per-call limit: its solve would stop early
    mod(torch.ones(2, 3), max_iter=1 if rank == 0 else None)
except ConfigError as exc:
    print(f"rank {rank} caught: {exc}", flush=True)
mod.train(rank == 1)
try:                              # eval() on rank 0 alone
    mod(torch.ones(2, 3))
except ConfigError as exc:
    print(f"rank {rank} caught: {exc}", flush=True)
mod.train()
shallow = LayerParallel(lambda n: Step(n, -1, ""), n_layers=8, comm=None).state_dict()
try:                              # a dict of 8 layers: rank 0's are all there, rank 1's not
    mod.load_state_dict(shallow)
except RuntimeError as exc:       # torch's, listing every rank's missing keys
    text = str(exc)
    print(f"rank {rank} refused: {text.count('layers.')} keys missing, from "
          f"{text[text.index('layers.'):].split(',')[0]}", flush=True)
kept = mod.load_state_dict(shallow, strict=False)      # what there is, on every rank
print(f"rank {rank} not strict: {len(kept.missing_keys)} keys missing", flush=True)
halves = comm.Split(0, rank)      # a communicator of its own: deepcopy failed on it
twin = LayerParallel(lambda n: Step(n, -1, ""), n_layers=16, comm=halves)
copied = copy.deepcopy(twin)      # e.g. the start of an average of the weights
same = torch.equal(copied(torch.ones(2, 3)), twin(torch.ones(2, 3)))
print(f"rank {rank} copied: equal {same}", flush=True)
try:                              # a pickle would hold this rank's layers only
    torch.save(twin, io.BytesIO())
except TypeError as exc:
    print(f"rank {rank} caught: {exc}", flush=True)
module_faults.PATIENCE = 0.5      # a rank late to a collective call: said, then waited for
if rank == 1:
    time.sleep(1.5)
print(f"rank {rank} gathered {len(mod.state_dict())} entries", flush=True)
mod(torch.ones(2, 3))
print(f"rank {rank}: not reached", flush=True)
