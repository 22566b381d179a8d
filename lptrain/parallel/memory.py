"""Memory a rank will need (estimated from the config and data sizes) and memory it may use.

The estimate counts what grows with the run, per rank, in bytes:

- the process itself (Python, torch, MPI, Hydra, h5py): BASE;
- θ and the vectors of its size the optimizer keeps (L-BFGS: 2·memory pairs);
- the data: the rank's shard in the run's dtype, plus the whole source as the
  loader reads it before the shard is cut (float64, twice);
- the states of the batch shard b on the rank's layers: `STATE_COPIES`
  state tensors per owned layer (MGRIT's two forward and two adjoint
  buffers, saved activations; serial: states, activations, adjoint),
  `COARSE_COPIES` per owned step of the coarse levels (their buffers, FAS
  right-hand sides and linearisations: a hierarchy coarsened by 2 holds about
  N coarse steps, by 4 about N/3) plus `STATE_EXTRA` per sample for step
  temporaries (a relaxation's over all intervals; fewer in serial);
- the validation pass, in chunks of at most the batch shard: every mode sweeps
  all N layers serially over its layer rank's share of a chunk and keeps the
  sweep's states, `VAL_COPIES` per layer;
- simultaneous with mini-batches: `WARM_COPIES` states per owned level-0
  C-point for each of up to `mode.warm_batches` batches (the forward and adjoint
  warm starts keep only their C-point rows, train/oneshot.py);
- simultaneous with calibration (mgrit.calibrate_every): a layer-serial
  evaluation of the rank's share of the batch, `STATE_COPIES["serial"]`
  states per layer of all N;
- checkpoints: a rank's oracle state holds 2 states per owned C-point and kept
  batch (compact warm starts, train/warm.py), copied out of the solver's buffers
  in a full-batch run; on more than one rank rank 0 also receives the ranks'
  states one at a time, `CHECKPOINT_COPIES` copies of one rank's (its pickled
  message, the tensors, and what writing them holds), counted on every rank alike.
The coefficients are fitted to measured peaks (BENCHMARKS.md, "Memory per
rank"), what the allocator keeps of freed memory included.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from lptrain.modes import MGRIT, SERIAL, SIMULTANEOUS

BASE = 400e6            # bytes: peak of an lptrain rank on a tiny problem
STATE_COPIES = {SERIAL: 2.5, MGRIT: 5.15, SIMULTANEOUS: 5.15}
COARSE_COPIES = 6.2     # per owned coarse step (MGRIT modes)
# state-sized temporaries per sample, whatever the layers (an MGRIT relaxation's steps over
# all intervals at once; serial's fitted with its 2.5 per layer to peaks of N = 1 to 30,
# BENCHMARKS "Serial runs")
STATE_EXTRA = {SERIAL: 30.0, MGRIT: 42.0, SIMULTANEOUS: 42.0}
VAL_COPIES = 1.0       # per layer and sample of a validation sweep
WARM_COPIES = 2.0       # per owned C-point and kept batch (measured; 2 are the states)
CHECKPOINT_COPIES = 3.0  # of a rank's oracle state (rank 0 at a checkpoint, measured)


@dataclass(frozen=True)
class Need:
    """One rank's estimated bytes, by part."""

    base: float
    params: float
    data: float
    states: float
    warm: float
    checkpoint: float = 0.0

    @property
    def total(self) -> float:
        return self.base + self.params + self.data + self.states + self.warm + self.checkpoint

    def __str__(self) -> str:
        return (f"{gb(self.total)} (states {gb(self.states)}, warm starts {gb(self.warm)}, "
                f"checkpoint {gb(self.checkpoint)}, parameters {gb(self.params)}, "
                f"data {gb(self.data)})")


def gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.3g} GB"


