"""An experiment overlay beside another option of a group it sets: refused, naming the
keys the overlay would set over that option's (config/__init__.compose_checked)."""
from __future__ import annotations

from typing import Sequence

# groups whose options hold the keys of their own node; a recipe's are in other nodes
NODE_GROUPS = ("dataset", "network", "optimizer", "mode", "mgrit")
SHOWN = 6        # keys named in the refusal, the rest counted


def refuse_mixed(cfg, overrides: Sequence[str], name: str = "config") -> None:
    """`experiment=peaks_paper network=dense_wide` trained peaks_paper's width, T and
    activation under `network: dense_wide`: an experiment's keys are merged after the
    groups' options, so a group chosen on the command line over the experiment's own
    choice took the experiment's values of its keys (a recipe too: `recipe=mnist` lost
    its iterations and batch size). ConfigError naming them (keys given on the command
    line win over both and are not counted). `cfg` has its `hydra` node."""
    from hydra import compose

    from lptrain.config import _key_value
    from lptrain.config.meanings import GROUPS
    from lptrain.errors import ConfigError
    given = dict(_key_value(o) for o in overrides)
    choices = cfg.hydra.runtime.choices
    chosen = [g for g in GROUPS if g in given and g != "experiment"]
    if "experiment" not in given or choices.get("experiment") is None or not chosen:
        return
    rest = [o for o in overrides if _key_value(o)[0] != "experiment"]
    pinned = [f"{g}={choices[g]}" for g in GROUPS
              if g not in given and g != "experiment" and choices.get(g) is not None]
    plain = compose(config_name=name, overrides=[*rest, *pinned])        # no overlay
    own = compose(config_name=name, return_hydra_config=True,
                  overrides=[o for o in overrides if _key_value(o)[0] not in chosen]
                  ).hydra.runtime.choices
    for g in chosen:
        if own[g] == choices[g]:
            continue
        if g in NODE_GROUPS:
            keys = [f"{g}.{k}" for k in cfg[g] if cfg[g][k] != plain[g].get(k)]
        else:       # the keys where this option and the experiment's own one differ
            other = compose(config_name=name, overrides=[
                *(o for o in rest if _key_value(o)[0] != g), *pinned, f"{g}={own[g]}"])
            a, b, now = _flat(plain), _flat(other), _flat(cfg)
            keys = [k for k in a if a[k] != b.get(k) and now.get(k) != a[k]]
        keys = [k for k in keys if k not in given]
        if keys:
            more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
            raise ConfigError(
                f"{g}={choices[g]}: experiment={choices.experiment} sets "
                f"{', '.join(keys[:SHOWN])}{more} over its values (the experiment's own "
                f"choice is {g}={own[g]}); leave {g}= out, or give the keys their values "
                f"on the command line")


def _flat(cfg) -> dict:
    """key path -> value of a config's leaves (its `hydra` node left out), unresolved."""
    from omegaconf import OmegaConf
    out: dict = {}

    def walk(node, prefix: str) -> None:
        for k, v in node.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = v
    walk({k: v for k, v in OmegaConf.to_container(cfg, resolve=False).items()
          if k != "hydra"}, "")
    return out
