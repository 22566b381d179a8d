"""lptrain-model, the speedup model's command: its table, plot and report, the measured
runs it compares and counts, and its refusals in one line (test_speedup_model.py: the
model itself).
"""
from __future__ import annotations

from pathlib import Path

import pytest

import lptrain.train.oracles  # noqa: F401  (at collection: h5py's first import runs uname)
from helpers import fake_costs
from lptrain.mgrit.options import MGRITOptions
from lptrain.model_perf.predict import Counts, Machine, Model
from lptrain.model_perf.simulate import FREE_LINK
from lptrain.parallel.grid import Grid

OPTS = MGRITOptions(levels=3, cfactor0=2, cfactor=2, tol=1e-9, max_iter=30)


# -- the command -------------------------------------------------------------------------------
def _no_measuring(monkeypatch, tmp_path):
    """Kept costs under tmp_path, made up where missing (the auto column's); the timer
    lptrain-model installs for it is uninstalled after the test."""
    from lptrain.parallel import auto
    monkeypatch.setattr(auto, "_factory", None)
    monkeypatch.setenv("LPTRAIN_CACHE", str(tmp_path / "cache"))

    def fake(net, theta, batch, kernels, device, neighbours=0, progress=None):
        alone = {(name, m, b): 1e-4 * m * b for name, m in kernels for b in (1, batch)}
        return alone, {key: 1.5 * t for key, t in alone.items()} if neighbours else {}
    monkeypatch.setattr("lptrain.model_perf.measure.measure_kernels", fake)


def test_command_writes_table_plot_and_compares_a_measured_run(tmp_path, monkeypatch,
                                                               capsys):
    import yaml
    _no_measuring(monkeypatch, tmp_path)

    from lptrain.metrics import schema as ms
    from lptrain.metrics.writer import open_writer
    from lptrain.model_perf import cli
    _, cfg = cli.compose(["experiment=peaks_paper", "dataset.grid=32"])
    run = tmp_path / "run" / ms.FILE_NAME
    run.parent.mkdir()
    attrs = {ms.MODE: "serial", ms.WORLD_SIZE: 1, ms.SEED: 0, ms.CONFIG: yaml.safe_dump(cfg)}
    with open_writer(run, attrs, enabled=True) as writer:
        for k in (1, 2, 3):   # the first iteration is left out; median of 0.18 s
            writer.log_train(iteration=k, step_time=0.5 if k == 1 else 0.18, ls_trials=1)
    # a run of another depth: its own row, not beside these lines (was averaged in)
    deeper = tmp_path / "deeper" / ms.FILE_NAME
    deeper.parent.mkdir()
    deep_cfg = {**cfg, "network": {**cfg["network"], "layers": 60}}
    with open_writer(deeper, {**attrs, ms.CONFIG: yaml.safe_dump(deep_cfg)},
                     enabled=True) as writer:
        for k in (1, 2, 3):
            writer.log_train(iteration=k, step_time=0.9, ls_trials=1)
    out = tmp_path / "model"
    titles = []
    monkeypatch.setattr(cli, "plot", lambda *a: titles.append(a[5]) or a[2])
    args = ["experiment=peaks_paper", "dataset.grid=32", "--step-time", "1e-3",
            "--adjoint-time", "1e-3", "--latency", "0", "--bandwidth", "1e30", "--ranks",
            "1,2,16", "--measured", str(run.parent), str(deeper.parent), "--paper",
            "--out", str(out)]
    assert cli.main(args) == 0
    text = (out / "speedup_model.md").read_text()
    # the plot names what it models (was the command alone)
    assert titles == ["lptrain-model experiment=peaks_paper dataset.grid=32\npeaks: dense, "
                      "N = 30, batch 5000, float64 on cpu; MGRIT 2 levels, cfactor 2 / 2"]
    # N = 30 with c = 2: 15 C-intervals, so P = 16 is refused
    assert "| 16 |" in text and "not possible (P > 15 C-intervals)" in text
    # serial on one rank: 30 forward steps, 30 adjoint steps and 30 weight products of 1 ms
    assert "speedups over serial on 1 rank (0.09 s)" in text
    assert "| serial | 1 | 0.18 | 0.09 | 0.50 |" in text
    assert "| serial 1x1 0.18 |" in text     # the measured column of the P = 1 row
    # the terminal: the same numbers in 80 columns, and where the files are
    captured = capsys.readouterr()
    shown = captured.out
    # while it works, what it is doing (it had been silent for minutes on peaks_deep)
    assert captured.err.splitlines() == [
        "lptrain-model: recording the modes on P = 1 to 16 (minutes for a deep network)",
        *(f"lptrain-model: P = {p} recorded ({i} of 3)" for i, p in enumerate((1, 2, 16), 1))]
    assert all(len(line) <= 80 for line in captured.err.splitlines())
    assert "speedup over serial on 1 rank (0.09 s)" in shown
    # each measured run named (a sweep's jobs could not be told apart)
    assert "run  serial 1x1: 0.18 s measured, 0.09 s predicted (0.50)" in shown.splitlines()
    assert any(line.startswith("deeper  serial 1x1: ") for line in shown.splitlines())
    assert f"full report: {out / 'speedup_model.md'}" in shown
    assert all(len(line) <= 80 for line in shown.splitlines() if str(tmp_path) not in line)


