"""lptrain-report's figures: titles, axes, legends, and runs with nothing to draw."""
from pathlib import Path

import h5py
import numpy as np
import pytest

from helpers import fake_run
from lptrain.metrics import schema as s
from lptrain.metrics.reader import read_metrics
from lptrain.report.cli import find_metrics
from lptrain.report.labels import run_labels


def test_validation_rows_are_placed_at_their_wall_time(two_runs):
    from lptrain.report.plots import _x
    run = read_metrics(two_runs / "1" / s.FILE_NAME)
    np.testing.assert_allclose(_x(run, s.VALIDATION, s.WALL_TIME), [0.7, 0.9])
    np.testing.assert_array_equal(_x(run, s.VALIDATION, s.ITERATION), [2, 4])
    before = fake_run(two_runs / "2", s.MODE_SERIAL, 0.4)
    with h5py.File(before, "a", locking=False) as f:      # a validation before training
        f[s.VALIDATION][s.ITERATION][0] = 0
    np.testing.assert_allclose(_x(read_metrics(before), s.VALIDATION, s.WALL_TIME), [0, 2.1])


@pytest.fixture
def figures_of(two_runs, tmp_path):
    """The report's figures of two runs of the lptrain command with experiment=peaks_paper."""
    from lptrain.report.cli import report_context
    from lptrain.report.plots import figures
    for job in ("0", "1"):
        _hydra_record(two_runs / job, "peaks_paper")
    runs = [read_metrics(p) for p in find_metrics([two_runs])]
    return report_context(runs), figures(list(zip(run_labels(runs), runs)), report_context)


def test_figures_are_titled_with_dataset_experiment_and_modes(figures_of):
    context, figs = figures_of
    # the fake runs' config names no dataset
    assert context == "experiment=peaks_paper: serial, simultaneous"
    titles = {name: fig.get_suptitle() for name, fig in figs.items()}
    assert titles["loss_vs_iteration"] == f"Loss against optimizer iteration\n{context}"
    assert titles["accuracy_vs_wall_time"] == f"Accuracy against wall time\n{context}"
    # the MGRIT figures show only the runs with solves, and name only those
    assert titles["mgrit_residuals"] == ("MGRIT final residual (absolute norm) of each iteration's "
                                         "accepted point\n"
                                         "experiment=peaks_paper: simultaneous")


def test_a_long_context_wraps_inside_the_figure(two_runs):
    from lptrain.report.plots import figures
    from helpers import title_inside
    runs = [read_metrics(p) for p in find_metrics([two_runs])]
    context = ", ".join(f"experiment=my_own_experiment_{i}" for i in range(8)) + ": serial"
    figs = figures(list(zip(run_labels(runs), runs)), lambda _: context)
    assert figs and all(title_inside(fig) for fig in figs.values())
    assert all(fig.get_suptitle().replace("\n", " ").endswith(context) for fig in figs.values())


def _hydra_record(run_dir: Path, experiment: str) -> None:
    """The choices part of the .hydra/hydra.yaml the lptrain command writes."""
    hydra = run_dir / ".hydra"
    hydra.mkdir()
    (hydra / "hydra.yaml").write_text("hydra:\n  runtime:\n    choices:\n"
                                      f"      experiment: {experiment}\n      mode: mgrit\n")


def test_report_context_names_datasets_and_a_partial_experiment(tmp_path):
    from lptrain.report.cli import report_context
    paths = [fake_run(tmp_path / "a", s.MODE_MGRIT, 0.1), fake_run(tmp_path / "b", "serial", 1)]
    for path in paths:
        with h5py.File(path, "a", locking=False) as f:
            f.attrs[s.CONFIG] = "dataset:\n  name: indian_pines\nmode:\n  name: mgrit\n"
    _hydra_record(tmp_path / "b", "indian_pines_paper")
    assert report_context([read_metrics(p) for p in paths]) == \
        "indian_pines, experiment=indian_pines_paper (1 of 2 runs): mgrit, serial"
    # a cut problem says so: the data overrides both runs were typed with
    for run, n_val in (("a", 250), ("b", 100)):
        (tmp_path / run / ".hydra").mkdir(exist_ok=True)
        (tmp_path / run / ".hydra" / "overrides.yaml").write_text(
            f"- dataset.n_train=500\n- dataset.n_val={n_val}\n- mode=x\n")
    assert report_context([read_metrics(p) for p in paths]) == \
        "indian_pines, experiment=indian_pines_paper (1 of 2 runs), dataset.n_train=500: " \
        "mgrit, serial"


