"""Wall time to a target quality: serial vs mgrit vs simultaneous, measured and predicted.

    .venv/bin/python bench/time_to_quality.py [--iterations 60] [--n-train 1000]
        [--ranks 1 2] [--out bench/results/time_to_quality]

Trains `experiment=peaks_deep` (N = 1024, width 8) in the three modes on each
rank count with `lptrain` (under the venv's mpiexec for P > 1) and reads the
runs' metrics.h5.  Targets, from the serial run on one rank: training
objective ≤ 1.1 × its final objective, validation accuracy ≥ its final one
− 0.02 (validation is always exact: the MGRIT modes validate with converged
solves).  For each run: iterations and wall time to each target.  Then
`lptrain-model` (step costs measured now, the runs' measured counts) predicts
seconds per iteration at P = 16 … 256; predicted time to target = iterations to
target on one rank × predicted seconds per iteration.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from common import yield_env

from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics
from lptrain.model_perf import cli as model_cli
from lptrain.model_perf import options as model_options
from lptrain.model_perf.kept_glue import kept_for
from lptrain.modes import MODES

BIN = Path(sys.executable).parent
PREDICT_RANKS = (16, 32, 64, 128, 256)


def train(mode: str, ranks: int, overrides: list[str], out: Path) -> Path:
    run_dir = out / f"{mode}-p{ranks}"
    launch = [str(BIN / "mpiexec"), "-n", str(ranks)] if ranks > 1 else []
    cmd = ["timeout", "3600", *launch, str(BIN / "lptrain"), f"mode={mode}", *overrides,
           f"hydra.run.dir={run_dir}"]
    env = yield_env(ranks)
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return run_dir


def first_reaching(values, times, iterations, ok):
    """(iteration, seconds) of the first entry with ok(value), else (None, None)."""
    for v, t, k in zip(values, times, iterations):
        if ok(v):
            return int(k), float(t)
    return None, None


def reach(m, j_target: float, a_target: float) -> dict:
    wall = dict(zip(m.train[ms.ITERATION].tolist(), m.train[ms.WALL_TIME].tolist()))
    wall[0] = 0.0
    kj, tj = first_reaching(m.train[ms.OBJECTIVE], m.train[ms.WALL_TIME],
                            m.train[ms.ITERATION], lambda v: v <= j_target)
    val_it = m.validation[ms.ITERATION]
    ka, ta = first_reaching(m.validation[ms.ACCURACY], [wall[int(k)] for k in val_it], val_it,
                            lambda v: v >= a_target)
    return dict(j_it=kj, j_s=tj, a_it=ka, a_s=ta,
                s_per_it=float(np.mean(m.train[ms.STEP_TIME][1:])))


def predictions(overrides: list[str], dirs: list[Path]) -> dict:
    """mode -> {P: predicted seconds per optimizer iteration} from lptrain-model."""
    args = model_options.parser().parse_args([*overrides, "--measured", *map(str, dirs)])
    the_link, _, _ = model_cli.link(args)
    opts, _ = model_cli.compose(args.overrides)
    net, theta, batch = model_cli.build_network(opts)
    model = model_cli.make_model(opts, net, theta, batch)
    # the records' glue kept with the kernel costs, as lptrain-model keeps it
    model.glue = kept_for(model, opts.device, torch.get_num_threads())
    cnt, _ = model_cli.counts(args, model_cli.load_runs(args.measured))
    m, _ = model_cli.machine(args, model, theta, opts.device, the_link,
                             lambda probe: model.predict_all(PREDICT_RANKS, probe, cnt))
    preds = model.predict_all(PREDICT_RANKS, m, cnt)
    model.glue.save()
    return {"serial": {p.ranks: p.serial for p in preds},
            "mgrit": {p.ranks: p.mgrit for p in preds},
            "simultaneous": {p.ranks: p.simultaneous for p in preds}}


def _f(x, fmt="{:.1f}"):
    return "-" if x is None else fmt.format(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--n-train", type=int, default=1000)
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    p.add_argument("--out", type=Path, default=Path("bench/results/time_to_quality"))
    a = p.parse_args()
    over = ["experiment=peaks_deep", f"train.iterations={a.iterations}", "eval_every=5",
            f"dataset.n_train={a.n_train}", "train.patience=0"]
    runs = {(mode, P): train(mode, P, over, a.out) for P in a.ranks for mode in MODES}
    ref = read_metrics(runs[("serial", a.ranks[0])] / ms.FILE_NAME)
    j_target = 1.1 * float(ref.train[ms.OBJECTIVE][-1])
    a_target = float(ref.validation[ms.ACCURACY][-1]) - 0.02
    lines = [f"Targets (serial, P = {a.ranks[0]}): objective ≤ {j_target:.4f}, validation "
             f"accuracy ≥ {a_target:.3f}.\n",
             "| mode | P | s / iteration | iterations to J | s to J | iterations to val "
             "| s to val |", "|---|---:|---:|---:|---:|---:|---:|"]
    reached = {}
    for (mode, P), d in runs.items():
        r = reach(read_metrics(d / ms.FILE_NAME), j_target, a_target)
        reached[(mode, P)] = r
        lines.append(f"| {mode} | {P} | {r['s_per_it']:.3f} | {_f(r['j_it'], '{}')} "
                     f"| {_f(r['j_s'])} | {_f(r['a_it'], '{}')} | {_f(r['a_s'])} |")
    pred = predictions(over, list(runs.values()))
    lines += ["", "Predicted (lptrain-model) seconds to the objective target: iterations "
              "to target on one rank × predicted seconds per iteration.", "",
              "| P | " + " | ".join(MODES) + " |", "|---:|" + "---:|" * len(MODES)]
    for P in PREDICT_RANKS:
        cells = []
        for mode in MODES:
            its, s = reached[(mode, a.ranks[0])]["j_it"], pred[mode][P]
            cells.append("-" if its is None or s is None else f"{its * s:.1f}")
        lines.append(f"| {P} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "time_to_quality.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
