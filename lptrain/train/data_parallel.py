"""Data groups of a layer × data grid: data terms on this group's batch shard, summed over groups.

Each data group holds a contiguous shard of the data; a batch is a set of
global sample indices of which each group sees its own (possibly none).
The inner data terms (any mode, on the layer group's exchange) are means
over its shard; they are weighted by shard / batch size and summed over
the groups, so the loss, hits and gradient are those of the whole batch
(train/objective.py adds the regulariser once, after the sums).  A group
without samples skips its solves and contributes zeros to the sums; its inner
oracle still notes the batch (`skip`), so every group keeps warm starts of the
same batches as one rank would (and a checkpoint's blocks fit together), and
it takes part in the error estimate's sums, so every group plans alike.
"""
from __future__ import annotations

import math

import torch

from lptrain.parallel.layer_parallel import observed_sum, observed_sum_tensor
from lptrain.train.control import Measured, convergence_factor
from lptrain.train.protocol import Batch, DataTerms, Evaluated, Point


class DataParallelOracle:
    """DataTerms: `inner` on this group's shard; loss, hits and gradient summed over `data`
    (an Evaluated's tape is the inner evaluation, None where the group has no samples).

    observer: an `mgrit.protocols.Observer` told of each sum over the groups (None: none).
    """

    def __init__(self, inner: DataTerms, data, observer=None):
        self.inner, self.data, self.observer = inner, data, observer
        self.measures = inner.measures
        self.empty = False

    def record(self) -> dict | None:
        """The MGRIT record of the whole batch's solves on data rank 0 (every group's,
        `combined_record`), this group's elsewhere; None where the mode solves nothing."""
        if not self.measures:
            return self.inner.record()
        row = None if self.empty else self.inner.record()
        parts = self.data.gather([row, self.local / self.total])
        return row if parts is None else combined_record(parts)

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

    def skip(self, key: int) -> None:
        self.inner.skip(key)

    def begin(self, batch: Batch):
        self.batch = batch
        self.local = batch.x.shape[0]
        self.total = batch.n if batch.n is not None else \
            int(self._sum(self.local))
        self.empty = self.local == 0
        if self.empty:      # the warm-start cache still ages alike in every group
            self.inner.skip(batch.key)
        else:
            self.inner.begin(Batch(batch.x, batch.y, batch.key))

    def value(self, theta) -> Evaluated:
        inner, loss, hits = None, 0.0, 0.0
        if not self.empty:
            inner = self.inner.value(theta)
            p = inner.point
            loss, hits = p.loss * self.local / self.total, p.accuracy * self.local
        loss = self._sum(loss)
        hits = round(self._sum(hits))
        point = Point(objective=loss, loss=loss, accuracy=hits / self.total)
        return Evaluated(point, theta, self.batch, tape=inner)

    def gradient(self, ev: Evaluated) -> torch.Tensor:
        inner, share = ev.tape, self.local / self.total
        part = torch.zeros_like(ev.theta)
        if inner is not None:
            part = self.inner.gradient(inner).mul_(share)
        if not self.measures:
            return self._sum_tensor(part)
        # the solve record summed over the groups in the same reduction as the gradient
        record = [0.0] * (len(Measured.__dataclass_fields__) + 1)
        if inner is not None:
            record = [*self.inner.measure(inner, share).as_list(), 1.0]
        both = self._sum_tensor(torch.cat([part, part.new_tensor(record)]))
        ev.measured = Measured.from_sums(both[part.numel():-1].tolist(), float(both[-1]))
        return both[:part.numel()]

    def measure(self, ev: Evaluated, weight: float = 1.0) -> Measured | None:
        """The solve record summed over the groups (each group's weighted by its share)."""
        return ev.measured

    def observe(self, ev: Evaluated | None, measured, grad_norm: float) -> None:
        self.inner.observe(None if ev is None else ev.tape, measured, grad_norm)

    def refine(self) -> bool:
        """Every group's inner oracle decides alike (from the summed record)."""
        return self.inner.refine()

    def accept(self, ev: Evaluated):
        if ev.tape is not None:
            self.inner.accept(ev.tape)

    def validate(self, theta, x, y, chunk: int | None = None) -> tuple[float, float]:
        local = x.shape[0]
        total = int(self._sum(local))
        loss = hits = 0.0
        if local:
            loss, acc = self.inner.validate(theta, x, y, chunk)
            loss, hits = loss * local / total, acc * local
        return self._sum(loss), round(self._sum(hits)) / total

    def _sum(self, value: float) -> float:
        return observed_sum(self.data, self.observer, value)

    def _sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        return observed_sum_tensor(self.data, self.observer, t)


# record fields where the groups' solves side by side count as their slowest
_MOST = ("fwd_iterations", "adj_iterations", "fwd_total", "adj_total", "adaptive_extra",
         "rung", "unconverged", "refined")


def combined_record(parts: list) -> dict | None:
    """The MGRIT record of a batch solved in shards, from each data group's [record (None:
    no samples), share of the batch]: the most iterations of any group, and residual
    histories of the whole batch, √Σ r² over the groups at each iteration (a group that
    stopped keeps its last residual; the adjoint's, of a shard's mean loss, weighted by
    the share); the error estimates and plans are the groups' alike (train/control.py
    plans from sums over all groups)."""
    given = [(row, share) for row, share in parts if row is not None]
    if not given:
        return None
    out = dict(given[0][0])
    for key in _MOST:
        out[key] = max(row[key] for row, _ in given)
    for kind, weighted in (("fwd", False), ("adj", True)):
        history = whole_history([(row[f"{kind}_history"], share if weighted else 1.0)
                                 for row, share in given])
        out[f"{kind}_history"] = history
        out[f"{kind}_residual"] = history[-1] if history else math.nan
        out[f"{kind}_factor"] = convergence_factor(history)
    return out


def whole_history(histories: list) -> list[float]:
    """√Σ (w·r)² over [(residuals of a shard's solve, w)] at each iteration, a shorter
    history held at its last value; [] if every history is empty."""
    length = max(len(h) for h, _ in histories)
    return [math.sqrt(sum((w * h[min(k, len(h) - 1)]) ** 2 for h, w in histories if h))
            for k in range(length)]