def test_log_axes_where_values_span_decades_and_zeros_left_out(tmp_path):
    """A loss from 1.4 to 0.8 on a log axis showed three tick labels, none above 1; an
    exact adjoint residual of 0 pulled the log axis down to 1e-32."""
    from lptrain.report.plots import figures
    path = fake_run(tmp_path / "run", s.MODE_MGRIT, 0.1)        # losses 0.5 .. 0.125
    with h5py.File(path, "a", locking=False) as f:
        f[s.MGRIT][s.ADJ_RESIDUAL][:] = [1e-3, 0.0, 1e-9, 1e-10]
    run = read_metrics(path)
    figs = figures([("a", run)])
    assert figs["loss_vs_iteration"].axes[0].get_yscale() == "linear"   # within a decade
    residuals = figs["mgrit_residuals"].axes[1]
    assert residuals.get_yscale() == "log" and residuals.get_ylim()[0] > 1e-12
    # the residual left out is said (the forward panel's are all positive)
    labels = [t.get_text() for t in figs["mgrit_residuals"].legends[0].get_texts()]
    assert labels == ["a (1 value of 0 not drawn on the log axis)"]


def test_a_run_no_panel_can_draw_says_so_in_the_legend(tmp_path):
    """mode=mgrit with one layer: its residuals are exactly 0 (not on a log axis) and its
    factors NaN, and the legend listed it beside no line at all."""
    from lptrain.report.plots import figures
    exact, other = (fake_run(tmp_path / name, s.MODE_MGRIT, 0.1) for name in "ab")
    with h5py.File(exact, "a", locking=False) as f:
        for name in (s.FWD_RESIDUAL, s.ADJ_RESIDUAL):
            f[s.MGRIT][name][:] = 0.0
        for name in (s.FWD_FACTOR, s.ADJ_FACTOR):
            f[s.MGRIT][name][:] = np.nan
    with h5py.File(other, "a", locking=False) as f:   # decades apart: log axes
        f[s.MGRIT][s.ADJ_RESIDUAL][:] = [1e-3, 1e-5, 1e-7, 1e-9]
    figs = figures([("exact", read_metrics(exact)), ("other", read_metrics(other))])
    for name in ("mgrit_residuals", "mgrit_factors"):
        labels = [t.get_text() for t in figs[name].legends[0].get_texts()]
        assert labels == ["exact (none drawn: 0 or NaN)", "other"], (name, labels)
    alone = figures([("exact", read_metrics(exact))])["mgrit_factors"]
    for ax in alone.axes:     # not matplotlib's -0.04..0.04 square: the run's iterations
        assert [t.get_text() for t in ax.texts] == ["nothing to draw: every value is 0 or NaN"]
        assert ax.get_xlim() == (1.0, 4.0) and not len(ax.get_yticks())


def test_a_run_stopped_before_its_first_iteration_says_so(tmp_path):
    """A run interrupted after iteration 0 drew empty axes and a legend entry with
    nothing to match it."""
    from lptrain.report.plots import figures
    empty = fake_run(tmp_path / "a", s.MODE_SERIAL, 0.1, n=0)
    figs = figures([("stopped", read_metrics(empty))])
    for name in ("loss_vs_iteration", "accuracy_vs_wall_time"):
        labels = [t.get_text() for t in figs[name].legends[0].get_texts()]
        assert labels == ["stopped (no iterations yet)"], (name, labels)
        assert [t.get_text() for t in figs[name].axes[0].texts] == ["no iterations yet"]


def test_a_diverged_or_killed_run_is_named_so_in_the_legend(tmp_path):
    """Only the table said which runs of a sweep diverged (held-out): a curve that ends
    early or jumps read as the run's result."""
    import h5py
    from lptrain.report.plots import figures
    runs = []
    for name, status, n in (("ok", s.COMPLETED, 4), ("bad", s.DIVERGED, 3),
                            ("cut", s.RUNNING, 2)):
        path = fake_run(tmp_path / name, s.MODE_SERIAL, 0.1, n=n)
        with h5py.File(path, "a") as f:
            f.attrs[s.STATUS] = status       # running with no process holding it: killed
        runs.append((name, read_metrics(path)))
    labels = [t.get_text() for t in figures(runs)["loss_vs_iteration"].legends[0].get_texts()]
    assert labels == ["ok", "bad (diverged)", "cut (killed)"]


