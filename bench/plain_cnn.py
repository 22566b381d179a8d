"""A plain PyTorch CNN against lptrain's image runs: same data, same wall time.

    .venv/bin/python bench/plain_cnn.py --dataset mnist --seconds 300 [--threads 2]
        [--params 33000] [--seed 0]

Loads the dataset exactly as `lptrain dataset=<name>` does (same split, same
pixel scaling), builds an ordinary two-convolution CNN (conv 3×3 → ReLU → pool,
twice, then a hidden dense layer sized so that the whole network has about
--params parameters) and trains it with Adam (lr 1e-3, batch 64, float32, the
usual choices of a PyTorch user) until --seconds of training time have passed,
evaluating the validation set after every epoch (evaluation time not counted).
Prints one line: epochs, parameters, final and best validation accuracy.  Use
the wall time of the lptrain run being compared (its summary's "wall time").
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from lptrain.config import compose
from lptrain.data.base import load_dataset


def plain_cnn(params: int, classes: int, side: int) -> nn.Sequential:
    """conv(1→8) pool conv(8→16) pool dense(hidden) dense(classes), ≈ `params` weights."""
    flat = 16 * (side // 4) ** 2
    convs = (1 * 9 + 1) * 8 + (8 * 9 + 1) * 16
    hidden = max(1, round((params - convs - classes) / (flat + 1 + classes)))
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(flat, hidden), nn.ReLU(),
                         nn.Linear(hidden, classes))


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        hits = sum(int((model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum())
                   for i in range(0, len(x), 1000))
    return hits / len(x)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--seconds", type=float, required=True, help="training time to spend")
    ap.add_argument("--params", type=int, default=33000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    opts, _ = compose([f"dataset={args.dataset}", f"seed={args.seed}"])
    data = load_dataset(opts.dataset, opts.seed)
    xt, yt = data.x_train.float(), data.y_train
    xv, yv = data.x_val.float(), data.y_val
    torch.manual_seed(args.seed)
    model = plain_cnn(args.params, data.n_classes, xt.shape[-1])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(args.seed)
    spent, epochs, best, last = 0.0, 0, 0.0, 0.0
    while spent < args.seconds:
        t0 = time.perf_counter()
        for idx in torch.randperm(len(xt), generator=gen).split(64):
            loss = nn.functional.cross_entropy(model(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            if spent + time.perf_counter() - t0 >= args.seconds:
                break
        spent += time.perf_counter() - t0
        epochs += 1
        last = accuracy(model, xv, yv)
        best = max(best, last)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"plain CNN {args.dataset}: {n_params} parameters, {spent:.0f} s, {epochs} epochs "
          f"(the last maybe partial), validation accuracy {last:.4f} (best {best:.4f})")


if __name__ == "__main__":
    main()