def estimate(mode: str, n_layers: int, layer_ranks: int, batch: int, state_elements: int,
             n_params: int, item_bytes: int, data_bytes: float, vectors: int,
             warm_batches: int = 0, val_chunk: int = 0, ranks: int = 1,
             calibrated: bool = False, intervals: int | None = None,
             coarse: int = 0) -> Need:
    """Bytes one rank needs: batch = its samples per evaluation (its shard of the batch),
    vectors = θ-sized vectors the optimizer keeps, warm_batches = mini-batches whose
    states are kept (simultaneous), val_chunk = validation samples per pass, ranks =
    all ranks of the run, calibrated = simultaneous also evaluates layer-serially on
    its share of the batch (mgrit.calibrate_every, train/calibrate.py), intervals =
    C-intervals of MGRIT's finest level (parallel.grid.c_intervals; None: n_layers),
    coarse = steps of MGRIT's coarse levels (parallel.grid.coarse_steps)."""
    own = math.ceil(n_layers / layer_ranks) + 1 if mode != SERIAL else n_layers + 1
    own_c = math.ceil((intervals or n_layers) / layer_ranks) + 1
    state = batch * state_elements * item_bytes
    val = math.ceil(val_chunk / layer_ranks) * state_elements * item_bytes * VAL_COPIES \
        * (n_layers + 1)
    own_coarse = 0 if mode == SERIAL else math.ceil(coarse / layer_ranks)
    states = state * (STATE_COPIES[mode] * own + COARSE_COPIES * own_coarse
                      + STATE_EXTRA[mode]) \
        + val
    if calibrated:      # all layers, the batch split over the layer ranks
        states += STATE_COPIES[SERIAL] * (n_layers + 1) * math.ceil(state / layer_ranks)
    warm = WARM_COPIES * own_c * state * warm_batches
    oracle_state = 0 if mode == SERIAL else 2 * own_c * max(warm_batches, 1) * state
    copied = 0 if warm_batches else oracle_state    # full batch: out of the buffers
    checkpoint = copied + (CHECKPOINT_COPIES * oracle_state if ranks > 1 else 0.0)
    return Need(BASE, vectors * n_params * item_bytes, data_bytes, states, warm, checkpoint)


UNLIMITED = 2 ** 60      # cgroup v1 writes "no limit" as a number near 2**63
# cgroup version -> (controller directory under the mount, limit file, usage file, the
# memory.stat key of the file pages the kernel reclaims before the limit bites)
_CGROUP_FILES = {1: ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
                     "total_inactive_file"),
                 2: ("", "memory.max", "memory.current", "inactive_file")}


def available(local_size: int, meminfo: Path = Path("/proc/meminfo"),
              cgroup: Path = Path("/sys/fs/cgroup"),
              own: Path = Path("/proc/self/cgroup")) -> float:
    """Bytes this rank may still use: the node's available memory, and the room its
    memory cgroup and their ancestors leave (v1 or v2; a batch system's job limit),
    shared by its `local_size` ranks, plus what it already holds."""
    free = min(_meminfo(meminfo).get("MemAvailable", math.inf), cgroup_room(cgroup, own))
    return free / max(local_size, 1) + resident()


def cgroup_room(mount: Path, own: Path) -> float:
    """The least room (limit − usage, less the inactive file pages in the usage, which
    the kernel reclaims first: a job that read its data sits near its limit in page
    cache) of this process's memory cgroups and their ancestors, as `own`
    (/proc/self/cgroup) names them under `mount`; inf where none is limited. Without
    `own` (no /proc): the mount's own files, as cgroup v2 at /."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        lines = ["0::/"]
    rooms = [math.inf]
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        version = 2 if controllers == "" else 1 if "memory" in controllers.split(",") \
            else None
        if version is None:
            continue
        sub, limit_file, usage_file, reclaimable = _CGROUP_FILES[version]
        top = mount / sub
        if version == 2 and not (top / "cgroup.controllers").exists() and \
                (mount / "unified").is_dir():
            top = mount / "unified"          # a hybrid host mounts v2 there
        here = top / path.strip("/")
        for d in (here, *here.parents):
            limit, used = _read_int(d / limit_file), _read_int(d / usage_file)
            if limit is not None and used is not None and limit < UNLIMITED:
                cache = _meminfo(d / "memory.stat", sep=" ").get(reclaimable, 0.0)
                rooms.append(limit - used + min(cache, used))
            if d == top:
                break
    return min(rooms)


def resident(status: Path = Path("/proc/self/status")) -> float:
    """Resident bytes of this process (0 where /proc is absent)."""
    return _meminfo(status).get("VmRSS", 0.0)


def _meminfo(path: Path, sep: str = ":") -> dict[str, float]:
    """`Key: value kB` lines (or, with sep " ", memory.stat's `key value`) as bytes."""
    out = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        key, _, rest = line.partition(sep)
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
