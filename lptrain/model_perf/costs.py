"""Seconds of each recorded kernel on this machine, measured once per configuration and host.

A kernel call on b samples costs o + (t − o)·(b − 1)/(B − 1), from its measured time o
on one sample and t on the full batch B: the per-call part does not shrink with a
shard, the rest does.  Each is measured alone and with `host_ranks` − 1 copies of the
process running it beside it (measure.py); k ranks on one host cost the alone figure
plus (k − 1)/(host_ranks − 1) of the difference.  Measurements are kept in a JSON
file per host and configuration under the cache directory ($LPTRAIN_CACHE, else
$XDG_CACHE_HOME/lptrain, else ~/.cache/lptrain), so the automatic grid of later runs
decides on them without measuring again; `lptrain-model --fresh` measures anew.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from lptrain.errors import counted, reason
from lptrain.model_perf.record import Glue

# kernel families of the costs one can give `lptrain-model` instead of measuring
STEP_KERNELS = ("apply", "apply_save", "apply_plus", "apply_save_plus", "linearize")
ADJOINT_KERNELS = ("vjp_saved", "vjp_and_g", "vjp_from_g")
WEIGHT_KERNELS = ("vjp_weights",)
# the serial sweeps (one kernel of N layers in the record): each layer's kernels
SWEEP_LAYER_KERNELS = {"serial_forward": ("apply_save",), "serial_forward_nosave": ("apply",),
                       "serial_adjoint": ("vjp_from_g", "vjp_weights")}


def shared_weight(ranks: int, host_ranks: int) -> float:
    """How far from its alone cost toward the one measured with host_ranks at once a
    rank's cost is on P = ranks: linear in the min(P, host_ranks) − 1 others beside it."""
    return (min(ranks, host_ranks) - 1) / (host_ranks - 1) if host_ranks > 1 else 0.0


@dataclass
class KernelCosts:
    """Seconds of one call of (kernel, states) on one sample and on `batch` samples,
    alone and (shared_one, shared_full) beside host_ranks − 1 others running it."""

    batch: int
    one: dict = field(default_factory=dict)    # (name, states) -> seconds at 1 sample
    full: dict = field(default_factory=dict)   # (name, states) -> seconds at `batch`
    given: tuple | None = None   # (step, adjoint, weights, overhead): costs not measured
    glue: bool = True            # charge the time a record took outside its kernels
    host_ranks: int = 1          # ranks on a host when the shared costs were measured
    shared_one: dict = field(default_factory=dict)
    shared_full: dict = field(default_factory=dict)
    load: float = 0.0            # the host's load average before they were timed: others'

    def missing(self, kernels, shared: bool | None = None) -> set:
        """The kernels of `kernels` ((name, states) pairs) without a cost, or (shared;
        default: whether these costs have host_ranks > 1) without a shared one."""
        if self.given:
            return set()
        shared = self.host_ranks > 1 if shared is None else shared
        return {k for k in kernels if k not in self.full or
                (shared and k not in self.shared_full)}

    def on_host(self, ranks: int) -> "KernelCosts":
        """The costs of a rank with min(ranks, host_ranks) ranks on its host (interpolated
        linearly between alone and the shared measurement)."""
        if self.given or min(ranks, self.host_ranks) <= 1:
            return self.alone()
        w = shared_weight(ranks, self.host_ranks)

        def blend(alone: dict, shared: dict) -> dict:   # a kept kernel that another
            # question measured alone only (missing() measures those asked for) stays so;
            # beside others a call costs no less than alone (a lower shared time is the
            # noise of a loaded host, and would predict more than P times on P ranks)
            return {key: t + w * (max(shared.get(key, t), t) - t) for key, t in alone.items()}
        return replace(self.alone(), one=blend(self.one, self.shared_one),
                       full=blend(self.full, self.shared_full))

    def alone(self) -> "KernelCosts":
        """These costs without the shared ones (a rank alone on its host)."""
        return replace(self, host_ranks=1, shared_one={}, shared_full={})

    def call(self, name: str, states: int, b: float) -> float:
        """Seconds of one call of `name` on `states` states of b samples each (alone)."""
        if self.given:
            return states * self._given(name, b)
        key = (name, states)
        if key not in self.full:
            raise KeyError(f"kernel {name} on {states} state(s): not measured")
        o, t = self.one[key], self.full[key]
        if self.batch <= 1:
            return t
        return max(o + (t - o) * (b - 1) / (self.batch - 1), 0.0)

    def _given(self, name: str, b: float) -> float:
        if name in SWEEP_LAYER_KERNELS:      # per layer of the sweep
            return sum(self._given(part, b) for part in SWEEP_LAYER_KERNELS[name])
        step, adjoint, weights, o = self.given
        t = step if name in STEP_KERNELS else adjoint if name in ADJOINT_KERNELS \
            else weights if name in WEIGHT_KERNELS else 0.0
        o = min(o, t)
        return o + (t - o) * b / self.batch

    def seconds(self, b: float):
        """op → seconds, for simulate(): kernels on shards of b samples, and the
        record's glue (not with given costs, which stand for everything)."""
        def cost(op) -> float:
            if isinstance(op, Glue):
                return op.seconds if self.glue and not self.given else 0.0
            return op.calls * self.call(op.name, op.states, b)
        return cost


def given_costs(batch: int, step: float, adjoint: float, weights: float,
                overhead: float = 0.0) -> KernelCosts:
    """Costs from numbers given per layer step of the full batch (forward, adjoint
    VJP, weight product); opening, classifier, regulariser and glue cost nothing."""
    return KernelCosts(batch, given=(step, adjoint, weights, overhead))


