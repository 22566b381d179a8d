"""The one-shot oracle's warm-start stores on mini-batches, rewritten in place against new
blocks at every store (train/warm.py): CPU time per batch's forward and adjoint store.

    OMP_NUM_THREADS=1 .venv/bin/python bench/warm_stores.py [--rounds 3]

The blocks are the default MNIST recipe's (the C-point rows 0, 4, .., 32 of 33 rows of
100 × 8 × 28 × 28 float32 states), 48 batches kept, 3 epochs after the first.
"""
import argparse
import time
import types

import torch

from lptrain.mgrit.solver import MGRIT
from lptrain.parallel.context import keep_freed_memory
from lptrain.train.warm import WarmCache


class _Solver:
    """What WarmCache asks of a solver: its C-point rows and their compact copy."""

    c_rows = tuple(range(0, 33, 4))
    c_point_states = MGRIT.c_point_states


class Fresh(WarmCache):
    """Every compact copy in a new block (before stop 66)."""

    def _block(self, kept):
        return None


def per_batch(cls, states, batches: int = 48, epochs: int = 3) -> float:
    lp = types.SimpleNamespace(fwd=_Solver(), adj=_Solver())
    cache = cls(64, lp, keep_compact=True)
    for key in range(batches):
        cache.store(key, states[0], states[1])
    t0 = time.process_time()
    for epoch in range(epochs):
        for key in range(batches):
            cache.store(key, fwd=states[epoch % 2])
            cache.store(key, adj=states[(epoch + 1) % 2])
    return (time.process_time() - t0) / (epochs * batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    keep_freed_memory()          # as the lptrain command runs
    torch.set_num_threads(1)
    states = [torch.randn(33, 100, 8, 28, 28) for _ in range(2)]
    for r in range(args.rounds):
        for cls in (WarmCache, Fresh):
            print(f"round {r + 1}: {cls.__name__:10s} "
                  f"{per_batch(cls, states) * 1e3:.2f} ms per batch")


if __name__ == "__main__":
    main()
