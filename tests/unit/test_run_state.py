"""The run state a checkpoint carries: its record form, read back from every format."""
import math

import pytest
import torch

from lptrain.errors import InputFileError
from lptrain.model.saved import AtomicArchive
from lptrain.parallel.grid import Grid
from lptrain.train import checkpoint as ck
from lptrain.train.run_state import FORMAT, FORMAT_VERSION, LoopState, RunState


def _state(**changes) -> RunState:
    fields = dict(iteration=4, theta=torch.arange(3.0, dtype=torch.float64),
                  optimizer={"steps": 4}, batches={"order": [2, 0]},
                  rng=torch.get_rng_state(), first_objective=2.5,
                  best={"iteration": 3, "accuracy": 0.75},
                  loop=LoopState(val=(0.5, 0.75), best=0.8, wall_time=3.0,
                                 stall={"best": 0.4, "since": 1}),
                  config="seed: 1\n", world_size=2, grid=Grid(2, 1))
    return RunState(**{**fields, **changes})


def _equal(a: RunState, b: RunState) -> bool:
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
               for x, y in zip(vars(a).values(), vars(b).values()))


@pytest.mark.parametrize("changes", [{}, {"grid": None, "best": None, "warm_starts": False},
                                     {"loop": LoopState(wall_time=1.0)},
                                     {"loop": LoopState(wall_time=1.0, notes={
                                         "said": ["repeated"], "beyond": 2})}])
def test_a_run_state_reads_back_from_its_record(changes):
    run = _state(**changes)
    record = run.to_record()
    assert (record["format"], record["format_version"]) == (FORMAT, FORMAT_VERSION)
    assert record["loop"]["iteration"] == run.iteration       # the loop's own copy
    assert _equal(RunState.from_record(record), run)
    assert not _equal(RunState.from_record({**record, "iteration": 5}), run)


def test_keys_older_writers_left_out_read_as_their_defaults():
    record = _state().to_record()
    for key in ("grid", "best", "warm_starts"):
        del record[key]
    del record["loop"]["stall"]
    run = RunState.from_record(record)
    assert run.grid is None and run.best is None and run.warm_starts
    assert run.loop.stall is None and run.loop.val == (0.5, 0.75)


def test_a_record_without_a_part_of_every_checkpoint_is_refused(tmp_path):
    path = tmp_path / ck.CHECKPOINT_FILE
    record = _state().to_record()
    del record["theta"]
    archive = AtomicArchive(path)
    archive.add(ck.RECORD_ENTRY, record)
    archive.commit()
    with pytest.raises(InputFileError, match="not a whole checkpoint .*'theta'"):
        ck.read_run_state(path)


def test_the_loop_state_starts_unvalidated():
    loop = LoopState()
    assert all(math.isnan(v) for v in loop.val) and loop.best == -math.inf


def test_what_the_console_said_once_is_not_said_again_after_a_resume():
    """`a one-shot gradient far above mgrit.grad_tol was taken again`, said once by an
    uninterrupted run, was said again after each resume: the loop's record of what it
    had said was not in the checkpoint."""
    from lptrain.mgrit.options import MGRITOptions
    from lptrain.train.notes import SolveNotes

    class Console:
        lines: list = []

        def message(self, line, **_):
            self.lines.append(line)
    stats = {"unconverged": 1, "fwd_residual": 1.0, "adj_residual": 1.0,
             "fwd_history": [], "adj_history": []}
    said = SolveNotes(Console(), MGRITOptions())
    said.after(3, stats)
    assert len(Console.lines) == 3
    loop = LoopState.from_record(LoopState(notes=said.state_dict()).to_record(3))
    again = SolveNotes(Console(), MGRITOptions())
    again.load_state_dict(loop.notes)
    again.after(4, stats)
    assert len(Console.lines) == 3