# MGRIT options the model's times do not depend on: its records stop solves after the
# counted cycles (no tolerance) and run one-shot with the fixed plan (record.py); the
# iteration limits are not among them: they cap the cycles (record.solve_cycles)
MODEL_BLIND = ("tol", "rtol", "adj_tol", "control", "grad_tol", "control_min_iters",
               "control_max_iters", "calibrate_every", "adaptive", "adaptive_ratio",
               "adaptive_max_extra")


def model_mgrit(mgrit) -> dict:
    """The MGRIT options a configuration's times depend on (kept times' key): a sweep
    over mgrit.grad_tol had timed this host's kernels again for every value. Of the
    tolerances only whether there is one: mode=mgrit's solves without run max_iter."""
    return {**{k: v for k, v in asdict(mgrit).items() if k not in MODEL_BLIND},
            "fixed": list(mgrit.fixed_solves)}


def cache_dir() -> Path:
    """Where measured costs are kept (see the module docstring)."""
    if os.environ.get("LPTRAIN_CACHE"):
        return Path(os.environ["LPTRAIN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lptrain"


def cache_file(config: dict, kind: str = "kernel_costs") -> Path:
    """The file of this host and cost-relevant configuration (`config`: JSON-able) in the
    cache's folder `kind` (kernel_costs, grid_times, optimizer_costs)."""
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    return cache_dir() / kind / f"{socket.gethostname()}-{digest.hexdigest()[:16]}.json"


def load(path: Path, batch: int) -> KernelCosts:
    """The costs kept in `path`, shared ones with the host_ranks they were measured with
    (empty ones when there is none or it is unreadable)."""
    try:
        kept = json.loads(path.read_text())
        costs = KernelCosts(batch, host_ranks=int(kept.get("host_ranks", 1)),
                            load=float(kept.get("load", 0.0)))
        for name, states, one, full, *shared in kept["kernels"]:
            costs.one[(name, int(states))] = float(one)
            costs.full[(name, int(states))] = float(full)
            if shared:
                costs.shared_one[(name, int(states))] = float(shared[0])
                costs.shared_full[(name, int(states))] = float(shared[1])
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return KernelCosts(batch)
    return costs


def save(path: Path, costs: KernelCosts, config: dict) -> str | None:
    """Keep `costs` in `path` (see keep_json: why not, else None)."""
    rows = [[name, states, costs.one[(name, states)], t,
             *([costs.shared_one[(name, states)], costs.shared_full[(name, states)]]
               if (name, states) in costs.shared_full else [])]
            for (name, states), t in sorted(costs.full.items())]
    return keep_json(path, {"config": config, "batch": costs.batch,
                            "host_ranks": costs.host_ranks, "load": costs.load,
                            "kernels": rows})


def keep_json(path: Path, payload: dict) -> str | None:
    """Write `payload` to a cache file whole, then rename it (readers never see a part);
    a cache that cannot be written is skipped (returns why, else None), and no part is
    left behind (a signal part-way included)."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(payload, default=str))
        tmp.replace(path)
    except OSError as exc:     # the file named where it is the fault (a folder there)
        where = path if exc.filename in (str(path), str(tmp)) else cache_dir()
        return f"{where} cannot be written: {reason(exc)}"
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def cost_config(net, batch: int, dtype: str, device: str, threads: int) -> dict:
    """What a kernel's cost depends on: the network, the batch, dtype, device, threads,
    and how it is measured (`inputs`: measure.py's pools; costs kept under another
    rule are measured anew)."""
    import torch
    return {"network": asdict(net.opts), "in_shape": list(net.in_shape),
            "classes": net.n_classes, "batch": batch, "dtype": dtype, "device": device,
            "threads": threads, "torch": torch.__version__, "inputs": "cache-sized pools"}


def measured(net, theta, batch: int, kernels, device: str, threads: int, fresh: bool = False,
             host_ranks: int = 1, progress=None) -> tuple[KernelCosts, str]:
    """(costs of `kernels` on this host, alone and beside host_ranks − 1 neighbours, where
    they came from): kept ones, the missing measured now and kept (all with fresh).
    With host_ranks 1 the kept file's shared costs stay in it, unused. `progress` (a
    callable) hears, before any is timed, how many are, and after each round of timing
    them how far it is."""
    from lptrain.model_perf.measure import measure_kernels
    host_ranks = 1 if str(device).startswith("cuda") else host_ranks
    config = cost_config(net, batch, str(theta.dtype).removeprefix("torch."), device, threads)
    path = cache_file(config)
    costs = KernelCosts(batch) if fresh else load(path, batch)
    if host_ranks > 1 and costs.host_ranks != host_ranks:   # kept beside another count
        costs = replace(costs.alone(), host_ranks=host_ranks)
    todo = costs.missing(kernels, shared=host_ranks > 1)
    if todo and progress is not None:        # one line: minutes may follow
        progress(f"timing {counted(len(todo), 'kernel')} on this host (once; kept for "
                 f"later runs)")
    if todo:
        costs.load = max(costs.load, os.getloadavg()[0])    # the highest of those kept
        alone, shared = measure_kernels(net, theta, batch, todo, device, host_ranks - 1,
                                        progress)
        for name, states in todo:
            costs.one[(name, states)] = alone[(name, states, 1)]
            costs.full[(name, states)] = alone[(name, states, batch)]
            if shared:
                costs.shared_one[(name, states)] = shared[(name, states, 1)]
                costs.shared_full[(name, states)] = shared[(name, states, batch)]
        unkept = save(path, costs, config)
    beside = f", alone and {host_ranks} at once" if host_ranks > 1 else ""
    note = f"measured now on {socket.gethostname()}{beside}" if todo else \
        f"measured earlier on {socket.gethostname()}{beside} ({path})"
    if todo and unkept:
        note += f" (not kept: {unkept})"
    if host_ranks == 1:
        costs = costs.alone()
    return costs, note