def test_measured_runs_are_named_below_their_common_directory():
    from types import SimpleNamespace as NS

    from lptrain.model_perf.summary import measured_lines, run_names
    assert run_names(["/s/0/metrics.h5", "/s/1/metrics.h5", "/s/a/b/metrics.h5"]) == \
        ["0", "1", "a/b"]
    assert run_names(["/x/run/metrics.h5"]) == ["run"]
    assert run_names(["/x/run/metrics.h5", "/x/run/metrics.h5"]) == ["run", "run"]
    long = NS(path="/s/" + "d" * 60 + "/metrics.h5", mode="simultaneous", ranks=2, layer=2,
              iteration_time=0.5)
    short = NS(path="/s/0/metrics.h5", mode="serial", ranks=1, layer=1, iteration_time=0.25)
    lines = measured_lines([(long, 0.25, "", []), (short, None, "", [])])
    assert lines[:3] == ["d" * 60, "    simultaneous 2x1: 0.5 s measured, 0.25 s predicted "
                         "(0.50)", "0  serial 1x1: 0.25 s measured, - predicted (-)"]
    assert all(len(line) <= 80 for line in lines)
    # a run of another config with figures of many digits: was one line of 81 characters
    slow = NS(path="/s/" + "e" * 60 + "/metrics.h5", mode="simultaneous", ranks=1, layer=1,
              iteration_time=0.02883)
    lines = measured_lines([(slow, 0.1342, "", ["dataset.name='mnist'"])])
    assert lines[1:3] == ["    simultaneous 1x1: 0.02883 s measured, 0.1342 s predicted (4.65),",
                          "      other config"]
    assert all(len(line) <= 80 for line in lines)


def test_command_reports_a_bad_override(capsys):
    from lptrain.model_perf import cli
    assert cli.main(["network.layers=-3", "--step-time", "1", "--adjoint-time", "1"]) == 2
    assert "network.layers" in capsys.readouterr().err


def test_command_refuses_half_given_costs(capsys, tmp_path):
    """Both refusals came after the model had recorded every P (minutes on a deep
    network), --out's as '[Errno 17] File exists'."""
    from lptrain.model_perf import cli
    assert cli.main(["--step-time", "1e-3", "--ranks", "1"]) == 2
    assert capsys.readouterr().err == (
        "lptrain-model: error: --step-time and --adjoint-time go together (with "
        "--weight-time, --overhead); give both or neither\n")     # nothing recorded
    (tmp_path / "file.txt").write_text("mine")
    assert cli.main(["--step-time", "1e-3", "--adjoint-time", "1e-3", "--latency", "0",
                     "--bandwidth", "1e9", "--out", str(tmp_path / "file.txt")]) == 2
    assert capsys.readouterr().err == (f"lptrain-model: error: --out {tmp_path}/file.txt: "
                                       f"a file; name a directory for the model's report\n")


