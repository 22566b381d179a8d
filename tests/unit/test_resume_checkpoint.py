"""The checkpoint writer in pieces: its automatic interval, each rank's state in the file,
refused old formats, failed and full-disk writes, and the models written before it."""
from pathlib import Path

import pytest
import torch

from lptrain.train.model_files import ModelSaver
from lptrain.errors import RunFileError
from lptrain.train import checkpoint as ck
from lptrain.train.run_state import LoopState


def test_automatic_interval_keeps_checkpoints_under_two_percent():
    class Ex:
        size = 1
    c = ck.Checkpointer(Path("x"), None, Ex(), True, None, None, None, "")
    assert c.next == ck.AUTO_FIRST
    c.seconds = 0.5                      # one checkpoint: 0.5 s; 0.1 s per iteration
    assert c._interval(10, 1.0) == 250   # 0.5 s every 250 iterations of 0.1 s: 2 %
    c.seconds = 1e-4
    assert c._interval(10, 1.0) == ck.AUTO_FIRST
    assert ck.Checkpointer(Path("x"), 7, Ex(), True, None, None, None, "")._interval(
        10, 1.0) == 7


def test_checkpoints_that_grow_are_spaced_by_their_share_of_the_whole_run():
    """MNIST one-shot: 1.5 s at iteration 10 (10 of 48 batches' warm starts), 5.8 s at
    44, 6.2 % of a 150-iteration run (held-out). After a dear checkpoint the next waits
    until all of this start's, the next included, are 2 % of the wall time."""
    class Ex:
        size = 1
    c = ck.Checkpointer(Path("x"), None, Ex(), True, None, None, None, "")
    c.seconds = c.total = 1.5                # at iteration 10, 15 s into the run
    assert c._interval(10, 15.0) == 90       # (1.5 + 1.5) / 2 % = 150 s: 135 s more
    c.seconds, c.total = 6.0, 7.5            # at 110, 171 s: 6 s each 193 its is 2 %,
    assert c._interval(110, 171.0) == 325    # but all 13.5 s need 675 s: 504 s more


def test_ranks_agree_on_the_automatic_interval_whatever_their_clocks():
    # every rank gathers warm starts at a checkpoint: ranks that chose different
    # intervals from their own clocks would wait in different collectives (a hang seen
    # at iteration 55 of a 2-rank run); rank 0's seconds and wall time decide
    class Ex:
        size = 2

        def __init__(self, peer):
            self.peer = iter(peer)

        def allreduce_sum(self, v):
            return v + next(self.peer)
    rank0 = ck.Checkpointer(Path("x"), None, Ex([0.0, 0.0, 0.0]), True, None, None, None,
                            "")
    rank1 = ck.Checkpointer(Path("x"), None, Ex([0.5, 0.5, 1.0]), False, None, None, None,
                            "")
    rank0.seconds, rank1.seconds = 0.5, 0.3
    rank0.total, rank1.total = 0.5, 0.3      # (0.5 + 0.5) s are 2 % of 50 s: 49 s more
    assert rank0._interval(10, 1.0) == rank1._interval(10, 7.0) == 490


class _Ranks:
    """gather_each of `size` ranks, in process: rank 0 consumes each state in rank order."""

    def __init__(self, states):
        self.states, self.rank, self.size = states, 0, len(states)

    def gather_each(self, obj, consume):
        """Rank r sends states[r]; where rank 0 sends a changed state (a lean checkpoint's
        without warm starts), every rank's is changed alike."""
        for r, state in enumerate(self.states):
            if r and obj is not self.states[0]:
                state = {**state, "cache": obj["cache"]}
            consume(r, obj if r == 0 else state)

    def allreduce_sum(self, value):
        return value

    def allgather(self, obj):
        return [obj] + [None] * (self.size - 1)


class _Optimizer:
    def state_and_vectors(self):
        return {"k": 1}, lambda: iter(())


class _Batches:
    def state_dict(self):
        return {"order": []}


class _Progress:
    first_objective = 2.5

    def best_state(self):
        return None

    def pending_state(self):
        return None


def _three_rank_checkpoint(path):
    states = [{"cache": [(0, torch.full((2, 3), float(r)), None)]} for r in range(3)]

    class Oracle:
        def state_dict(self):
            return states[0]

        def warm_entries(self, state):
            return state["cache"]

        def with_warm_entries(self, state, entries):
            return {**state, "cache": entries}

    saver = ck.Checkpointer(path, 1, _Ranks(states), True, _Optimizer(), Oracle(), _Progress(),
                            "c")
    saver.save(4, torch.arange(3.0), _Batches(), LoopState(wall_time=1.0))
    _three_rank_checkpoint.saver = saver
    return states


