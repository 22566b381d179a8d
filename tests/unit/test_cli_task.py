"""The Hydra task of the lptrain command, called in process: it returns the final
objective, which is what sweeper plugins (e.g. Optuna) minimise."""
import copy

import pytest
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from helpers import composed
from lptrain import cli
from lptrain.errors import REFUSED
from lptrain.metrics import schema as ms
from lptrain.metrics.reader import read_metrics

TINY = ["network.layers=4", "network.width=4", "dataset.n_train=100", "dataset.n_val=20",
        "train.iterations=3", "seed=2"]


def _job(tmp_path, overrides):
    cfg = composed(*overrides, hydra_node=True)
    OmegaConf.update(cfg, "hydra.runtime.output_dir", str(tmp_path), force_add=True)
    HydraConfig.instance().set_config(cfg)
    task = copy.deepcopy(cfg)
    with open_dict(task):
        del task["hydra"]
    return task


@pytest.mark.parametrize("mode", ["serial", "simultaneous"])
def test_task_returns_the_final_objective(mode, tmp_path):
    value = cli._task(_job(tmp_path, [*TINY, f"mode={mode}"]))
    m = read_metrics(tmp_path / ms.FILE_NAME)
    assert m.status == ms.COMPLETED
    assert isinstance(value, float)
    assert value == m.train[ms.OBJECTIVE][-1]


def test_task_returns_none_when_the_run_fails(tmp_path, capsys):
    failures = list(cli._failures)
    try:
        value = cli._task(_job(tmp_path, [*TINY, "dataset=indian_pines",
                                          "dataset.path=/nonexistent"]))
    finally:
        cli._failures[:] = failures
    assert value is None
    assert "lptrain: error: " in capsys.readouterr().err


def test_task_refuses_a_schema_node_a_sweeper_chose(tmp_path, capsys):
    """A job whose choices Hydra made without lptrain's pre-check (a sweeper plugin's)."""
    failures = list(cli._failures)
    try:
        value = cli._task(_job(tmp_path, [*TINY, "mode=mode_schema"]))
        refused = cli._failures[len(failures):]
    finally:
        cli._failures[:] = failures
    assert value is None and refused == [REFUSED]
    assert capsys.readouterr().err.startswith("lptrain: error: mode=mode_schema: the schema")
    assert not (tmp_path / ms.FILE_NAME).exists()
