"""The glue of recorded iterations, kept per host and configuration beside the kernel costs.

A record's glue (record.py: what a rank computes outside its kernels, the solver's vector
work and the Python around every call) is timed as the iteration is recorded.  On a
shared machine it moves by 5–15 % from one start to the next, and a difference of two
records (the report's per-cycle columns) by half, so two predictions from the same kept
kernel costs differed although nothing was measured anew.  The glue is a measured cost
like the kernels': the first record of a (mode, grid, cycles) on this host and
configuration keeps its glue, and later records of it take the kept glue where they did
the same (the same ops on every rank: a change to the code that changes what the
iteration does is timed anew), in whole nanoseconds (a deep network's records hold
hundreds of thousands of spans).  `lptrain-model --fresh` times it anew.
"""
from __future__ import annotations

import json

from lptrain.model_perf.costs import cache_file, keep_json
from lptrain.model_perf.record import Record, glue_of, ops_digest, with_glue


def glue_config(model, device: str, threads: int) -> dict:
    """What a configuration's records and their glue depend on: the kernel costs' key
    (network, batch, dtype, device, threads), the MGRIT options the records use and
    whether the batch is a mini-batch."""
    from lptrain.model_perf.costs import cost_config, model_mgrit
    dtype = str(model.dtype).removeprefix("torch.")
    return {"costs": cost_config(model.net, model.batch, dtype, device, threads),
            "mgrit": model_mgrit(model.mgrit), "mini_batches": model.mini_batches,
            "glue": "nanoseconds"}


class KeptGlue:
    """The glue kept for one configuration (`config`: what its records depend on)."""

    def __init__(self, config: dict, fresh: bool = False):
        self.config, self.path = config, cache_file(config, "glue")
        self.records = {} if fresh else _load(self.path)
        self.reused, self.timed = 0, 0
        self.unkept = None     # after save(): why the glue could not be kept

    def settle(self, key: tuple, record: Record) -> Record:
        """`record` (recorded for `key`) with the glue kept for it where it did the same,
        else as timed, and then kept (by save())."""
        name = "/".join(map(str, key))
        digest = ops_digest(record)
        kept = self.records.get(name)
        if isinstance(kept, dict) and kept.get("ops") == digest:
            settled = _taking(record, kept.get("glue"))
            if settled is not None:
                self.reused += 1
                return settled
        ns = [[[round(t * 1e9) for t in spans] for spans in part] for part in glue_of(record)]
        self.records[name] = {"ops": digest, "glue": ns}
        self.timed += 1
        return _taking(record, ns)     # as a later start will: whole nanoseconds

    def save(self) -> str | None:
        """Keep the glue of every record (costs.keep_json: why not, else None)."""
        if self.timed:
            self.unkept = keep_json(self.path, {"config": self.config,
                                                "records": self.records})
        return self.unkept

    @property
    def note(self) -> str:
        """Where the glue came from, in a few words."""
        said = "glue kept" if not self.timed else \
            "glue timed now" if not self.reused else "glue partly kept"
        return said + (" (not kept)" if self.unkept else "")


def kept_for(model, device: str, threads: int, fresh: bool = False) -> KeptGlue:
    """The kept glue of `model`'s configuration on this host (--fresh: none)."""
    return KeptGlue(glue_config(model, device, threads), fresh)


def _taking(record: Record, ns) -> Record | None:
    """`record` with the glue `ns` (nanoseconds, glue_of's form), None where it is not
    a record's of the same ops (an unreadable file)."""
    try:
        return with_glue(record, [[[t / 1e9 for t in spans] for spans in part]
                                  for part in ns])
    except (TypeError, ValueError):
        return None


def _load(path) -> dict:
    """The kept records' glue ({} where there is none or it is unreadable)."""
    try:
        records = json.loads(path.read_text())["records"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return records if isinstance(records, dict) else {}
