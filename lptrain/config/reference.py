"""The configuration reference: each group with its choices, each key with its type,
default and meaning, generated from the schema, the YAML configs and config/meanings.py.

`lptrain --help` prints `text()`; docs/configuration.md is `markdown()`:
`python -m lptrain.config.reference > docs/configuration.md`.
"""
from __future__ import annotations

import dataclasses
import re
import shutil
import textwrap
import typing
from dataclasses import dataclass
from pathlib import Path

from lptrain.config import CONF_DIR, yaml_choices
from lptrain.config.meanings import CHOICES, GROUPS, KEYS, VALUES
from lptrain.config.schema import Config, schema_nodes

PROG = "lptrain"
PER_CHOICE = ("optimizer", "dataset")   # groups whose keys depend on the choice


@dataclass(frozen=True)
class Group:
    name: str
    meaning: str
    default: str | None               # the choice of `lptrain` without arguments
    choices: dict[str, str]           # choice -> meaning


@dataclass(frozen=True)
class Key:
    key: str
    type: str
    default: object
    meaning: str


@dataclass(frozen=True)
class Section:
    title: str        # "" for the keys of every run, else the choice they belong to
    keys: tuple[Key, ...]


def config_groups() -> list[str]:
    return sorted(p.name for p in Path(CONF_DIR).iterdir()
                  if p.is_dir() and p.name not in ("hydra", "__pycache__"))


def _type_name(hint) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) == 1:
        return f"{args[0].__name__} or null"
    return getattr(hint, "__name__", str(hint))


def _key(key: str, hint, values: dict) -> Key:
    return Key(key, _type_name(hint), _lookup(values, key), KEYS.get(key, ""))


def _keys(cls, prefix: str, values: dict) -> tuple[Key, ...]:
    """The keys of an options dataclass, their defaults from `values`."""
    hints = typing.get_type_hints(cls)
    return tuple(_key(f"{prefix}{f.name}", hints[f.name], values)
                 for f in dataclasses.fields(cls))


def _nodes(values: dict, chosen: dict) -> list[Section]:
    """Config's own keys, then a section per options node that every run has (train,
    parallel, and the network, mode and mgrit chosen)."""
    hints = typing.get_type_hints(Config)
    own, nested = [], []
    for f in dataclasses.fields(Config):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            title = f"{f.name}.*" + (f" ({f.name}={chosen[f.name]})" if f.name in chosen else "")
            nested.append(Section(title, _keys(hint, f"{f.name}.", values)))
        elif f.name not in PER_CHOICE:
            own.append(_key(f.name, hint, values))
    return [Section("", tuple(own)), *nested]


def _lookup(tree: dict, key: str):
    for part in key.split("."):
        tree = tree[part]
    return tree


def _compose(overrides: list[str]) -> tuple[dict, dict]:
    """(plain values, group choices) of the config with these overrides."""
    from hydra import compose
    from omegaconf import OmegaConf
    cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    values = OmegaConf.to_container(cfg, resolve=False)
    values.pop("hydra")
    return values, choices


def reference() -> tuple[list[Group], list[Section]]:
    """Every group and every key, with the defaults of `lptrain` without arguments (and,
    for the keys of another optimizer or dataset, that choice's)."""
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from lptrain.config.schema import register_configs
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        values, chosen = _compose([])
        groups = [Group(g, GROUPS.get(g, ""), chosen.get(g),
                        {c: CHOICES.get(g, {}).get(c, "") for c in _ordered(g)})
                  for g in _ordered_groups()]
        sections = _nodes(values, chosen)
        nodes = schema_nodes()
        for group in PER_CHOICE:
            names = {c: OmegaConf.load(Path(CONF_DIR) / group / f"{c}.yaml").get("name", c)
                     for c in _ordered(group)}
            for choice, name in names.items():
                if name != choice:      # a variant: listed with the choice it varies
                    continue
                mine = values if chosen[group] == choice else \
                    _compose([f"{group}={choice}"])[0]
                variants = [c for c, n in names.items() if n == name and c != choice]
                title = f"{group}.* ({group}={choice}" + (
                    f"; also {', '.join(variants)})" if variants else ")")
                sections.append(Section(title, _keys(nodes[group][f"{name}_schema"],
                                                     f"{group}.", mine)))
    return groups, sections


def _ordered_groups() -> list[str]:
    present = config_groups()
    return [g for g in GROUPS if g in present] + [g for g in present if g not in GROUPS]


def _ordered(group: str) -> list[str]:
    present = yaml_choices(group)
    known = CHOICES.get(group, {})
    return [c for c in known if c in present] + [c for c in present if c not in known]