def test_checkpoint_gives_each_rank_its_own_oracle_state(tmp_path):
    path = tmp_path / ck.CHECKPOINT_FILE
    states = _three_rank_checkpoint(path)
    for r in range(3):
        record = ck.load_checkpoint(path, rank=r)
        assert record["iteration"] == 4 and record["world_size"] == 3
        assert torch.equal(record["oracle"]["cache"][0][1], states[r]["cache"][0][1])
    assert "oracle" not in ck.load_checkpoint(path)
    assert ck.load_checkpoint(path, rank=5)["oracle"] is None
    assert not list(tmp_path.glob(".*.tmp"))           # the temporary file was renamed


def test_a_format_1_checkpoint_is_refused_by_name(tmp_path):
    from lptrain.errors import InputFileError
    from lptrain.model.saved import save_torch
    path = tmp_path / ck.CHECKPOINT_FILE
    save_torch({"format": ck.FORMAT, "format_version": 1, "iteration": 7, "world_size": 2,
                "oracles": [{"cache": "a"}, {"cache": "b"}]}, path)
    for rank in (None, 1):
        with pytest.raises(InputFileError, match=r"checkpoint.pt: checkpoint format 1 as one "
                                                  r"torch file.*start the run anew"):
            ck.load_checkpoint(path, rank=rank)
    save_torch({"format": "lptrain-model", "format_version": 1}, path)   # not a checkpoint
    with pytest.raises(InputFileError, match="not an lptrain checkpoint"):
        ck.load_checkpoint(path)


def _failing_writes(monkeypatch, fails) -> None:
    """Each entry written to a checkpoint raises a RunFileError with the reason
    fails(name, obj) gives (None: written)."""
    from lptrain.model import saved
    real_add = saved.AtomicArchive.add

    def add(self, name, obj):
        reason = fails(name, obj)
        if reason is not None:
            raise RunFileError(f"{self.path}: cannot write ({reason})")
        real_add(self, name, obj)

    monkeypatch.setattr(saved.AtomicArchive, "add", add)


def test_a_failed_checkpoint_write_keeps_the_old_file_and_receives_every_rank(
        tmp_path, monkeypatch):
    path = tmp_path / ck.CHECKPOINT_FILE
    _three_rank_checkpoint(path)
    before = path.read_bytes()
    consumed = []

    def fails(name, obj):
        consumed.append(name)
        return "disk full" if name == ck.oracle_entry(1) else None

    _failing_writes(monkeypatch, fails)
    with pytest.raises(RunFileError, match=r"disk full\); the checkpoint.pt written before "
                                           r"is kept"):
        _three_rank_checkpoint(path)
    # no write after the failing one; then the same for the lean checkpoint, which fails too
    assert consumed == ["record.pt", "oracle-0.pt", "oracle-1.pt"] * 2
    assert path.read_bytes() == before and not list(tmp_path.glob(".*.tmp"))


def test_a_checkpoint_without_room_for_the_warm_starts_is_written_without_them(
        tmp_path, monkeypatch):
    """The first checkpoint of a run on a full disk: every rank's warm starts are left
    out, the rest is kept to resume from, and the error says so."""
    path = tmp_path / ck.CHECKPOINT_FILE
    _failing_writes(monkeypatch, lambda name, obj: "No space left on device"
                    if name.startswith("oracle-") and obj["cache"] else None)
    with pytest.raises(RunFileError, match=r"No space left on device\); wrote checkpoint.pt "
                                           r"of iteration 4 without the warm starts"):
        _three_rank_checkpoint(path)
    for r in range(3):
        record = ck.load_checkpoint(path, rank=r)
        assert (record["iteration"], record["warm_starts"]) == (4, False)
        assert record["oracle"] == {"cache": []}
        assert torch.equal(record["theta"], torch.arange(3.0))


def test_a_full_checkpoint_is_kept_rather_than_replaced_by_a_lean_one(tmp_path, monkeypatch):
    """A disk that filled after the first checkpoint: the full file of iteration 4 was
    replaced by a lean one of iteration 8, whose resume starts cold and drifted from the
    uninterrupted run by 5 % (held-out); the full one's resume is exact."""
    path = tmp_path / ck.CHECKPOINT_FILE
    _three_rank_checkpoint(path)
    _failing_writes(monkeypatch, lambda name, obj: "No space left on device"
                    if name.startswith("oracle-") and obj["cache"] else None)
    with pytest.raises(RunFileError, match=r"No space left on device\); the checkpoint.pt "
                                           r"of iteration 4 is kept \(a resume goes on"):
        _three_rank_checkpoint.saver.save(8, torch.arange(3.0), _Batches(),
                                          LoopState(wall_time=2.0), force=True)
    record = ck.load_checkpoint(path, rank=1)
    assert (record["iteration"], record["warm_starts"]) == (4, True)


