"""The schema is complete, consistent, and docs/metrics.md is generated from it."""
import math
from pathlib import Path

import pytest

from lptrain.metrics import schema as s

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"

REQUIRED = {
    s.TRAIN: {"iteration", "objective", "loss", "accuracy", "grad_norm", "step_size",
              "step_time", "wall_time", "ls_trials", "lbfgs_skipped", "lbfgs_reset",
              "ls_failed"},
    s.VALIDATION: {"iteration", "loss", "accuracy"},
    s.MGRIT: {"iteration", "fwd_iterations", "fwd_residual", "adj_iterations",
              "adj_residual", "fwd_factor", "adj_factor", "adaptive_extra",
              "rung", "fwd_total", "adj_total", "fwd_history", "adj_history",
              "grad_error", "fwd_error", "adj_error", "fwd_plan", "adj_plan", "error_scale",
              "true_error", "unconverged", "refined"},
    s.TIMING: {"iteration", "world_size", "layer_ranks", "data_ranks", "compute",
               "communication", "waiting"},
    s.ROOT: {"lptrain_version", "mode", "world_size", "layer_ranks", "data_ranks", "seed",
             "config", "status",
             "dataset_source", "validation_set", "mgrit_levels", "error", "epoch_objective",
             "started_at", "threads"},
}


@pytest.mark.parametrize("location", list(REQUIRED))
def test_every_required_name_is_documented(location):
    assert set(s.FIELDS[location]) == REQUIRED[location]


@pytest.mark.parametrize("location", list(s.FIELDS))
def test_each_field_has_dtype_shape_and_meaning(location):
    for name, field in s.FIELDS[location].items():
        assert field.dtype in (s.INT, s.FLOAT, s.STR), name
        assert field.meaning and field.shape, name
        if location != s.ROOT:
            assert field.dtype != s.STR, name
            assert field.shape.startswith("("), name


def test_every_group_has_an_iteration_column():
    for group in s.GROUPS:
        assert s.fields_of(group)[0] == s.ITERATION
        assert s.FIELDS[group][s.ITERATION].dtype == s.INT


def test_two_dimensional_fields_are_the_histories_and_per_rank_times():
    two_d = {(g, n) for g in s.GROUPS for n, f in s.FIELDS[g].items() if f.ndim == 2}
    assert {f.ndim for g in s.GROUPS for f in s.FIELDS[g].values()} == {1, 2}
    assert {f.ndim for f in s.FIELDS[s.ROOT].values()} == {0}
    assert two_d == {(s.MGRIT, n) for n in s.HISTORIES} | {(s.TIMING, n) for n in s.PER_RANK}


def test_statuses_and_fill_values():
    assert s.STATUSES == ("running", "completed", "failed", "diverged", "interrupted",
                          "stalled")
    assert s.RUNNING not in s.FINAL_STATUSES
    assert set(s.REQUIRED_ATTRS) <= set(s.ROOT_ATTRS)
    assert s.FILL[s.INT] == -1 and math.isnan(s.FILL[s.FLOAT])


def test_metrics_file_error_is_an_oserror():
    assert issubclass(s.MetricsFileError, OSError)


def test_markdown_has_one_row_per_field():
    text = s.markdown()
    for location, fields in s.FIELDS.items():
        for name in fields:
            assert f"| `{name}` |" in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == sum(len(f) for f in s.FIELDS.values())


def test_docs_page_is_up_to_date():
    """Regenerate with: python -m lptrain.metrics.schema > docs/metrics.md"""
    assert DOC.read_text() == s.markdown()


def test_readmes_list_of_what_a_run_writes_names_every_field():
    """README's "What a run writes" left out mgrit/unconverged, which docs/metrics.md has."""
    text = (DOC.parents[1] / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## What a run writes"):]
    section = section[:section.index("\n#")]
    bullets = {s.ROOT: "- root attributes", **{g: f"- `{g}/`" for g in REQUIRED if g != s.ROOT}}
    for location, start in bullets.items():
        bullet = section[section.index(start):]
        bullet = bullet[:min(i for i in (bullet.find("\n- "), bullet.find("\n\n"),
                                         len(bullet)) if i >= 0)]
        missing = [name for name in s.FIELDS[location] if f"`{name}`" not in bullet]
        assert not missing, (location, missing)
