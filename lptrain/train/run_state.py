"""The run state a checkpoint carries (its record entry), as one dataclass with its file form.

`RunState.to_record()` is the dict that train/checkpoint.py writes as the
archive's `record.pt` (plain values and tensors: torch.load(weights_only=True)
reads it); `RunState.from_record()` reads it back, from every format lptrain
reads: format 2 (no grid recorded) and 3 (train/checkpoint.py refuses format
1).  Keys that older writers left
out read as their defaults (no best parameters, no stall rule, warm starts
kept, θ checked).  The ranks' oracle states are not part of it: they are entries of
their own (train/checkpoint.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from lptrain.parallel.grid import Grid

FORMAT = "lptrain-checkpoint"
FORMAT_VERSION = 4     # 1: one torch file with every rank's oracle state; 2: no grid;
#                        3: the L-BFGS pairs in the record (4: train/stored_pairs.py)


@dataclass(kw_only=True)
class LoopState:
    """The loop's part (train/loop.py): the latest validation (loss, accuracy) and its
    iteration, the best validation accuracy so far, the stall rule's state and the run's
    elapsed seconds."""

    val: tuple[float, float] = (math.nan, math.nan)
    val_iteration: int | None = None   # None: a checkpoint written before it was kept
    best: float = -math.inf
    wall_time: float = 0.0
    stall: dict | None = None         # None: a checkpoint written before the stall rule
    notes: dict | None = None         # what the console has said once (loop._Notes)

    def to_record(self, iteration: int) -> dict:
        return {"val": list(self.val), "val_iteration": self.val_iteration,
                "best": self.best, "stall": self.stall, "notes": self.notes,
                "wall_time": self.wall_time, "iteration": iteration}

    @classmethod
    def from_record(cls, record: dict) -> "LoopState":
        return cls(val=tuple(record.get("val", (math.nan, math.nan))),
                   val_iteration=record.get("val_iteration"),
                   best=record.get("best", -math.inf), wall_time=record["wall_time"],
                   stall=record.get("stall"), notes=record.get("notes"))


@dataclass(kw_only=True)
class RunState:
    """Everything a run needs to continue exactly where it stopped, but the ranks' oracle
    states (train/checkpoint.py writes those as entries of their own)."""

    iteration: int
    theta: torch.Tensor
    optimizer: dict                   # the optimizer's state_dict
    batches: dict                     # the mini-batch order (loop.Batches.state_dict)
    rng: torch.Tensor                 # torch's global RNG state
    first_objective: float | None     # the divergence rule's reference (guard.Progress)
    best: dict | None                 # the best validated parameters (Progress.best_state)
    loop: LoopState
    config: str                       # the resolved configuration, YAML
    world_size: int
    grid: Grid | None = None          # the layer × data grid (None before format 3)
    warm_starts: bool = True          # False: a lean checkpoint, warm starts left out
    pending: dict | None = None       # θ not yet checked: the last good (Progress.pending_state)
    signature: dict | None = None     # θ's names and shapes (ResNet.signature; None before)

    def handed_over(self) -> "RunState":
        """This state without the optimizer's, once restore() has given it to the run's
        optimizer: L-BFGS keeps only this rank's part of its pairs (train/shards.py),
        and the whole pairs, up to 2m parameter-sized vectors, would otherwise stay in
        memory for the rest of the run."""
        return replace(self, optimizer={})

    def to_record(self) -> dict:
        """The record entry of a checkpoint of the current format."""
        return {"format": FORMAT, "format_version": FORMAT_VERSION,
                "iteration": self.iteration, "theta": self.theta,
                "optimizer": self.optimizer, "world_size": self.world_size,
                "batches": self.batches, "rng": self.rng,
                "first_objective": self.first_objective, "best": self.best,
                "loop": self.loop.to_record(self.iteration), "config": self.config,
                "grid": None if self.grid is None else [self.grid.layer, self.grid.data],
                "warm_starts": self.warm_starts, "pending": self.pending,
                "signature": self.signature}

    @classmethod
    def from_record(cls, record: dict) -> "RunState":
        """The state of a record of any format (checked by model/saved.py check_record)."""
        grid = record.get("grid")
        return cls(iteration=record["iteration"], theta=record["theta"],
                   optimizer=record["optimizer"], batches=record["batches"],
                   rng=record["rng"], first_objective=record["first_objective"],
                   best=record.get("best"), loop=LoopState.from_record(record["loop"]),
                   config=record["config"], world_size=record["world_size"],
                   grid=None if grid is None else Grid(*grid),
                   warm_starts=record.get("warm_starts", True),
                   pending=record.get("pending"), signature=record.get("signature"))
