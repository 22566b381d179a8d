"""The speedup model behind `parallel.layer_ranks=auto` (parallel/auto.py's GridTimer).

A grid L × D runs the mode's recorded iteration on a layer group of L ranks with the
shard of ceil(batch / D) samples, and sums the loss, the hits and the gradient over the
D groups (predict.py).  Data parallelism divides the work exactly, layer parallelism
pays MGRIT's extra work, so more layer ranks win where shards get so small that
per-call costs and messages dominate.  Costs are those of this host (costs.py).

The predicted times of a configuration's grids are kept beside the kernel costs, and a
later start on the host decides on them: a record's glue is timed as it runs, so two
starts could rank two nearly equal grids differently and, since another grid sums in
another order, train differently. `lptrain-model --fresh` forgets them.
"""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict
from typing import Sequence

from lptrain.model_perf.costs import MODEL_BLIND, model_mgrit
from lptrain.model_perf.measure import DEFAULT_LINK
from lptrain.model_perf.predict import Collecting, Counts, Machine, Model
from lptrain.modes import LAYERED, MGRIT
from lptrain.parallel.grid import Grid, c_intervals, candidates, choose


def recommend(size: int, mode: str, model: Model, m: Machine, counts: Counts = Counts(),
              layer_ranks="auto", data_ranks: int | None = None) -> tuple[Grid, dict]:
    """(grid, {grid: predicted seconds}) among the grids the options allow on `size` ranks."""
    grids = candidates(size, layer_ranks, data_ranks, model.max_layer, mode in LAYERED)
    times = {g: model.grid_time(g, mode, m, counts) for g in grids}
    # decided as the automatic grid decides: without the optimizer's arithmetic, which
    # every grid pays alike (it would only widen the tie of choose())
    return choose(grids, lambda g: times[g] - m.optimizer), times


def measured_machine(model: Model, theta, predictions, device: str, threads: int,
                     fresh: bool = False, link=DEFAULT_LINK) -> tuple[Machine, str]:
    """A Machine with the costs, on this host, of every kernel `predictions(machine)`
    charges (a first pass at no cost names them; kept ones, the others measured now)."""
    from lptrain.model_perf.costs import measured
    probe = Machine(Collecting(), link)
    predictions(probe)
    costs, note = measured(model.net, theta, model.batch, probe.costs.kernels, device,
                           threads, fresh)
    return Machine(costs, link), note


def ignored(overrides) -> list[str]:
    """The overrides lptrain-model's predictions cannot depend on: it predicts every mode
    and every split, and its records run the one-shot solves with a fixed plan."""
    from lptrain.config import override_key
    blind = {f"mgrit.{k}" for k in MODEL_BLIND if k not in ("tol", "rtol", "adj_tol")}
    found = []
    for item in overrides:
        key = override_key(item)
        if key in blind or key in ("mode", "mode.name") or key == "parallel" \
                or key.startswith("parallel."):
            found.append(item.lstrip("+"))
    return found