GIVEN = ["--step-time", "1e-3", "--adjoint-time", "1e-3", "--ranks", "1"]


@pytest.mark.parametrize("args, fragment", [
    (["--step-time", "-1", "--adjoint-time", "1e-4"], "--step-time -1.0: need a finite "
                                                      "number above 0"),
    (["--step-time", "nan", "--adjoint-time", "1e-4"], "--step-time nan"),
    (["--step-time", "0", "--adjoint-time", "0"], "--step-time 0.0"),
    ([*GIVEN, "--latency", "1e-6", "--bandwidth", "0"], "--bandwidth 0.0"),
    ([*GIVEN, "--latency", "-1", "--bandwidth", "1e9"], "--latency -1.0"),
    ([*GIVEN, "--latency", "1e-6"], "--latency and --bandwidth go together"),
    ([*GIVEN, "--trials", "0"], "--trials 0.0: need a finite number at least 1"),
    ([*GIVEN, "--threads", "0"], "--threads 0"),
    ([*GIVEN, "--mgrit-iters", "0,0"], "--mgrit-iters '0,0': need at least 1 cycle"),
    ([*GIVEN, "--weight-time", "-1"], "--weight-time -1.0"),
])
def test_command_refuses_numbers_no_machine_has_in_one_line(capsys, args, fragment):
    """They gave 'max() arg is an empty sequence', a ZeroDivisionError traceback, or a
    prediction without its forward sweep (--trials 0)."""
    from lptrain.model_perf import cli
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err


def test_overrides_may_follow_the_options(tmp_path, monkeypatch, capsys):
    from lptrain.model_perf import cli
    _no_measuring(monkeypatch, tmp_path)
    monkeypatch.setattr(cli, "plot", lambda *a: a[2])
    import yaml
    from lptrain.metrics import schema as ms
    from lptrain.metrics.writer import open_writer
    run = tmp_path / "run" / ms.FILE_NAME
    run.parent.mkdir()
    attrs = {ms.MODE: "serial", ms.WORLD_SIZE: 1, ms.SEED: 0, ms.CONFIG: yaml.safe_dump({})}
    with open_writer(run, attrs, enabled=True) as writer:
        for k in (1, 2, 3):
            writer.log_train(iteration=k, step_time=0.1, ls_trials=1)
    # after --measured (nargs="+") too: it took mgrit.levels=2 for a path
    args = ["network.layers=32", *GIVEN, "--latency", "0", "--bandwidth", "1e30",
            "--out", str(tmp_path / "m"), "--measured", str(run.parent), "mgrit.levels=2"]
    assert cli.main(args) == 0
    assert "MGRIT: 2 levels with 32 / 8 steps" in (tmp_path / "m" / "speedup_model.md").read_text()


def test_a_run_too_short_to_time_is_named_not_dropped(tmp_path, capsys):
    import yaml
    from lptrain.metrics import schema as ms
    from lptrain.metrics.writer import open_writer
    from lptrain.model_perf import cli
    run = tmp_path / "short" / ms.FILE_NAME
    run.parent.mkdir()
    attrs = {ms.MODE: "serial", ms.WORLD_SIZE: 1, ms.SEED: 0, ms.CONFIG: yaml.safe_dump({})}
    with open_writer(run, attrs, enabled=True) as writer:
        writer.log_train(iteration=1, step_time=0.5, ls_trials=1)
    assert cli.load_runs([run.parent]) == []
    assert f"{run}: fewer than 2 iterations" in capsys.readouterr().err