def show(value) -> str:
    """A value as it is written on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value) if value != "" else '""'


def meaning(key: Key) -> str:
    """The key's line of meaning and, for a text key, what it accepts (unless the line
    already names each)."""
    accepts = VALUES.get(key.key)
    if accepts is None:
        return key.meaning
    if isinstance(accepts, str):
        return f"{key.meaning} ({accepts})"
    if all(re.search(rf"\b{re.escape(v)}\b", key.meaning) for v in accepts):
        return key.meaning
    return f"{key.meaning} ({' | '.join(accepts)})"


USAGE = f"""\
usage: {PROG} [GROUP=CHOICE ...] [KEY=VALUE ...]   train one configuration
       {PROG} -m KEY=A,B ... [hydra/sweeper=optuna] a sweep: one run per job
       mpiexec -n P {PROG} ...                       the same on P ranks
       {PROG} resume=DIR [train.iterations=N ...]    continue a stopped run
       {PROG} ... --cfg job                          the composed configuration
       {PROG} --version | --info | --hydra-help"""

INTRO = ("Defaults are those of `lptrain` without arguments; the keys of another optimizer "
         "or dataset show that choice's. A dataset also chooses its network and recipe, an "
         "experiment overlays everything; keys on the command line win over both (a group "
         "chosen beside an experiment that sets its keys is refused). The docs/ pages and "
         "the README named below are in lptrain's source tree.")


def text(width: int | None = None) -> str:
    """The help page for a terminal `width` columns wide (default: the terminal's, 80
    through a pipe, as the progress lines)."""
    width = max(60, width or shutil.get_terminal_size((80, 24)).columns)
    groups, sections = reference()
    out = [f"{PROG}: layer-parallel training of deep residual networks with MGRIT", "",
           USAGE, "", *textwrap.wrap(INTRO, width), "",
           "Config groups (GROUP=CHOICE; * marks the default):"]
    pad = max(len(c) for g in groups for c in g.choices) + 6
    for g in groups:
        out += _wrapped(f"  {g.name}", g.meaning, pad, width)
        for choice, what in g.choices.items():
            mark = "*" if choice == g.default else " "
            out += _wrapped(f"    {mark} {choice}", what, pad, width)
    keys = [k for s in sections for k in s.keys]
    kpad = max(len(k.key) for k in keys) + 4
    tpad = max(len(k.type) for k in keys) + 2
    dpad = min(max(len(show(k.default)) for k in keys), 10) + 2
    out += ["", "Keys (KEY=VALUE), with type and default:"]
    for section in sections:
        if section.title:
            out += ["", f" {section.title}"]
        for k in section.keys:
            head = f"  {k.key:<{kpad - 2}}{k.type:<{tpad}}{show(k.default)}"
            if width - (kpad + tpad + dpad) >= 40:      # the meaning beside the default
                out += _wrapped(head, meaning(k), kpad + tpad + dpad, width)
            else:                                       # the meaning below
                out += [head, *textwrap.wrap(meaning(k), width, initial_indent=" " * 6,
                                             subsequent_indent=" " * 6)]
    return "\n".join(out) + "\n"


def _wrapped(head: str, body: str, pad: int, width: int) -> list[str]:
    """`head`, then `body` from column `pad` on, wrapped to `width` columns."""
    lines = textwrap.wrap(body, max(20, width - pad)) or [""]
    first = head.ljust(pad) if len(head) < pad else head + "\n" + " " * pad
    return [(first + lines[0]).rstrip()] + [" " * pad + ln for ln in lines[1:]]


def markdown() -> str:
    """docs/configuration.md."""
    groups, sections = reference()
    parts = ["# Configuration reference\n\n",
             "Every config group with its choices and every key with its type, default and "
             "meaning. `lptrain --help` prints the same. This page is generated by "
             "`python -m lptrain.config.reference` from the schema (lptrain/config/), the "
             "YAML configs (lptrain/conf/) and lptrain/config/meanings.py.\n\n",
             "```\n", USAGE, "\n```\n\n", INTRO, "\n\n## Groups\n\n",
             "| group | choice | meaning |\n|---|---|---|\n"]
    for g in groups:
        parts.append(f"| `{g.name}` | | {g.meaning} |\n")
        for choice, what in g.choices.items():
            default = " (default)" if choice == g.default else ""
            parts.append(f"| | `{choice}`{default} | {what} |\n")
    parts.append("\n## Keys\n")
    for section in sections:
        title = f"`{section.title}`" if section.title else "Every run"
        parts.append(f"\n### {title}\n\n| key | type | default | meaning |\n"
                     "|---|---|---|---|\n")
        for k in section.keys:
            parts.append(f"| `{k.key}` | {k.type} | `{show(k.default)}` | "
                         f"{meaning(k).replace('|', '&#124;')} |\n")
    return "".join(parts)


if __name__ == "__main__":
    print(markdown(), end="")