class _OrderedModels:
    """A ModelSaver stand-in: records the checkpoint's iteration when the models are
    written (None: no checkpoint yet), and fails when told to."""

    def __init__(self, path, fail=False):
        self.path, self.fail, self.seen = path, fail, []

    def save(self, progress, exchange):
        self.seen.append(ck.load_checkpoint(self.path)["iteration"]
                         if self.path.exists() else None)
        if self.fail:
            raise RunFileError(f"{self.path.parent}/model.pt: cannot write (disk full)")


@pytest.mark.parametrize("fail", [False, True])
def test_models_are_written_before_their_checkpoint(tmp_path, fail):
    """A kill between the two files must not leave models older than the checkpoint; a
    model that cannot be written still lets the checkpoint be written, then fails."""
    path = tmp_path / ck.CHECKPOINT_FILE
    models = _OrderedModels(path, fail)

    class Oracle:
        def state_dict(self):
            return {"cache": []}

        def warm_entries(self, state):
            return []

    saver = ck.Checkpointer(path, 1, _Ranks([{"cache": []}]), True, _Optimizer(), Oracle(),
                            _Progress(), "c", model=models)
    for k in (1, 2):
        if fail:
            with pytest.raises(RunFileError, match="model.pt: cannot write"):
                saver.save(k, torch.arange(3.0), _Batches(), LoopState(wall_time=1.0))
        else:
            saver.save(k, torch.arange(3.0), _Batches(), LoopState(wall_time=1.0))
        assert ck.load_checkpoint(path)["iteration"] == k
    assert models.seen == [None, 1]


def test_the_models_lines_stay_within_80_columns_for_long_runs():
    """At 3000 iterations the one line under the model's path was 81 columns, wrapped
    by the terminal mid-number: what each file holds then gets a line of its own."""
    from types import SimpleNamespace
    saver = SimpleNamespace(paths={"best": Path("/r/model.pt"), "last": Path("/r/model-last.pt")})
    progress = SimpleNamespace(best=SimpleNamespace(accuracy=0.995, iteration=3000),
                               iteration=3000)
    assert ModelSaver.describe(saver, progress) == [
        "model: /r/model.pt", "  best validation accuracy 0.9950 at iteration 3000",
        "  model-last.pt: iteration 3000"]
    progress.best.iteration = progress.iteration = 12
    lines = ModelSaver.describe(saver, progress)
    assert len(lines) == 2 and all(len(line) <= 80 for line in lines)


class _Streaming:
    """An optimizer whose pairs' vectors stream apart, counting the ones drawn (each a
    gather every rank takes part in)."""

    def __init__(self):
        self.vectors = [torch.arange(5.0) + 10 * i for i in range(4)]
        self.drawn = 0

    def state_and_vectors(self):
        def vectors():
            for v in self.vectors:
                self.drawn += 1
                yield v
        return {"mem": [[None, None, 0.5], [None, None, 0.25]], "current": None}, vectors


def test_the_pairs_stream_to_the_file_and_every_gather_is_taken_when_it_fails(
        tmp_path, monkeypatch):
    from lptrain.model import saved
    from lptrain.train.stored_pairs import PAIRS_ENTRY
    path = tmp_path / ck.CHECKPOINT_FILE
    states = [{"cache": []}]
    opt = _Streaming()

    def checkpoint():
        saver = ck.Checkpointer(path, 1, _Ranks(states), True, opt, _NoWarm(), _Progress(),
                                "c")
        saver.save(4, torch.arange(5.0), _Batches(), LoopState(wall_time=1.0))
    checkpoint()
    mem = ck.load_checkpoint(path)["optimizer"]["mem"]
    assert [rho for *_, rho in mem] == [0.5, 0.25] and opt.drawn == 4
    for got, want in zip((v for s, y, _ in mem for v in (s, y)), opt.vectors, strict=True):
        assert torch.equal(got.clone(), want)
    real = saved.AtomicArchive.add_raw

    def fails_after_one(self, name, tensors):     # as a full disk fails a write
        assert name == PAIRS_ENTRY
        next(iter(tensors))
        with self._failing("cannot write"):
            raise OSError(28, "disk full")
    monkeypatch.setattr(saved.AtomicArchive, "add_raw", fails_after_one)
    opt.drawn, before = 0, path.read_bytes()
    with pytest.raises(RunFileError, match="disk full"):
        checkpoint()
    assert opt.drawn == 4 and path.read_bytes() == before    # every vector drawn, once
    monkeypatch.setattr(saved.AtomicArchive, "add_raw", real)


class _NoWarm:
    def state_dict(self):
        return {"cache": []}

    def warm_entries(self, state):
        return state["cache"]

    def with_warm_entries(self, state, entries):
        return {**state, "cache": entries}