def test_a_measured_run_resumed_on_another_rank_count_counts_its_latest_ranks(tmp_path):
    from lptrain.metrics import schema as ms
    from lptrain.metrics.writer import open_writer
    from lptrain.model_perf.runs import load_run, mismatch
    path = tmp_path / ms.FILE_NAME
    attrs = {ms.MODE: "mgrit", ms.WORLD_SIZE: 2, ms.SEED: 0, ms.CONFIG: "seed: 0\n",
             ms.THREADS: 1}
    with open_writer(path, attrs, enabled=True) as writer:
        for k in (1, 2, 3):
            writer.log_train(iteration=k, step_time=1.0, ls_trials=1)
            writer.log_timing(k, [1.0] * 2, [0.0] * 2, [0.0] * 2)
    with open_writer(path, {**attrs, ms.WORLD_SIZE: 1, ms.THREADS: 2}, True, 3) as writer:
        for k in (4, 5, 6):      # on one rank: the first of these is left out too
            writer.log_train(iteration=k, step_time=0.5 if k == 4 else 2.0, ls_trials=1)
            writer.log_timing(k, [1.0], [0.0], [0.0])
    run = load_run(path)
    assert (run.ranks, run.iteration_time, run.threads) == (1, 2.0, 2)
    # one rank on two cores runs two threads: not the one-thread ranks the model times
    # (make scaling's P = 1 run measured 0.24 s against 0.43 predicted, before it set
    # OMP_NUM_THREADS=1)
    assert mismatch(run, {"seed": 0}, threads=1) == ["threads=2 (model 1)"]
    assert mismatch(run, {"seed": 0}, threads=2) == []


def test_a_measured_run_of_another_activation_or_bias_is_flagged():
    """Runs of the default network (tanh, vector bias) measured beside a model of
    experiment=peaks_paper (smooth ReLU, scalar bias) were not flagged, though both
    change what a step costs (held-out check)."""
    from lptrain.config import compose
    from lptrain.model_perf.runs import MeasuredRun, mismatch
    _, default = compose([])
    _, paper = compose(["experiment=peaks_paper"])
    run = MeasuredRun(Path("run"), "mgrit", 1, 1.0, 1.0, 2.0, 2.0, default)
    flagged = mismatch(run, paper, threads=1)
    assert "network.activation='tanh'" in flagged and "network.bias='vector'" in flagged
    assert mismatch(run, default, threads=1) == []


