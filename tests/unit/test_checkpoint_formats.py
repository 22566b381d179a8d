"""Which oracle state a resumed rank gets from each checkpoint format, in one process: its
own entry on the grid that saved it; blocks moved to another grid (format 3); none on
another rank count for format 2 (a cold start), which still resumes exactly on its own
rank count."""
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import composed
from lptrain import app
from lptrain.errors import InputFileError
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics
from lptrain.model.saved import AtomicArchive, load_entry
from lptrain.parallel.blocks import KINDS
from lptrain.parallel.grid import Grid
from lptrain.train import checkpoint as ck
from lptrain.train.oneshot import SimultaneousOracle
from lptrain.train.regrid import regrid

ARGS = ["network.layers=8", "network.width=4", "dataset.n_train=200", "dataset.n_val=50",
        "seed=5", "eval_every=2", "mgrit.levels=2", "mgrit.cfactor0=2", "mode=simultaneous",
        "optimizer=adam", "train.batch_size=50"]


def _cfg(iterations):
    return composed(*ARGS, f"train.iterations={iterations}")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A run stopped after 5 iterations (warm starts of all 4 batches) and its placement."""
    run = tmp_path_factory.mktemp("run")
    app.run(_cfg(5), None, run)
    opts = app.options(_cfg(5))
    ex, data, net, *_ = app.build(opts, None)
    return run, lambda grid: app.placement(opts, grid, data, net)


def _as_format(run: Path, version: int, out: Path) -> Path:
    """The run's checkpoint rewritten as format `version` (2: no grid)."""
    path = run / ck.CHECKPOINT_FILE
    record = load_entry(path, ck.RECORD_ENTRY, "checkpoint")
    record.pop("grid")
    record["format_version"] = version
    states = [load_entry(path, ck.oracle_entry(r), "checkpoint")
              for r in range(record["world_size"])]
    out.mkdir()
    (out / ms.FILE_NAME).write_bytes((run / ms.FILE_NAME).read_bytes())
    target = out / ck.CHECKPOINT_FILE
    archive = AtomicArchive(target)
    archive.add(ck.RECORD_ENTRY, record)
    for r, state in enumerate(states):
        archive.add(ck.oracle_entry(r), state)
    archive.commit()
    return out


def _state(run, here, rank=0):
    path = run / ck.CHECKPOINT_FILE
    return ck.oracle_state(path, ck.read_run_state(path), rank, here, SimultaneousOracle)


def test_format_3_on_records_the_grid_and_moves_blocks_there_and_back(saved):
    run, placement = saved
    record = ck.load_checkpoint(run / ck.CHECKPOINT_FILE)
    assert record["format_version"] >= 3
    assert ck.read_run_state(run / ck.CHECKPOINT_FILE).grid == Grid(1, 1)
    own = _state(run, placement(Grid(1, 1)))
    assert [e[0] for e in own["cache"]] == [e[0] for e in ck.load_checkpoint(
        run / ck.CHECKPOINT_FILE, rank=0)["oracle"]["cache"]]
    assert len(own["cache"]) == 4
    for grid in (Grid(2, 1), Grid(1, 2), Grid(4, 1)):
        here = placement(grid)
        moved = [_state(run, here, r) for r in range(grid.size)]
        back = regrid(here.layout(grid), here.layout(Grid(1, 1)), 0, here.samples,
                      enumerate(moved), SimultaneousOracle, here.axis)
        assert back["controller"] == own["controller"]
        for (key, *a), (key_b, *b) in zip(own["cache"], back["cache"]):
            assert key == key_b
            for kind, x, y in zip(KINDS, a, b):
                torch.testing.assert_close(y, x, rtol=1e-15, atol=0, msg=f"{grid} {kind}")


def test_format_2_keeps_its_warm_starts_only_on_its_rank_count(saved, tmp_path):
    run, placement = saved
    old = _as_format(run, 2, tmp_path / "old")
    own = _state(old, placement(Grid(1, 1)))
    want = _state(run, placement(Grid(1, 1)))
    for (_, *a), (_, *b) in zip(own["cache"], want["cache"]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert _state(old, placement(Grid(2, 1))) is None       # cold start on 2 ranks


def test_a_format_2_checkpoint_still_resumes_exactly(saved, tmp_path):
    run, _ = saved
    whole = tmp_path / "whole"
    whole.mkdir()
    app.run(_cfg(8), None, whole)
    old = _as_format(run, 2, tmp_path / "old")
    app.run(_cfg(8), None, old, resume=True)
    a, b = read_metrics(whole / ms.FILE_NAME), read_metrics(old / ms.FILE_NAME)
    np.testing.assert_array_equal(b.train[ms.ITERATION], np.arange(1, 9))
    np.testing.assert_array_equal(b.train[ms.OBJECTIVE], a.train[ms.OBJECTIVE])


# bytes that reach torch's unpickler and break it: an empty stack (IndexError; the fault
# matrix's random checkpoint.pt), a pop from it, a stray opcode
DAMAGED = {"tuple1": b"\x85", "pop": b"0", "mark-tuple": b"t", "stop": b"."}


@pytest.mark.parametrize("name", list(DAMAGED))
def test_damaged_bytes_are_an_unreadable_checkpoint(tmp_path, name):
    """A file or archive entry of such bytes is one InputFileError naming the file, never
    an IndexError (which ended the run as an unexpected exception, exit 1)."""
    path = tmp_path / ck.CHECKPOINT_FILE
    path.write_bytes(DAMAGED[name])
    with pytest.raises(InputFileError, match=f"{path}: unreadable checkpoint"):
        ck.load_checkpoint(path)
    archive = AtomicArchive(path)
    archive.add(ck.RECORD_ENTRY, {"format": "x"})
    archive.commit()
    with zipfile.ZipFile(path, "a") as z:
        z.writestr("bad.pt", DAMAGED[name])
    with pytest.raises(InputFileError, match=f"{path}: unreadable checkpoint"):
        load_entry(path, "bad.pt", "checkpoint")