def test_a_run_validated_at_0_and_stopped_shows_it_at_wall_time_0(tmp_path):
    """Its validation showed on the iteration axes but not on the wall-time ones, which
    spanned matplotlib's -0.04..0.04 around nothing (held-out, stop 64)."""
    from lptrain.metrics.writer import MetricsWriter
    from lptrain.report.plots import figures
    path = tmp_path / s.FILE_NAME
    with MetricsWriter(path, {s.MODE: s.MODE_SERIAL, s.WORLD_SIZE: 1, s.SEED: 0,
                              s.CONFIG: "{}\n"}) as w:
        w.log_validation(0, 2.3, 0.02)
    run = read_metrics(path)
    for name in ("loss_vs_wall_time", "accuracy_vs_wall_time"):
        ax = figures([("early", run)])[name].axes[0]
        assert [list(line.get_xdata()) for line in ax.lines[1:]] == [[0.0], [0.0]]
        assert ax.get_xlim() == (-0.05, 1.0) and not ax.texts


def test_a_run_of_one_iteration_shows_its_training_value(tmp_path):
    """A one-point line draws nothing: the training value of a 1-iteration run was
    invisible."""
    from lptrain.report.plots import figures
    one = fake_run(tmp_path / "a", s.MODE_SERIAL, 0.1, n=1)
    for name in ("loss_vs_iteration", "accuracy_vs_wall_time"):
        training = figures([("one", read_metrics(one))])[name].axes[0].lines[0]
        assert len(training.get_xdata()) == 1 and training.get_marker() not in ("None", None)


def test_validation_is_markers_training_is_lines(figures_of):
    _, figs = figures_of
    ax = figs["loss_vs_iteration"].axes[0]
    # each run: its training line, its validation markers' white outline, the markers
    train, outline, val = ax.lines[0], ax.lines[1], ax.lines[2]
    assert train.get_linestyle() == "-" and train.get_marker() in ("None", None, "")
    assert val.get_linestyle() == "None" and val.get_marker() == "o"
    # above every training line, their outlines below every marker: the markers hid in
    # a noisy mini-batch line of their own colour
    assert val.get_zorder() > outline.get_zorder() > train.get_zorder()
    assert outline.get_marker() == "o" and outline.get_color() == "white"
    assert ax.lines[5].get_marker() == "s"              # the other run's shape
    # and its own dashes: a run that follows another exactly hid behind it
    assert ax.lines[3].get_linestyle() == "--"
    from lptrain.report.plots import dashes
    styles = [dashes(i) for i in range(80)]      # runs i and i + 4 were alike
    assert styles[0] == "-" and all(offset == 0 for offset, _ in styles[1:])
    assert len({pattern for _, pattern in styles[1:]}) == 79     # no two drawn alike
    np.testing.assert_array_equal(val.get_xdata(), [2, 4])
    np.testing.assert_array_equal(train.get_xdata(), [1, 2, 3, 4])


def test_iteration_axes_tick_whole_iterations(figures_of):
    """A 4-iteration run's axis was ticked 0.5, 1.0, 1.5, ... (reproduce-mnist QUICK=1)."""
    _, figs = figures_of
    for name in ("loss_vs_iteration", "mgrit_residuals", "mgrit_factors"):
        for ax in figs[name].axes:
            ticks = ax.get_xticks()
            assert len(ticks) >= 2 and np.all(ticks == np.round(ticks)), (name, ticks)


def test_legends_sit_below_the_axes_covering_no_curve(figures_of):
    _, figs = figures_of
    for name, fig in figs.items():
        fig.canvas.draw()
        assert all(ax.get_legend() is None for ax in fig.axes), name
        (legend,) = fig.legends
        box = legend.get_window_extent()
        for ax in fig.axes:
            assert box.y1 <= ax.get_window_extent().y0, name    # wholly below every panel
        labels = [t.get_text().split(" (= ")[0] for t in legend.get_texts()]
        runs = ["simultaneous P=4"] if name.startswith("mgrit") else ["serial P=1",
                                                                     "simultaneous P=4"]
        assert labels[:len(runs)] == runs, name
    key = figs["loss_vs_iteration"].legends[0].get_title().get_text()
    assert "lines: training" in key and "markers: validation" in key


