"""What the speedup model records and prints, made deterministic, for a before/after diff.

    PYTHONPATH=TREE python bench/model_identity.py OUT

writes into OUT, for the default configuration and the three *_paper experiments
(Indian Pines and MNIST on a few samples), `lptrain-model`'s report with
mode=mgrit and mode=simultaneous at P = 1, 2, 4, 8, once with given costs and
once with made-up "measured" ones (the kernels by name), and every recorded
schedule (serial, mgrit, simultaneous on 1, 2, 4 layer ranks, 1 and 2 data
groups, two cycle counts).  The records' glue is CPU time, which no two runs
share: the reports are made with the glue clock held at zero, the schedules show
where glue falls but not how much.  Run it on two trees (an old one from `git
worktree add`) and `diff -r` the two OUT folders.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import time
from pathlib import Path

CONFIGS = [[], ["experiment=peaks_paper"],
           ["experiment=indian_pines_paper", "dataset.n_train=400"],
           ["experiment=mnist_paper", "dataset.n_train=60"]]
GIVEN = ["--step-time", "1e-3", "--adjoint-time", "2e-3", "--weight-time", "5e-4",
         "--overhead", "1e-4"]
# costs alone: made-up costs have no shared part, and the reports stay comparable
LINK = ["--latency", "1e-5", "--bandwidth", "1e9", "--ranks", "1,2,4,8", "--host-ranks", "1"]


def made_up(net, theta, batch, kernels, device, neighbours=0, progress=None):
    """Distinct costs per kernel name and states, in place of measuring them (alone;
    no shared ones)."""
    names = sorted({n for n, _ in kernels})
    return {(name, m, b): 1e-5 * (1 + names.index(name)) * m ** 0.9 * (1 + b / 7)
            for name, m in kernels for b in (1, batch)}, {}


def reports(out: Path, scratch: Path) -> None:
    from lptrain.model_perf import cli
    clock = time.thread_time
    for over in CONFIGS:
        for mode in ("mgrit", "simultaneous"):
            for kind, extra in (("given", GIVEN), ("measured", [])):
                name = "_".join([*over, mode, kind]).replace("=", "-")
                run = scratch / name
                time.thread_time = lambda: 0.0
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        rc = cli.main([*over, f"mode={mode}", *extra, *LINK, "--out",
                                       str(run)])
                finally:
                    time.thread_time = clock
                text = (run / "speedup_model.md").read_text() if rc == 0 else ""
                text = text.replace(os.environ["LPTRAIN_CACHE"], "CACHE")
                (out / f"model_{name}.md").write_text(f"exit {rc}\n{text}")


def schedules(out: Path) -> None:
    from lptrain.model_perf import cli
    from lptrain.model_perf import record as rec
    for over in CONFIGS:
        opts, _ = cli.compose(over)
        net, theta, batch = cli.build_network(opts)
        model = cli.make_model(opts, net, theta, batch)
        lines = []
        for mode in ("serial", "mgrit", "simultaneous"):
            for layer in (1, 2, 4):
                if layer > model.max_layer or (mode == "serial" and layer > 1):
                    continue
                for data in (1, 2):
                    for fwd, adj in ((1, 1), (2, 3)):
                        r = rec.record_iteration(net, mode, opts.mgrit, layer, data, fwd,
                                                 adj, False, theta.dtype, min(batch, 8))
                        lines.append(f"## {mode} L={layer} D={data} fwd={fwd} adj={adj}")
                        lines += [f"{part} rank {rank}: " + " ".join(
                            "Glue" if isinstance(op, rec.Glue) else repr(op) for op in ops)
                            for part in ("value", "gradient")
                            for rank, ops in enumerate(getattr(r, part))]
        name = "_".join(over).replace("=", "-") or "default"
        (out / f"records_{name}.txt").write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    out = p.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    import torch

    import lptrain.model_perf.measure as measure
    torch.set_num_threads(1)
    measure.measure_kernels = made_up
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["LPTRAIN_CACHE"] = str(Path(scratch) / "cache")
        reports(out, Path(scratch))
    schedules(out)


if __name__ == "__main__":
    main()
