"""Data groups of a layer × data grid: an oracle on this group's batch shard, summed over groups.

Each data group holds a contiguous shard of the data; a batch is a set of
global sample indices of which each group sees its own (possibly none).
The inner oracle (any mode, on the layer group's exchange) returns means
over its shard; they are weighted by shard / batch size and summed over
the groups, so the objective, hits and gradient are those of the whole
batch.  The regulariser, the same on every rank, is counted once.  A group
without samples skips its solves and contributes zeros to the sums; its inner
oracle still notes the batch (`skip`), so every group keeps warm starts of the
same batches as one rank would (and a checkpoint's blocks fit together).
"""
from __future__ import annotations

import torch

from lptrain.mgrit.exchange import allreduce_tensor
from lptrain.train.control import Measured
from lptrain.train.oracles import Batch, MGRITOracle, Point, SerialOracle, SolveStats, measured


class DataParallelOracle:
    """`inner` on this group's shard; loss, hits and gradient summed over `data`."""

    def __init__(self, inner, net, data):
        self.inner, self.net, self.data = inner, net, data
        self.empty = False
        self.controlled = isinstance(inner, MGRITOracle)
        if self.controlled:     # its error estimate needs the sums over all groups
            inner.external_control = True

    def record(self) -> dict | None:
        """The inner oracle's MGRIT record (an empty one where this group had no samples)."""
        row = self.inner.record() if not self.empty else None
        if self.empty and not isinstance(self.inner, SerialOracle):
            row = SolveStats().row()
        return row

    def state_dict(self) -> dict:
        """The inner oracle's (this rank's warm starts: its layers, its shard)."""
        return self.inner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.inner.load_state_dict(state)

    def warm_entries(self, state: dict) -> list:
        return self.inner.warm_entries(state)

    def with_warm_entries(self, state: dict, entries: list) -> dict:
        return self.inner.with_warm_entries(state, entries)

    def warm_rows(self, state: dict) -> str:
        return self.inner.warm_rows(state)

    def tighten(self) -> bool:
        """Every group's inner oracle climbs alike (it depends on no data)."""
        return self.inner.tighten()

    def relax(self) -> None:
        self.inner.relax()

    def begin(self, batch: Batch):
        self.local = batch.x.shape[0]
        self.total = batch.n if batch.n is not None else \
            int(self.data.allreduce_sum(self.local))
        self.empty = self.local == 0
        self.key = batch.key
        if self.empty:      # the warm-start cache still ages alike in every group
            self.inner.skip(batch.key)
        else:
            self.inner.begin(Batch(batch.x, batch.y, batch.key))

    def value(self, theta) -> Point:
        self.theta = theta
        reg = self.net.regulariser(theta)
        loss = hits = 0.0
        if not self.empty:
            p = self.inner.value(theta)
            loss, hits = p.loss * self.local / self.total, p.accuracy * self.local
        loss = self.data.allreduce_sum(loss)
        hits = round(self.data.allreduce_sum(hits))
        return Point(loss + reg, loss, hits / self.total)

    def gradient(self) -> torch.Tensor:
        reg = torch.zeros_like(self.theta)
        self.net.regulariser(self.theta, reg)
        part = torch.zeros_like(self.theta)
        if not self.empty:
            part = (self.inner.gradient() - reg).mul_(self.local / self.total)
        if not self.controlled:
            return allreduce_tensor(self.data, part).add_(reg)
        # the solve record summed over the groups in the same reduction as the gradient
        record = [0.0] * (len(Measured.__dataclass_fields__) + 1)
        if not self.empty:
            record = measured(self.inner.fwd, self.inner.adj, self.local / self.total)
            record = [*record.as_list(), 1.0]
        both = allreduce_tensor(self.data, torch.cat([part, part.new_tensor(record)]))
        grad = both[:part.numel()].add_(reg)
        m = Measured.from_sums(both[part.numel():-1].tolist(), float(both[-1]))
        self.inner.control(m, float(grad.norm()), self.key)
        return grad

    def accept(self):
        if not self.empty:
            self.inner.accept()

    def validate(self, theta, x, y, chunk: int | None = None) -> tuple[float, float]:
        local = x.shape[0]
        total = int(self.data.allreduce_sum(local))
        loss = hits = 0.0
        if local:
            loss, acc = self.inner.validate(theta, x, y, chunk)
            loss, hits = loss * local / total, acc * local
        return self.data.allreduce_sum(loss), round(self.data.allreduce_sum(hits)) / total