class MeasuredTimer:
    """GridTimer of a configuration in one mode with this host's measured costs."""

    def __init__(self, opts, net, mode: str, counts: Counts = Counts(),
                 model: Model | None = None, announce=None):
        self.opts, self.net, self.mode, self.counts = opts, net, mode, counts
        self.model = model     # a Model of this configuration whose records to reuse
        self.note = None       # after times(): where they came from
        self.announce = announce   # called with a line before kernels are timed

    def times(self, grids: Sequence[Grid]) -> dict[Grid, float]:
        import torch

        from lptrain.data.base import dataset_sizes
        from lptrain.model.dtypes import DTYPES
        from lptrain.model_perf.costs import cost_config
        o = self.opts
        dtype = DTYPES[o.dtype]
        batch = o.train.batch_size or dataset_sizes(o.dataset).n_train
        threads = torch.get_num_threads()
        mini_batches = o.train.batch_size is not None
        key = {"costs": cost_config(self.net, batch, o.dtype, o.device, threads),
               "mode": self.mode, "mgrit": model_mgrit(o.mgrit),
               "counts": asdict(self.counts),
               "mini_batches": mini_batches, "grids": sorted([g.layer, g.data] for g in grids)}
        kept = kept_times(key)
        if kept is not None:
            self.note = "times kept on this host"
            return kept
        if self.announce is not None:
            self.announce("predicting layer_ranks=auto's splits (once; kernels timed if new here)")
        model = self.model
        if model is None or (model.batch, model.mini_batches, model.dtype, model.mgrit) != \
                (batch, mini_batches, dtype, o.mgrit):
            # the records' glue as lptrain-model keeps it: both predict from the same
            from lptrain.model_perf.kept_glue import kept_for
            model = self.model = Model(self.net, o.mgrit, batch, mini_batches, dtype)
            model.glue = kept_for(model, o.device, threads)
        theta = self.net.init_params(o.seed, dtype, o.device)

        def times(m):
            return {g: model.grid_time(g, self.mode, m, self.counts) for g in grids}
        m, costs = measured_machine(model, theta, times, o.device, threads)
        found = times(m)
        if model.glue is not None:
            model.glue.save()
        unkept = keep_times(key, found)
        how = "this host's kernels timed now" if costs.startswith("measured now") else \
            "predicted now from this host's kernel costs, kept earlier"
        self.note = f"{how}; kept for the next start" if not unkept else \
            (f"{how}; not kept ({unkept}): each start predicts them again and may choose "
             f"another split")
        return found

    @property
    def assumed(self) -> str:
        """What the times assume that no run has told yet: the cycles of a solve."""
        c, mo, n = self.counts, self.opts.mgrit, self.opts.network.layers
        if c_intervals(n, mo.cfactor0, mo.levels, mo.min_coarse) >= n:
            return "one MGRIT level: each solve is one serial sweep"
        if self.mode == MGRIT:
            return f"{c.mgrit_fwd:g} + {c.mgrit_adj:g} cycles a solve assumed (to tolerance)"
        fwd, adj = c.simultaneous(self.opts.mgrit)
        if self.opts.mgrit.control == "fixed":
            return f"{fwd:g} + {adj:g} cycles a solve (mgrit.fwd_iters + adj_iters)"
        return (f"{fwd:g} + {adj:g} cycles a solve assumed (mgrit.fwd_iters + adj_iters; "
                f"the error control varies them)")


def _times_file(key: dict):
    from lptrain.model_perf.costs import cache_file
    return cache_file(key, "grid_times")


def kept_times(key: dict) -> dict[Grid, float] | None:
    """The grid times kept for `key` on this host (None: none, unreadable, or not one
    positive time for each of the key's grids, e.g. an entry edited by hand)."""
    try:
        rows = json.loads(_times_file(key).read_text())["times"]
        if not all(_written(row) for row in rows):
            return None
        times = {Grid(layer, data): float(t) for layer, data, t in rows}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    whole = len(times) == len(rows) and sorted([g.layer, g.data] for g in times) == \
        sorted(key["grids"]) and all(math.isfinite(t) and t > 0 for t in times.values())
    return times if whole else None


def _written(row) -> bool:
    """Whether a kept row is as keep_times writes it: [layer, data, seconds], two ints
    and a number (not '0.01', 1.9 layers or true, which Python would read as 1)."""
    return isinstance(row, list) and len(row) == 3 and \
        all(type(v) is int for v in row[:2]) and type(row[2]) in (int, float)


def keep_times(key: dict, times: dict[Grid, float]) -> str | None:
    """Keep `times` for `key` (costs.keep_json: why not, else None)."""
    from lptrain.model_perf.costs import keep_json
    return keep_json(_times_file(key), {"key": key,
                                 "times": [[g.layer, g.data, t] for g, t in times.items()]})


def forget_kept_times() -> None:
    """Drop every kept grid time of this cache (the next auto decision predicts anew)."""
    from lptrain.model_perf.costs import cache_dir
    shutil.rmtree(cache_dir() / "grid_times", ignore_errors=True)


def model_timer(opts, net, mode: str, announce=None) -> MeasuredTimer:
    """The factory `parallel.auto.install` takes (the `lptrain` command installs it, with
    `announce` saying on its console that kernels are being timed: the run waits)."""
    return MeasuredTimer(opts, net, mode, announce=announce)


def timers_reusing(model: Model):
    """A factory like model_timer whose timers reuse `model`'s recorded iterations where
    they model the same configuration (`lptrain-model`'s auto column: its grids are
    the model's, and recording them twice doubles the command's main cost)."""
    def factory(opts, net, mode: str) -> MeasuredTimer:
        return MeasuredTimer(opts, net, mode, model=model)
    return factory