def test_small_mgrit_factors_are_written_alike_on_both_panels(tmp_path):
    """Forward factors to 1.75e-4 were ticked 0.000025 ... 0.000175, the adjoint's to
    1.4e-5 as 0.2 ... 1.4 with a 1e-5 beside them (held-out check)."""
    from lptrain.report.plots import figures
    path = fake_run(tmp_path / "run", s.MODE_MGRIT, 0.1)
    with h5py.File(path, "a", locking=False) as f:
        f[s.MGRIT][s.FWD_FACTOR][:] = [2.5e-5, 1.75e-4, 1e-4, 5e-5]
        f[s.MGRIT][s.ADJ_FACTOR][:] = [2e-6, 1.4e-5, 1e-5, 8e-6]
    fig = figures([("a", read_metrics(path))])["mgrit_factors"]
    fig.canvas.draw()
    offsets = [ax.yaxis.get_offset_text().get_text() for ax in fig.axes[:2]]
    assert offsets[0] == offsets[1] and "10^{\N{MINUS SIGN}4}" in offsets[0], offsets
    with h5py.File(path, "a", locking=False) as f:    # factors of 0.1: decimals
        f[s.MGRIT][s.FWD_FACTOR][:] = [0.1, 0.2, 0.15, 0.1]
    fig = figures([("a", read_metrics(path))])["mgrit_factors"]
    fig.canvas.draw()
    forward, adjoint = (ax.yaxis.get_offset_text().get_text() for ax in fig.axes[:2])
    assert forward == "" and "10^{\N{MINUS SIGN}5}" in adjoint, adjoint    # not 1e-5


@pytest.mark.parametrize("n", [3, 10, 15, 20, 30, 48])
def test_no_two_runs_of_a_report_share_a_colour(n):
    """With C{i % 10}, runs 0, 10 and 20 of a 30-job sweep were all blue, and the 15
    one-shot runs of an alternating sweep shared 5 colours in the MGRIT figures
    (held-out)."""
    from matplotlib.colors import to_hex
    from lptrain.report.plots import colour
    tints = [to_hex(colour(i, n)) for i in range(n)]
    assert len(set(tints)) == n
    if n <= 10:
        assert tints == [to_hex(f"C{i}") for i in range(n)]   # the familiar ten


def test_a_run_drawn_over_an_equal_one_says_so_in_the_legend(tmp_path):
    """make scaling's six runs, equal on every P, lay on one line in one colour and
    nothing said the others were under it (held-out, stop 67)."""
    from lptrain.report.plots import figures
    runs = [(name, read_metrics(fake_run(tmp_path / name, s.MODE_SERIAL, step, n=n)))
            for name, step, n in (("P=1", 0.1, 4), ("P=2", 0.15, 4), ("short", 0.1, 3),
                                  ("P=4", 0.1, 4))]
    figs = figures(runs)
    labels = [t.get_text() for t in figs["loss_vs_iteration"].legends[0].get_texts()]
    assert labels == ["P=1", "P=2 (= P=1)", "short", "P=4 (= P=1)"]
    labels = [t.get_text() for t in figs["loss_vs_wall_time"].legends[0].get_texts()]
    assert labels == ["P=1", "P=2", "short", "P=4 (= P=1)"]     # P=2 took longer


def test_runs_whose_solves_differ_by_rounding_say_so_in_the_mgrit_legends(tmp_path):
    """make scaling's one-shot runs on 1, 2 and 4 layer ranks lay on one line in the
    MGRIT figures (their residuals 1e-10 of themselves apart: another split's sums) and
    the legend said nothing, though the loss figure did; a run 1e-3 apart is its own."""
    from lptrain.report.plots import figures
    paths = [fake_run(tmp_path / name, s.MODE_SIMULTANEOUS, 0.1) for name in "abc"]
    for path, scale in zip(paths[1:], (1 + 1e-10, 1 + 1e-3)):
        with h5py.File(path, "a", locking=False) as f:
            for name in (s.FWD_RESIDUAL, s.ADJ_RESIDUAL):
                f[s.MGRIT][name][:] = f[s.MGRIT][name][:] * scale
    figs = figures([(name, read_metrics(p)) for name, p in zip("abc", paths)])
    labels = [t.get_text() for t in figs["mgrit_residuals"].legends[0].get_texts()]
    assert labels == ["a", "b (= a)", "c"]
    labels = [t.get_text() for t in figs["mgrit_factors"].legends[0].get_texts()]
    assert labels == ["a", "b (= a)", "c (= a)"]        # the factors were left alike
