"""The typed, validated options of a composed config: one step from OmegaConf to Config."""
from __future__ import annotations

import dataclasses
import math

from omegaconf import OmegaConf

from lptrain.config.schema import OPTIMIZER_OPTIONS, Config, check_chosen, dataset_options
from lptrain.errors import ConfigError


def options(cfg) -> Config:
    """The typed, validated options of a composed config (raises ConfigError)."""
    unknown = _unknown_keys(cfg)
    if unknown:
        raise ConfigError(f"{unknown[0]}: not an lptrain option (added with '+'?); "
                          f"`lptrain --cfg job` lists the options")
    bad = _unrepresentable(OmegaConf.to_container(cfg, resolve=True))
    if bad:
        key, value, what = bad[0]
        raise ConfigError(f"{key}={value!r}: {what}")
    opts = OmegaConf.to_object(cfg)
    if not isinstance(opts, Config):
        raise ConfigError(f"config: expected the lptrain schema, got {type(opts).__name__}")
    check_chosen("dataset", opts.dataset, dataset_options())
    check_chosen("optimizer", opts.optimizer, OPTIMIZER_OPTIONS)
    return opts


def _unrepresentable(tree, path: str = "") -> list[tuple[str, object, str]]:
    """(key, value, reason) of every number no option can take: nan, ±inf and integers
    beyond 64 bits (before any component computes with them)."""
    if isinstance(tree, dict):
        return [bad for key, sub in tree.items() for bad in _unrepresentable(sub, f"{path}{key}.")]
    key = path.rstrip(".")
    if isinstance(tree, float) and not math.isfinite(tree):
        return [(key, tree, "must be a finite number")]
    if isinstance(tree, int) and not isinstance(tree, bool) and abs(tree) >= 2 ** 63:
        return [(key, tree, "is beyond the 64-bit integers lptrain computes with")]
    return []


def _unknown_keys(cfg, path: str = "") -> list[str]:
    """Keys of cfg that its schema dataclass does not have (Hydra's '+key=value' adds
    them past the schema and to_object would drop them silently)."""
    typ = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(typ):
        return []
    names = {f.name for f in dataclasses.fields(typ)}
    found = []
    for key in cfg.keys():
        if key not in names:
            found.append(f"{path}{key}")
        elif OmegaConf.is_dict(node := cfg._get_node(key)):
            found += _unknown_keys(node, f"{path}{key}.")
    return found
