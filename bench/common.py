"""Shared pieces of the benchmarks: problem set-up, timing, result files."""
from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from lptrain.model.network import NetworkOptions, ResNet
from lptrain.parallel.context import keep_freed_memory

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import Counting, MemoryWriter  # noqa: E402,F401 (step counter, metrics rows)

RESULTS = Path(__file__).resolve().parent / "results"
# One intra-op thread per process (as lptrain uses per rank under mpiexec): small
# per-layer kernels gain little from more, and a busy core stalls a thread team badly.
torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
keep_freed_memory()     # as the lptrain command does


def network(layers: int, width: int = 8, features: int = 2, classes: int = 5,
            dtype=torch.float64, activation: str = "tanh"):
    """The benchmark network: dense, smooth weights (small N(0,1)·0.1 hidden)."""
    o = NetworkOptions(width=width, layers=layers, T=5.0, activation=activation,
                       init="normal", init_opening=1.0, init_hidden=0.1, init_classifier=0.1,
                       gamma_ddt=0.0)
    net = ResNet(o, (features,), classes)
    return net, net.init_params(0, dtype)


def data(batch: int, features: int = 2, classes: int = 5, dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, features, generator=gen, dtype=torch.float64).to(dtype)
    y = torch.randint(classes, (batch,), generator=gen)
    return x, y


def yield_env(ranks: int, env: dict | None = None) -> dict:
    """A copy of `env` (default os.environ) for an `mpiexec -n ranks` launch: MPICH's
    yielding waits only where the ranks outnumber the cores (README "Threads"). On free
    cores the yield costs: the default one-shot run on 2 ranks of this 2-core machine
    took 43.1-43.8 ms an iteration with it against 36.3-36.8 ms without (BENCHMARKS
    "Two ranks without yielding waits")."""
    env = dict(os.environ if env is None else env)
    env.pop("MPIR_CVAR_ENABLE_HEAVY_YIELD", None)
    if ranks > (os.cpu_count() or 1):
        env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = "1"
    return env


def mpi_env(ranks: int) -> dict:
    """yield_env with one thread per rank."""
    return yield_env(ranks, {**os.environ, "OMP_NUM_THREADS": "1"})


def timeit(fn, reps: int = 5, warmup: int = 1) -> float:
    """Median seconds of fn() over reps runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def save(name: str, payload: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    payload = {"machine": f"{platform.processor() or platform.machine()}, "
                          f"{torch.get_num_threads()} threads, torch {torch.__version__}",
               **payload}
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2))
    return path
