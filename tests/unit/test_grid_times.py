"""parallel.layer_ranks=auto decides once per configuration and host: the predicted grid
times are kept (model_perf/grid.py), so a later start takes the same grid even where a
new prediction would rank the grids otherwise."""
from lptrain.model_perf import grid as mg
from lptrain.model_perf.cli import build_network, compose
from lptrain.parallel.grid import Grid

GRIDS = [Grid(1, 2), Grid(2, 1)]


def _timer(overrides, monkeypatch, seconds):
    """A MeasuredTimer whose predictions are `seconds` (a dict read at each prediction)."""
    opts, _ = compose(["mode=simultaneous", "network.layers=8", *overrides])
    net, _, _ = build_network(opts)
    monkeypatch.setattr(mg, "measured_machine", lambda model, theta, times, *a: (None, ""))
    monkeypatch.setattr(mg.Model, "grid_time", lambda self, g, *a: seconds[g])
    return mg.MeasuredTimer(opts, net, "simultaneous")


def test_auto_keeps_the_grid_times_of_a_configuration(tmp_path, monkeypatch):
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path))
    seconds = {Grid(1, 2): 1.0, Grid(2, 1): 2.0}
    first = _timer([], monkeypatch, seconds).times(GRIDS)
    assert first == seconds
    seconds.update({Grid(1, 2): 3.0, Grid(2, 1): 0.5})     # a new prediction would differ
    assert _timer([], monkeypatch, seconds).times(GRIDS) == first
    # another configuration (here: its MGRIT options) is predicted anew, and kept apart
    other = _timer(["mgrit.fwd_iters=3"], monkeypatch, seconds).times(GRIDS)
    assert other == seconds and _timer([], monkeypatch, seconds).times(GRIDS) == first
    mg.forget_kept_times()                                  # lptrain-model --fresh
    assert _timer([], monkeypatch, seconds).times(GRIDS) == seconds


def test_options_the_times_do_not_depend_on_share_them(tmp_path, monkeypatch):
    """A sweep over mgrit.grad_tol (or tol, control, ...) with layer_ranks=auto timed this
    host's kernels again for every value, 10-40 s a job."""
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path))
    seconds = {Grid(1, 2): 1.0, Grid(2, 1): 2.0}
    first = _timer([], monkeypatch, seconds).times(GRIDS)
    seconds.update({Grid(1, 2): 3.0, Grid(2, 1): 0.5})
    for same in (["mgrit.grad_tol=0.01"], ["mgrit.tol=1e-8"],
                 ["mgrit.control=fixed", "mgrit.calibrate_every=5"]):
        assert _timer(same, monkeypatch, seconds).times(GRIDS) == first, same
    assert _timer(["mgrit.cfactor0=2"], monkeypatch, seconds).times(GRIDS) == seconds
    # the limits cap a solve's cycles (mgrit.max_iter=1: one), so the record: times of
    # the default configuration were taken from a run with max_iter=1 (0.0126 s/it
    # where its own were 0.0358)
    for other in (["mgrit.max_iter=1"], ["mgrit.adj_max_iter=1"],
                  ["mgrit.tol=0", "mgrit.rtol=0"]):       # fixed solves: max_iter cycles
        assert _timer(other, monkeypatch, seconds).times(GRIDS) == seconds, other


def test_the_command_is_told_before_kernels_are_timed_not_when_kept(tmp_path, monkeypatch):
    """The first start with layer_ranks=auto timed kernels for 20-35 s without a word."""
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path))
    seconds, said = {Grid(1, 2): 1.0, Grid(2, 1): 2.0}, []
    for _ in range(2):
        timer = _timer([], monkeypatch, seconds)
        timer.announce = said.append
        timer.times(GRIDS)
    assert said == ["predicting layer_ranks=auto's splits (once; kernels timed if new here)"]


def test_an_unreadable_kept_file_is_predicted_anew(tmp_path, monkeypatch):
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path))
    seconds = {Grid(1, 2): 1.0, Grid(2, 1): 2.0}
    _timer([], monkeypatch, seconds).times(GRIDS)
    (kept,) = (tmp_path / "grid_times").iterdir()
    kept.write_text("{not json")
    seconds[Grid(1, 2)] = 4.0
    assert _timer([], monkeypatch, seconds).times(GRIDS) == seconds


def test_lptrain_models_auto_column_reuses_its_records(tmp_path, monkeypatch):
    """The timers of timers_reusing(model) predict with that model (its records) when it
    models the configuration asked about, and with their own otherwise."""
    from lptrain.model_perf.cli import make_model
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path))
    opts, _ = compose(["mode=simultaneous", "network.layers=8"])
    net, theta, batch = build_network(opts)
    model = make_model(opts, net, theta, batch)
    used = []
    monkeypatch.setattr(mg, "measured_machine", lambda m, theta, times, *a: (None, ""))
    monkeypatch.setattr(mg.Model, "grid_time", lambda self, g, *a: used.append(self) or 1.0)
    mg.timers_reusing(model)(opts, net, "simultaneous").times(GRIDS)
    assert used and all(m is model for m in used)
    other, _ = compose(["mode=simultaneous", "network.layers=8", "mgrit.fwd_iters=3"])
    used.clear()
    mg.timers_reusing(model)(other, net, "simultaneous").times(GRIDS)
    assert used and all(m is not model for m in used)


