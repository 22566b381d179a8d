"""A quality-matrix row's final iterates on a large held-out Peaks sample: is a gap in
validation accuracy on the configured 200 points the model or the sample?

    .venv/bin/python bench/held_out.py MODE [--held-out N] [--save FILE] [KEY=VALUE ...]

Trains MODE exactly as bench/simultaneous_quality.py does (same overrides, the parameters
of the configured last iteration), then evaluates them exactly (layer-serially) on the
configured validation set and on N further points drawn from the same grid with the
same seed (`dataset.n_val=N`: the validation draw follows the training draw, so the
training set is the same).  Prints the exact objective and both accuracies; --save keeps
the parameters (torch.save) for comparing modes later.
"""
from __future__ import annotations

import argparse

import torch

import simultaneous_quality as q
from lptrain.config import compose
from lptrain.data import load_dataset
from lptrain.mgrit.exchange import SerialExchange
from lptrain.train.objective import Objective
from lptrain.train.oracles import SerialOracle


def held_out_accuracy(r: dict, overrides: list[str], n: int) -> float:
    """Accuracy of run r's parameters on the n-point validation draw of its seed."""
    opts, _ = compose([*overrides, f"dataset.n_val={n}"])
    data = load_dataset(opts.dataset, opts.seed)
    exact = Objective(SerialOracle(r["net"], SerialExchange()), r["net"])
    x = data.x_val.to(r["theta"].dtype)        # the run's dtype (dtype=float32)
    return exact.validate(r["theta"], x, data.y_val)[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["serial", "simultaneous", "mgrit"])
    p.add_argument("--held-out", type=int, default=10000, metavar="N")
    p.add_argument("--save", help="file for the final parameters")
    p.add_argument("overrides", nargs="*")
    a = p.parse_intermixed_args()
    r = q.run(a.mode, a.overrides)
    big = held_out_accuracy(r, a.overrides, a.held_out)
    if a.save:
        torch.save({"theta": r["theta"], "overrides": a.overrides, "mode": a.mode}, a.save)
    print(f"{a.mode} {' '.join(a.overrides)}: J={r['objective']:.6g} "
          f"val={r['val']:.4f} val_last_fifth={r['val_window']:.4f} "
          f"held_out({a.held_out})={big:.4f} iterations={r['iterations']}")


if __name__ == "__main__":
    main()
