"""Memory a rank will need (estimated from the config and data sizes) and memory it may use.

The estimate counts what grows with the run, per rank, in bytes:

- the process itself (Python, torch, MPI): BASE;
- θ and the vectors of its size the optimizer keeps (L-BFGS: 2·memory pairs);
- the rank's data shard (training and validation inputs, float64 as loaded,
  plus their copy in the run's dtype);
- the states of the batch shard b on the rank's layers: `STATE_COPIES` state
  tensors per owned layer (MGRIT's two forward and two adjoint buffers, saved
  activations, coarse levels; serial: states, activations, adjoint) plus
  `STATE_EXTRA` for temporaries of a step and the validation solve;
- simultaneous with mini-batches: two kept states per owned layer for each
  of up to `mode.warm_batches` batches;
all times ALLOCATOR, the share the allocator keeps of freed memory
(lptrain keeps freed blocks up to 256 MB for speed: context.keep_freed_memory).
The coefficients are measured (BENCHMARKS.md, "Memory per rank").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

BASE = 330e6            # bytes: an lptrain rank before its data (torch, MPI, Python)
STATE_COPIES = {"serial": 3.0, "mgrit": 5.0, "simultaneous": 5.0}
STATE_EXTRA = 12.0      # state-sized temporaries (conv steps: unfolded inputs)
ALLOCATOR = 1.3


@dataclass(frozen=True)
class Need:
    """One rank's estimated bytes, by part."""

    base: float
    params: float
    data: float
    states: float
    warm: float

    @property
    def total(self) -> float:
        return ALLOCATOR * (self.params + self.data + self.states + self.warm) + self.base

    def __str__(self) -> str:
        return (f"{gb(self.total)} (states {gb(self.states)}, warm starts {gb(self.warm)}, "
                f"parameters {gb(self.params)}, data {gb(self.data)})")


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.3g} GB"


def estimate(mode: str, n_layers: int, layer_ranks: int, batch: int, state_elements: int,
             n_params: int, item_bytes: int, data_bytes: float, vectors: int,
             warm_batches: int = 0) -> Need:
    """Bytes one rank needs: batch = its samples per evaluation (its shard of the batch),
    vectors = θ-sized vectors the optimizer keeps, warm_batches = mini-batches whose
    states are kept (simultaneous)."""
    own = math.ceil(n_layers / layer_ranks) + 1 if mode != "serial" else n_layers + 1
    state = batch * state_elements * item_bytes
    states = state * (STATE_COPIES[mode] * own + STATE_EXTRA)
    warm = 2 * own * state * warm_batches
    return Need(BASE, vectors * n_params * item_bytes, data_bytes, states, warm)


def available(local_size: int, meminfo: Path = Path("/proc/meminfo"),
              cgroup: Path = Path("/sys/fs/cgroup")) -> float:
    """Bytes this rank may still use: the node's available memory (and the cgroup's
    room, if limited) shared by its `local_size` ranks, plus what it already holds."""
    free = _meminfo(meminfo).get("MemAvailable", math.inf)
    limit, used = _read_int(cgroup / "memory.max"), _read_int(cgroup / "memory.current")
    if limit is not None and used is not None:
        free = min(free, limit - used)
    return free / max(local_size, 1) + resident()


def resident(status: Path = Path("/proc/self/status")) -> float:
    """Resident bytes of this process (0 where /proc is absent)."""
    return _meminfo(status).get("VmRSS", 0.0)


def _meminfo(path: Path) -> dict[str, float]:
    """`Key: value kB` lines as bytes."""
    out = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = float(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
