"""Where a command's configuration comes from: lptrain's config directory, or the user's
own (Hydra's --config-name, --config-path and --config-dir), set up for the compose API
the way the `lptrain` command's Hydra sets it up for the run."""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

# the module whose hydra.main the command runs: a relative --config-path is read from it
ENTRY_MODULE = "lptrain.cli"
CONF_PATH = "pkg://lptrain.conf"


@dataclass(frozen=True)
class ConfigSource:
    """name: the primary config (--config-name); path: the directory searched instead of
    lptrain's conf/ (--config-path: absolute, pkg://, or relative to the lptrain
    package, as Hydra reads it); extra_dir: a directory searched after it
    (--config-dir), whose group options and experiments join lptrain's."""

    name: str = "config"
    path: str | None = None
    extra_dir: str | None = None


@contextmanager
def initialized(source: ConfigSource = ConfigSource()):
    """Hydra's compose API set up with the search path of `source` (Hydra's global state
    as it was afterwards); ConfigError for a --config-dir that is not a directory."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup
    from hydra.version import setbase
    from lptrain.errors import ConfigError
    path = create_automatic_config_search_path(None, ENTRY_MODULE, source.path or CONF_PATH)
    if source.path is not None and os.path.isabs(source.path) and \
            not os.path.isdir(source.path):
        raise ConfigError(f"--config-path {source.path!r}: no such directory")
    if source.extra_dir is not None:
        extra = os.path.abspath(source.extra_dir)
        if not os.path.isdir(extra):
            raise ConfigError(f"--config-dir {source.extra_dir!r}: no such directory "
                              f"({extra})")
        path.prepend(provider="command-line", path=f"file://{extra}",
                     anchor=SearchPathQuery(provider="schema"))
    backup = get_gh_backup()
    GlobalHydra.instance().clear()     # inside Hydra's run (a sweep's job): its own again after
    setbase("1.3")
    Hydra.create_main_hydra2(task_name="lptrain", config_search_path=path)
    try:
        yield
    finally:
        restore_gh_from_backup(backup)


# Hydra's own hydra.run.dir and hydra.sweep.dir: lptrain gives a fresh one of its own
HYDRA_DEFAULT_DIRS = {"run": "outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}",
                      "sweep": "multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}"}


def configured_hydra(overrides: list[str], source: ConfigSource, sweep: bool
                     ) -> tuple[bool, str | None]:
    """(whether the configuration asks for a sweep: -m, or hydra.mode: MULTIRUN in it;
    the run or sweep directory it names, resolved as for the command's first job, e.g.
    its `${now:%Y}`, or None where it keeps Hydra's default); Hydra's or OmegaConf's
    errors (`${nonexist}` in the directory) as one ConfigError line."""
    from hydra import compose
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from lptrain.config import _as_a_job, _hydra_config_restored, one_line_error, sweep_samples
    try:
        with initialized(source), _hydra_config_restored():
            cfg = compose(config_name=source.name, overrides=sweep_samples(overrides)[0],
                          return_hydra_config=True)
            sweep = sweep or str(cfg.hydra.mode) == "RunMode.MULTIRUN"
            _as_a_job(cfg.hydra, sweep)
            key = "sweep" if sweep else "run"
            if OmegaConf.to_container(cfg.hydra[key])["dir"] == HYDRA_DEFAULT_DIRS[key]:
                return sweep, None
            return sweep, str(OmegaConf.select(cfg, f"hydra.{key}.dir",
                                               throw_on_resolution_failure=True))
    except (HydraException, OmegaConfBaseException) as exc:   # ${nonexist} in the dir
        raise one_line_error(exc) from None