def test_the_timers_notes_fit_the_console():
    """An unwritable cache's note was one line of 155 columns; then broken at a fixed 75,
    which a 60-column terminal broke again (held-out): one line per note, which the
    console breaks at its width."""
    from lptrain.metrics.console_text import broken
    from lptrain.parallel.auto import Recorded

    class Timer:
        note = ("this host's kernels timed now; not kept (/tmp/somewhere/cache cannot be "
                "written: Not a directory): each start predicts them again and may choose "
                "another split")
        assumed = "2 + 2 cycles a solve (mgrit.fwd_iters + adj_iters)"

        def times(self, grids):
            return {g: 1.0 + g.layer for g in grids}
    rec = Recorded(Timer())
    rec.times(GRIDS)
    lines = rec.notes(Grid(1, 2))
    assert lines[1:] == [f"  {Timer.note}", f"  {Timer.assumed}"]
    for width in (60, 80):
        parts = broken(lines[1], width)
        assert all(len(p) <= width for p in parts) and len(parts) > 1
        assert " ".join(p.strip() for p in parts) == Timer.note


def test_lptrain_model_names_the_overrides_it_cannot_depend_on():
    """mode=mgrit, parallel.layer_ranks=4 or mgrit.grad_tol=0.01 changed nothing it
    printed, without a word."""
    from lptrain.model_perf.grid import ignored
    typed = ["mode=mgrit", "parallel.layer_ranks=4", "mgrit.grad_tol=0.01", "mgrit.tol=0",
             "mgrit.max_iter=3", "mgrit.levels=2", "+mgrit.control=fixed", "seed=3"]
    assert ignored(typed) == ["mode=mgrit", "parallel.layer_ranks=4", "mgrit.grad_tol=0.01",
                              "mgrit.control=fixed"]


def test_two_first_starts_predict_alike_from_the_kept_glue(tmp_path, monkeypatch):
    """lptrain's own auto timer timed the records' glue afresh at every first start on a
    host (lptrain-model kept it): two starts could rank near-equal splits differently."""
    from helpers import fake_costs
    from lptrain.model_perf.predict import Machine
    from lptrain.model_perf.simulate import FREE_LINK
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path))
    opts, _ = compose(["mode=simultaneous", "network.layers=8", "dataset.n_train=40"])
    net, _, _ = build_network(opts)
    machine = Machine(fake_costs(40), FREE_LINK)
    monkeypatch.setattr(mg, "measured_machine",
                        lambda model, theta, times, *a: (machine, "measured now"))
    first = mg.MeasuredTimer(opts, net, "simultaneous")
    t1 = first.times(GRIDS)
    assert first.model.glue.timed > 0 and first.model.glue.unkept is None
    mg.forget_kept_times()                       # the next start predicts anew
    second = mg.MeasuredTimer(opts, net, "simultaneous")
    assert second.times(GRIDS) == t1
    assert second.model.glue.reused == first.model.glue.timed and second.model.glue.timed == 0



def test_a_kept_entry_edited_by_hand_is_predicted_anew(tmp_path, monkeypatch):
    """A kept entry naming a split of 3 ranks (or a negative time) for a 2-rank start
    was used as it stood: the run still took a valid split, but its note ranked the one
    from the file. An entry that is not one positive time per grid of the start is
    predicted again and kept afresh."""
    import json
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path))
    seconds = {Grid(1, 2): 1.0, Grid(2, 1): 2.0}
    _timer([], monkeypatch, seconds).times(GRIDS)
    kept, = (tmp_path / "grid_times").rglob("*.json")
    entry = json.loads(kept.read_text())
    for rows in ([[3, 1, 0.1], [2, 1, 2.0]], [[1, 2, -1.0], [2, 1, 2.0]], [[1, 2, 1.0]],
                 [[1, 2, 1.0], [1, 2, 0.5], [2, 1, 2.0]], [[1, 2, "0.01"], [2, 1, 2.0]],
                 [[1.9, 2, 1.0], [2, 1, 2.0]], [[1, 2, True], [2, 1, 2.0]]):
        kept.write_text(json.dumps({**entry, "times": rows}))
        assert _timer([], monkeypatch, seconds).times(GRIDS) == seconds, rows
        assert json.loads(kept.read_text())["times"] == [[1, 2, 1.0], [2, 1, 2.0]]