def test_lptrain_model_prints_the_split_auto_takes(tmp_path, monkeypatch):
    # both from this host's kept costs (here made up, and kept under tmp_path)
    from lptrain.data.base import dataset_sizes
    from lptrain.model_perf import cli
    from lptrain.preflight import auto_grid
    _no_measuring(monkeypatch, tmp_path)
    # each record also times its own glue: zero here, or the two sides see different loads
    monkeypatch.setattr("lptrain.model_perf.record.time.thread_time", lambda: 0.0)
    over = ["network.layers=64", "dataset.n_train=60"]
    # the costs auto decides on: measured alone (no forked neighbours in this tier)
    assert cli.main([*over, "--ranks", "4,8", "--host-ranks", "1", "--out", str(tmp_path)]
                    ) == 0
    text = (tmp_path / "speedup_model.md").read_text().split("## Layer x data split")[1]
    opts, _ = cli.compose(over)
    net, _, _ = cli.build_network(opts)
    for p in (4, 8):
        row = next(line for line in text.splitlines() if line.startswith(f"| {p} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        for col, mode in ((1, "mgrit"), (3, "simultaneous")):
            g = auto_grid(opts, dataset_sizes(opts.dataset), net, p, mode)
            assert cells[col] == f"{g.layer} x {g.data}", (p, mode, row)
            assert cells[col + 1].startswith(cells[col]), row     # the same costs


def test_simultaneous_cycles_come_from_measured_runs_where_there_are_some():
    """mgrit.control=error plans the one-shot cycles; the curve for every P takes what
    the measured simultaneous runs took, else the options' fixed fwd_iters / adj_iters."""
    from types import SimpleNamespace

    from helpers import dense_net
    from lptrain.model_perf import cli
    from lptrain.model_perf.runs import MeasuredRun
    net, _ = dense_net(layers=12)
    model, m = Model(net, OPTS, batch=40), Machine(fake_costs(40), FREE_LINK)
    args = SimpleNamespace(trials=None, mgrit_iters=None)

    def run(mode, fwd, adj):
        return MeasuredRun(Path("x"), mode, 1, 1.0, 1.0, fwd, adj, {})
    cnt, note = cli.counts(args, [run("simultaneous", 2.5, 3.0), run("simultaneous", 3.5, 3.0),
                                  run("mgrit", 6.0, 4.0)])
    assert cnt.simultaneous(OPTS) == (3.0, 3.0) and (cnt.mgrit_fwd, cnt.mgrit_adj) == (6, 4)
    assert "simultaneous cycles: mean of measured simultaneous runs" in note
    assert model.grid_time(Grid(2, 1), "simultaneous", m, cnt) == \
        model.grid_time(Grid(2, 1), "simultaneous", m, Counts(), (3.0, 3.0))
    bare, _ = cli.counts(args, [])
    assert bare.simultaneous(OPTS) == (OPTS.fwd_iters, OPTS.adj_iters)


def test_only_runs_of_the_modelled_configuration_give_the_counts():
    """Runs of another dataset given with --measured were flagged 'other config' in
    the comparison, yet their cycles and trials set every predicted P."""
    from types import SimpleNamespace

    from helpers import dense_net
    from lptrain.model_perf import cli
    from lptrain.model_perf.runs import MeasuredRun
    net, _ = dense_net(layers=12)
    model = Model(net, OPTS, batch=40)
    cfg = {"network": {"name": "dense", "width": 4}, "dataset": {"name": "peaks"},
           "optimizer": {"name": "lbfgs"}}
    ours = MeasuredRun(Path("a"), "simultaneous", 1, 1.0, 1.0, 2.0, 2.0, cfg)
    other = MeasuredRun(Path("b"), "simultaneous", 1, 1.0, 3.0, 6.0, 6.0,
                        {**cfg, "dataset": {"name": "mnist"}})
    adam = MeasuredRun(Path("c"), "simultaneous", 1, 1.0, 1.0, 6.0, 6.0,
                       {**cfg, "optimizer": {"name": "adam"}})
    assert cli.of_config([ours, other, adam], model, cfg) == [ours]
    cnt, note = cli.counts(SimpleNamespace(trials=None, mgrit_iters=None), [ours], 1)
    assert cnt.simultaneous(OPTS) == (2.0, 2.0) and cnt.trials == 1.0
    assert note.endswith("1 measured run of another config not counted")


def test_far_apart_large_rank_counts_get_labels_that_do_not_overlap():
    """--ranks 1,4096,10000 printed '409610000' under both x axes."""
    from lptrain.model_perf.predict import Prediction
    from lptrain.model_perf.report import figure
    preds = [Prediction(p, 1.0 / p, 2.0 / p, 1.5 / p) for p in (1, 4096, 10000)]
    fig = figure(preds, 1.0)
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes[:2]:
        boxes = [t.label1.get_window_extent(renderer) for t in ax.xaxis.get_major_ticks()
                 if t.label1.get_visible() and t.label1.get_text()
                 and ax.get_xlim()[0] <= t.get_loc() <= ax.get_xlim()[1]]
        assert len(boxes) >= 2
        assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:]))
    few = figure([Prediction(p, 1.0 / p, 2.0 / p, 1.5 / p) for p in (1, 2, 4, 8)], 1.0)
    assert [t.get_loc() for t in few.axes[0].xaxis.get_major_ticks()] == [1, 2, 4, 8]


