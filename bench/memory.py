"""Peak memory per rank of short lptrain runs against lptrain's own estimate (preflight).

    python bench/memory.py [--ranks P] [KEY=VALUE ...]

Runs `$LAUNCHER -n P lptrain KEY=VALUE ...` (LAUNCHER: mpiexec [default] or mpirun of
the venv; one rank: no launcher) with every rank
reporting its peak resident memory (getrusage) at exit, and prints the largest
per rank, the time per iteration, and the estimate the run's preflight makes for
the grid it chose.  Give parallel.layer_ranks explicitly to measure one grid.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from common import yield_env

BIN = Path(sys.executable).parent
WRAPPER = """
import atexit, os, resource, sys
def report():
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    sys.stderr.write(f"PEAK {os.environ.get('PMI_RANK', '0')} {peak}\\n")
atexit.register(report)
sys.argv = ["lptrain"] + sys.argv[1:]
from lptrain.cli import main
main()
"""


def measure(ranks: int, overrides: list[str], timeout: float) -> dict:
    """{'peaks': [bytes per rank], 'step': s per iteration, 'estimate': bytes, 'grid'}."""
    from lptrain.metrics.reader import read_metrics
    run_dir = Path(tempfile.mkdtemp(prefix="lptrain-memory-"))
    cmd = [sys.executable, "-c", WRAPPER, *overrides, f"hydra.run.dir={run_dir}"]
    if ranks > 1:
        cmd = [str(BIN / os.environ.get("LAUNCHER", "mpiexec")), "-n", str(ranks), *cmd]
    env = yield_env(ranks)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-2000:])
    peaks = [int(v) for _, v in re.findall(r"^PEAK (\d+) (\d+)$", proc.stderr, re.M)]
    m = read_metrics(run_dir / "metrics.h5")
    steps = m.train["step_time"][1:] if len(m.train["step_time"]) > 1 else m.train["step_time"]
    layer, data = int(m.attrs["layer_ranks"]), int(m.attrs["data_ranks"])
    return {"peaks": peaks, "step": float(sum(steps) / len(steps)),
            "grid": f"{layer}x{data}", "estimate": estimate(overrides, layer, data)}


def estimate(overrides: list[str], layer: int, data: int) -> float:
    from hydra import compose, initialize_config_dir

    from lptrain.app import options
    from lptrain.config.schema import register_configs
    from lptrain.data.base import dataset_sizes
    from lptrain.model.network import ResNet
    from lptrain.parallel.grid import Grid
    from lptrain.preflight import need
    register_configs()
    from lptrain.config import CONF_DIR as conf
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        opts = options(compose(config_name="config", overrides=overrides))
    sizes = dataset_sizes(opts.dataset)
    net = ResNet(opts.network, sizes.feature_shape, sizes.n_classes)
    return need(opts, sizes, net, Grid(layer, data)).total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--timeout", type=float, default=1200)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    r = measure(args.ranks, args.overrides, args.timeout)
    peak = max(r["peaks"])
    print(f"P={args.ranks} grid {r['grid']} {' '.join(args.overrides)}: peak per rank "
          f"{peak / 1e6:.0f} MB (min {min(r['peaks']) / 1e6:.0f}), estimate "
          f"{r['estimate'] / 1e6:.0f} MB ({r['estimate'] / peak:.2f}x), "
          f"{r['step']:.3g} s per iteration")


if __name__ == "__main__":
    main()
