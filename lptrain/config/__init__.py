"""The configuration: typed schema (schema.py) and where the YAML defaults live."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

# the Hydra config directory inside the installed package (lptrain/conf/)
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
CONF_MODULE = "lptrain.conf"      # the same, as Hydra's package path pkg://lptrain.conf


def compose(overrides: Sequence[str]):
    """(typed Config, plain dict) of the lptrain config with these overrides, without
    running Hydra's app (for tools and in-process runs); ConfigError if they are bad."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from lptrain.app import options
    from lptrain.config.schema import register_configs
    from lptrain.errors import ConfigError
    register_configs()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = hydra_compose(config_name="config", overrides=list(overrides))
        return options(cfg), OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(str(exc).strip().splitlines()[0]) from None