def test_the_plots_title_wraps_a_long_command_inside_the_figure():
    """The title is the command, which a custom step's overrides make long."""
    from helpers import title_inside
    from lptrain.model_perf.predict import Prediction
    from lptrain.model_perf.report import figure
    command = "lptrain-model " + " ".join(f"+network.step.option_{i}=${{network.width}}"
                                          for i in range(8))
    fig = figure([Prediction(1, 1.0, 2.0, 1.5), Prediction(2, 0.5, 1.0, 0.8)], 1.0,
                 title=command)
    assert title_inside(fig)
    assert fig.get_suptitle().replace("\n", " ") == command
    fig = figure([Prediction(1, 1.0, 2.0, 1.5)], 1.0, title="a\nb")    # lines kept
    assert fig.get_suptitle() == "a\nb"


def test_the_plot_draws_the_auto_split_and_says_what_it_left_out():
    """With --paper at P = 256 the mgrit and simultaneous lines ended at P = 8 (their
    P x 1 splits), though the table predicts the split auto takes up to 256; measured
    runs of another configuration were left out of the figure unsaid (held-out
    check)."""
    from lptrain.model_perf.predict import Prediction
    from lptrain.model_perf.report import figure
    preds = [Prediction(1, 1.0, 2.0, 1.5), Prediction(2, 0.5, 1.0, 0.8),
             Prediction(4, 0.3, None, None)]
    auto = {(1, "mgrit"): 2.0, (2, "mgrit"): 1.0, (4, "mgrit"): 0.6,
            (1, "simultaneous"): 1.5, (2, "simultaneous"): 0.8, (4, "simultaneous"): 0.5}
    fig = figure(preds, 1.0, auto=auto, left_out=2)
    for ax in fig.axes:
        dashed = {ln.get_label(): list(ln.get_xdata()) for ln in ax.lines
                  if ln.get_linestyle() == "--"}
        assert dashed == {"mgrit, auto split (model)": [1, 2, 4],
                          "simultaneous, auto split (model)": [1, 2, 4]}
    named = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "2 measured runs of other settings: not drawn" in named
    assert not any("not drawn" in t.get_text() for ax in figure(preds, 1.0).axes
                   for t in ax.get_legend().get_texts())


def test_a_measured_speedup_without_a_measured_serial_run_says_its_baseline():
    """With no serial run on one rank the measured points' speedups are over the model's
    serial time; the legend called them 'measured' alone (held-out check)."""
    from lptrain.model_perf.predict import Prediction
    from lptrain.model_perf.report import figure
    preds = [Prediction(1, 1.0, 2.0, 1.5), Prediction(2, 0.5, 1.0, 0.8)]
    fig = figure(preds, 1.0, {("simultaneous", 2, "2x1"): [0.5]})
    ax_t, ax_s = fig.axes
    named = [t.get_text() for t in ax_s.get_legend().get_texts()]
    assert "simultaneous (measured, over the model's serial)" in named
    assert [float(y) for ln in ax_s.lines if ln.get_marker() == "o"
            for y in ln.get_ydata()] == [2.0]
    assert "simultaneous (measured)" in [t.get_text() for t in ax_t.get_legend().get_texts()]


def test_a_run_of_another_configuration_is_not_predicted(monkeypatch):
    """A run of another batch was 'predicted' with the modelled configuration's kernel
    costs (0.57 of its time, read as a result; held-out check)."""
    from helpers import dense_net
    from lptrain.model_perf import cli
    from lptrain.model_perf.report import comparison_table
    from lptrain.model_perf.runs import MeasuredRun
    net, _ = dense_net(layers=12)
    model = Model(net, OPTS, batch=40)
    cfg = {"network": {"name": "dense", "width": 4}, "dataset": {"name": "peaks"},
           "train": {"batch_size": None}, "optimizer": {"name": "lbfgs"}}
    other = MeasuredRun(Path("b"), "serial", 1, 0.5, 1.0, 0.0, 0.0,
                        {**cfg, "train": {"batch_size": 500}})
    monkeypatch.setattr("lptrain.model_perf.runs.predict_run",
                        lambda *a: pytest.fail("predicted with another's costs"))
    measured, rows = cli._compare([other], model, None, cfg)
    assert measured == {} and rows[0][1] is None
    text = comparison_table(rows)
    assert "| - | - | another configuration, not predicted" in text and "500" in text


