"""Settings a run does not read (config/inert.py): which typed keys are named, and that
each rule is true: a run with the keys changed is bitwise the run without them."""
import numpy as np
import pytest

from helpers import composed
from lptrain import app, title_notes
from lptrain.config.inert import RULES, Built, unused, unused_notes
from lptrain.config.meanings import KEYS
from lptrain.metrics import schema as ms
from lptrain.config import override_key
from lptrain.metrics.reader import read_metrics
from lptrain.parallel.grid import Grid

SMALL = ["network.layers=8", "network.width=4", "dataset.n_train=200", "dataset.n_val=50",
         "seed=5", "eval_every=2", "train.iterations=4"]
IMAGES = ["dataset=mnist", "network=conv", "network.layers=4", "dataset.n_train=40",
          "dataset.n_val=20", "seed=5", "eval_every=2", "train.iterations=3",
          "train.batch_size=20"]
CUSTOM = ["network=custom", "network.step._target_=custom_step_pkg.DenseStep",
          "+network.step.width=4", "+network.step.hidden=3", "network.width=4",
          "network.layers=8", "dataset.n_train=120", "dataset.n_val=40", "seed=5",
          "eval_every=2", "train.iterations=3"]
# (the run, the overrides it does not read)
CASES = {
    "serial": (SMALL + ["mode=serial"],
               ["mgrit=paper", "mgrit.levels=2", "mgrit.nrelax0=1", "mgrit.cfactor0=2"]),
    "mgrit": (SMALL + ["mode=mgrit"],
              ["mgrit.fwd_iters=1", "mgrit.adj_iters=5", "mgrit.control=fixed",
               "mgrit.grad_tol=1e-7", "mgrit.control_min_iters=2",
               "mgrit.control_max_iters=9", "mgrit.calibrate_every=1", "mgrit.adaptive=true",
               "mgrit.adaptive_ratio=1e-9", "mgrit.adaptive_max_extra=7"]),
    "one level": (SMALL + ["mode=simultaneous", "mgrit.levels=1"],
                  ["mgrit.cfactor=2", "mgrit.nrelax=3", "mgrit.cycle=F", "mgrit.nrelax0=2",
                   "mgrit.coarse_weights=inject", "mgrit.warm_down=false",
                   "mgrit.skip_first_down=false", "mgrit.level_ops=plain",
                   # ... and the solves' limits and plans: one sweep solves (held-out)
                   "mgrit.tol=1e-3", "mgrit.max_iter=1", "mgrit.fwd_iters=5",
                   "mgrit.adj_iters=1", "mgrit.control=fixed", "mgrit.grad_tol=1e-9",
                   "mgrit.calibrate_every=1"]),
    "two levels": (SMALL + ["mode=simultaneous", "mgrit.levels=2"],
                   ["mgrit.cfactor=2", "mgrit.nrelax=3", "mgrit.cycle=F"]),
    "fixed": (SMALL + ["mode=simultaneous", "mgrit.control=fixed"],
              ["mgrit.grad_tol=1e-9", "mgrit.control_min_iters=3",
               "mgrit.control_max_iters=9"]),
    "not adaptive": (SMALL + ["mode=simultaneous"],
                     ["mgrit.adaptive_ratio=1e-9", "mgrit.adaptive_max_extra=9"]),
    "full batch": (SMALL + ["mode=simultaneous"], ["mode.warm_batches=1"]),
    "mgrit batches": (SMALL + ["mode=mgrit", "optimizer=adam", "train.batch_size=50"],
                      ["mode.warm_batches=1"]),
    "constant rate": (SMALL + ["optimizer=adam"], ["optimizer.lr_min=0.001"]),
    "vectors": (SMALL, ["network.channels=7"]),
    "images": (IMAGES, ["network.width=3"]),
    "custom": (CUSTOM, ["network.bias=vector", "network.init_hidden=0.5"]),
}


def _built(opts, overrides):
    """What app.run's heading passes: images or not, the hierarchy's levels on 1 rank."""
    steps = title_notes.level_steps(opts, Grid(1, 1))
    return Built("dataset=mnist" in overrides, None if steps is None else len(steps))


def _named(base, extra):
    opts = app.options(composed(*base, *extra))
    return [o for typed, _ in unused(opts, base + extra, _built(opts, base)) for o in typed]


@pytest.mark.parametrize("case", list(CASES))
def test_each_unused_override_is_named(case):
    base, extra = CASES[case]
    assert _named(base, extra) == extra


def test_read_settings_are_not_named():
    assert _named(SMALL + ["mode=simultaneous"],
                  ["mgrit.grad_tol=1e-4", "mgrit.levels=2", "mode.warm_batches=2"]) \
        == ["mode.warm_batches=2"]
    assert _named(SMALL + ["mode=mgrit"], ["mgrit.levels=2", "mgrit.tol=1e-8"]) == []
    # three levels read the coarser settings; two levels read the finest one's
    assert _named(SMALL + ["mode=mgrit", "network.layers=32"],
                  ["mgrit.cfactor=2", "mgrit.nrelax=3", "mgrit.cycle=F"]) == []
    assert _named(SMALL + ["mode=mgrit", "mgrit.levels=2"],
                  ["mgrit.nrelax0=1", "mgrit.coarse_weights=inject", "mgrit.cfactor0=2"]) == []
    assert _named(SMALL + ["optimizer=adam", "optimizer.schedule=cosine"],
                  ["optimizer.lr_min=0.001"]) == []


def test_every_rule_is_checked_by_a_case_and_names_real_keys():
    typed = {override_key(o) for _, extra in CASES.values() for o in extra}
    for rule in RULES:
        assert any(rule.covers(key) for key in typed), rule.keys
        for key in rule.keys:
            assert key.endswith(".") or key in KEYS, key


def test_one_note_per_rule_names_every_override_it_covers():
    """One line per rule: the console breaks it at its width (test_metrics_console_progress)."""
    opts = app.options(composed(*SMALL, "mode=serial"))
    lines = unused_notes(opts, [f"+mgrit.key{i}=value{i}" for i in range(12)], Built())
    assert lines == ["not used: " + " ".join(f"mgrit.key{i}=value{i}" for i in range(12))
                     + " (mode=serial runs no MGRIT)"]


def _objectives(path, overrides):
    path.mkdir()
    app.run(composed(*overrides), None, path)
    return read_metrics(path / ms.FILE_NAME).train[ms.OBJECTIVE]


@pytest.mark.parametrize("case", list(CASES))
def test_a_run_does_not_read_them(case, tmp_path):
    base, extra = CASES[case]
    without = _objectives(tmp_path / "without", base)
    with_them = _objectives(tmp_path / "with", base + extra)
    assert len(without) == len(with_them) > 1
    np.testing.assert_array_equal(with_them, without)


def test_a_read_setting_changes_the_run(tmp_path):
    """The comparison above can fail: a key the run reads moves its objectives."""
    base = SMALL + ["mode=simultaneous"]
    without = _objectives(tmp_path / "without", base)
    with_it = _objectives(tmp_path / "with", base + ["mgrit.grad_tol=1e-6"])
    assert not np.array_equal(with_it, without)


def test_the_run_names_them_under_its_title(tmp_path, capsys):
    base, extra = CASES["serial"]
    app.run(composed(*base, *extra), None, tmp_path, typed=base + extra)
    out = capsys.readouterr().out
    assert "not used: mgrit=paper mgrit.levels=2 mgrit.nrelax0=1 mgrit.cfactor0=2" in out
    assert out.index("serial peaks N=8") < out.index("not used:") < out.index("summary")
