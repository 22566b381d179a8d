"""logger=tensorboard: the scalars of metrics.h5 as TensorBoard events, or a clear error."""
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from lptrain import app, cli
from lptrain.config.schema import register_configs
from lptrain.errors import ConfigError, MissingPackageError
from lptrain.metrics import schema as ms
from lptrain.metrics import tensorboard
from lptrain.metrics.reader import read_metrics

TINY = ["network.layers=4", "network.width=4", "dataset.n_train=100", "dataset.n_val=20",
        "train.iterations=4", "eval_every=2", "seed=1", "mgrit.levels=2", "mgrit.cfactor0=2"]


def _cfg(*overrides):
    register_configs()
    with initialize_config_dir(config_dir=str(Path(cli.CONF_DIR)), version_base="1.3"):
        return compose(config_name="config", overrides=[*TINY, *overrides])


def test_scalars_equal_the_metrics_file(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    app.run(_cfg("logger=tensorboard", "mode=simultaneous"), None, tmp_path)
    m = read_metrics(tmp_path / ms.FILE_NAME)
    events = EventAccumulator(str(tmp_path / tensorboard.DIR_NAME))
    events.Reload()
    for tag, group, field in [("train/objective", m.train, ms.OBJECTIVE),
                              ("train/grad_norm", m.train, "grad_norm"),
                              ("validation/accuracy", m.validation, ms.ACCURACY),
                              ("mgrit/fwd_residual", m.mgrit, ms.FWD_RESIDUAL)]:
        got = events.Scalars(tag)
        np.testing.assert_array_equal([e.step for e in got], group[ms.ITERATION])
        # TensorBoard stores float32
        np.testing.assert_allclose([e.value for e in got], group[field], rtol=1e-6)
    assert not any(t.endswith("history") for t in events.Tags()["scalars"])


def test_missing_tensorboard_is_a_one_line_error_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(tensorboard.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingPackageError,
                       match=r"logger=tensorboard: .*pip install 'lptrain\[tensorboard\]'"):
        app.run(_cfg("logger=tensorboard"), None, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unknown_logger_is_refused():
    with pytest.raises(ConfigError, match="logger"):
        app.options(_cfg("logger=wandb"))