def test_the_plot_keeps_measured_runs_apart_by_split_and_baseline():
    """Runs of 1 x 2 and 2 x 1 were averaged into one circle on the P x 1 line; measured
    speedups were over the predicted serial time (a measured serial run on one rank sat
    at 0.43 over itself); --paper starred all three datasets; log ticks read 4×10⁻¹."""
    from lptrain.model_perf.predict import Prediction
    from lptrain.model_perf.report import figure
    preds = [Prediction(1, 1.0, 2.0, 1.5), Prediction(2, 0.5, 1.0, 0.8)]
    measured = {("serial", 1, "1x1"): [2.0], ("simultaneous", 2, "2x1"): [1.0],
                ("simultaneous", 2, "1x2"): [4.0]}
    fig = figure(preds, 1.0, measured, paper=True, dataset="peaks")
    ax_t, ax_s = fig.axes
    points = {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata()),
                               ln.get_markerfacecolor()) for ln in ax_t.lines}
    assert points["simultaneous (measured)"][:2] == ([2], [1.0])
    simul = points["simultaneous (measured, not P x 1)"]
    assert simul[:2] == ([2], [4.0]) and simul[2] == "none"
    speedups = sorted((float(x), float(y)) for ln in ax_s.lines if ln.get_marker() == "o"
                      for x, y in zip(ln.get_xdata(), ln.get_ydata()))
    # over the measured serial run (2 s): itself 1, the 2 x 1 run 2, the 1 x 2 run 0.5
    assert speedups == [(1.0, 1.0), (2.0, 0.5), (2.0, 2.0)]
    # the speedup panel's legend names its measured points too (it had none)
    named = [t.get_text() for t in ax_s.get_legend().get_texts()]
    assert "simultaneous (measured)" in named and "serial (measured)" in named
    stars = [ln.get_label() for ln in ax_s.lines if ln.get_marker() == "*"]
    assert stars == ["paper: Peaks 6.0× on 256 cores"]
    fig.canvas.draw()            # its P is a tick of the speedup panel (it had none)
    assert [t.get_text() for t in ax_s.get_xticklabels()] == ["1", "2", "256"]
    fig.canvas.draw()
    labels = [t.get_text() for t in ax_t.get_xticklabels() + ax_s.get_yticklabels()]
    assert "×10" not in "".join(labels) and "^" not in "".join(labels), labels
    # the legends below the axes (inside, one covered a line and a measured point), and
    # every P labelled (a P of 3 had no tick)
    for ax in (ax_t, ax_s):
        legend, box = ax.get_legend().get_window_extent(), ax.get_window_extent()
        assert legend.y1 <= box.y0
    odd = figure([Prediction(p, 1.0 / p, 2.0 / p, 1.5 / p) for p in (1, 2, 3, 4)], 1.0)
    odd.canvas.draw()
    assert [t.get_text() for t in odd.axes[0].get_xticklabels()] == ["1", "2", "3", "4"]
    # within a decade the y axes keep labels (0.035-0.08 s had none)
    narrow = figure([Prediction(1, 0.08, 0.07, 0.06), Prediction(2, 0.05, 0.04, 0.035)], 0.08)
    narrow.canvas.draw()
    for ax in narrow.axes:
        lo, hi = ax.get_ylim()
        shown = [t for t, v in zip(ax.get_yticklabels(), ax.get_yticks()) if lo <= v <= hi]
        assert len([t for t in shown if t.get_text()]) >= 2, [t.get_text() for t in shown]


def test_a_key_the_configuration_lacks_is_named_with_hydras_reason(capsys):
    """`lptrain-model foo=1` said only Hydra's first line, 'Could not override 'foo'.'"""
    from lptrain.model_perf import cli
    assert cli.main(["foo=1", "--ranks", "1"]) == 2
    assert capsys.readouterr().err == ("lptrain-model: error: foo: no such key (lptrain "
                                       "--cfg job shows them)\n")


