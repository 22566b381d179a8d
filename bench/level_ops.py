"""Reference against fused MGRIT level operations on the configurations users run.

    .venv/bin/python bench/level_ops.py [--rounds 2] [--only default-sim ...]

Each configuration trains once with `mgrit.level_ops=plain` and once with `fused`, one
rank, one thread, alternating, `--rounds` times; prints Σ train/step_time and the final
objective of each run (BENCHMARKS.md, "The solver as level operations").
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from lptrain.metrics.reader import read_metrics

CONFIGS = {
    "default-sim": ["mode=simultaneous", "train.iterations=100"],
    "default-mgrit": ["mode=mgrit", "train.iterations=50"],
    "peaks_paper-sim": ["experiment=peaks_paper", "mode=simultaneous"],
    "ip_paper-sim": ["experiment=indian_pines_paper", "mode=simultaneous",
                     "train.iterations=10"],
    "mnist_paper-sim": ["experiment=mnist_paper", "mode=simultaneous", "train.iterations=3",
                        "dataset.n_train=500", "dataset.n_val=100"],
}


def train(run_dir: Path, args: list[str]) -> tuple[float, float]:
    """(Σ step_time, final objective) of one lptrain run."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "lptrain", f"hydra.run.dir={run_dir}", *args],
                   check=True, env=env, capture_output=True, timeout=1800)
    m = read_metrics(run_dir / "metrics.h5")
    return float(m.train["step_time"].sum()), float(m.train["objective"][-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--only", nargs="*", choices=sorted(CONFIGS), default=sorted(CONFIGS))
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(a.rounds):
            for name in a.only:
                for ops in ("plain", "fused"):
                    seconds, objective = train(Path(tmp) / f"{name}-{ops}-{k}",
                                               [f"mgrit.level_ops={ops}", *CONFIGS[name]])
                    print(f"{name} {ops}: step_time {seconds:.2f} s, J {objective:.10f}",
                          flush=True)


if __name__ == "__main__":
    main()