def _clock(step: float):
    """A thread clock that advances `step` seconds at every reading (a glue timer on a
    machine as loaded as `step` says)."""
    now = [0.0]

    def read():
        now[0] += step
        return now[0]
    return read


def test_two_predictions_from_the_same_kept_costs_are_equal(tmp_path, monkeypatch):
    # the second start times the records' glue on a busier machine: it was charged
    # as timed, and P = 1 simultaneous moved by 7 % and an adjoint cycle's column by half
    from lptrain.model_perf import cli
    _no_measuring(monkeypatch, tmp_path)
    over = ["network.layers=32", "dataset.n_train=60", "--ranks", "1,4", "--host-ranks", "1"]
    tables = []
    for k, step in enumerate((1e-6, 3e-6)):
        monkeypatch.setattr("lptrain.model_perf.record.time.thread_time", _clock(step))
        assert cli.main([*over, "--out", str(tmp_path / str(k))]) == 0
        text = (tmp_path / str(k) / "speedup_model.md").read_text()
        tables.append(text.split("Predicted ")[1])
    assert tables[1] == tables[0]
    assert "glue timed now" in (tmp_path / "0" / "speedup_model.md").read_text()
    assert "glue kept" in text
    monkeypatch.setattr("lptrain.model_perf.record.time.thread_time", _clock(3e-6))
    assert cli.main([*over, "--fresh", "--out", str(tmp_path / "fresh")]) == 0
    fresh = (tmp_path / "fresh" / "speedup_model.md").read_text()
    assert "glue timed now" in fresh and fresh.split("Predicted ")[1] != tables[0]


@pytest.mark.parametrize("rank, said", [("0", True), ("1", False)])
def test_lptrain_model_under_another_mpis_launcher_says_so_once(monkeypatch, capsys, rank,
                                                                said):
    """Under Open MPI's mpirun it started MPICH's MPI, which aborted in 43 lines."""
    from lptrain.model_perf import cli
    from lptrain.parallel import context
    # the library's name without importing mpi4py's MPI: mpi_library() imports it
    # uninitialised, which would leave MPI unusable to this worker's later tests
    monkeypatch.setattr(context, "mpi_library", lambda: "MPICH 5.0.2")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", rank)
    args = ["--ranks", "2", "--step-time", "1e-5", "--adjoint-time", "1e-5"]
    if said:
        assert cli.main(args) == 2
    else:                              # the other ranks end at once, as quietly
        with pytest.raises(SystemExit) as ended:
            cli.main(args)
        assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("lptrain-model: error: started by Open MPI's launcher "
                          "(OMPI_COMM_WORLD_SIZE is set)") == said
    assert ("/lptrain-model ... (or " in err) == said and err.count("\n") == said


def test_an_auto_split_on_the_models_line_is_said_not_drawn_under_it():
    """make scaling's plot (peaks_deep, P = 1, 2, 4: auto takes P x 1 every time) named
    two dashed auto-split lines in its legends that lay hidden under the solid ones."""
    from lptrain.model_perf.predict import Prediction
    from lptrain.model_perf.report import figure
    preds = [Prediction(1, 1.0, 2.0, 1.5), Prediction(2, 0.5, 1.0, 0.8)]
    auto = {(1, "mgrit"): 2.0, (2, "mgrit"): 1.0,               # P x 1: the line
            (1, "simultaneous"): 1.5, (2, "simultaneous"): 0.7}   # 1 x 2 at P = 2
    for ax in figure(preds, 1.0, auto=auto).axes:
        dashed = [ln.get_label() for ln in ax.lines if ln.get_linestyle() == "--"]
        assert dashed == ["simultaneous, auto split (model)"]
        named = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "mgrit (model; also the auto split)" in named
        assert "simultaneous (model)" in named
