"""What to type instead: 'did you mean' for a key no section has (the nearest key, group
or section of the same section, else the one key of another section that has nearly its
name), and an integer for an integer key given a float."""
from __future__ import annotations

import math
import re


def did_you_mean(key: str) -> str:
    """' (did you mean K?)' for the documented key, group or section nearest a misspelt
    one (`trian`, `Train`: train)."""
    from difflib import get_close_matches

    from lptrain.config.meanings import GROUPS, KEYS
    sections = {k.split(".")[0] for k in [*KEYS, *GROUPS] if "." in k}
    parent, _, leaf = key.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in [*KEYS, *GROUPS, *sections]
                if k.rpartition(".")[0] == parent}
    near = get_close_matches(leaf, siblings, n=1, cutoff=0.75) or \
        get_close_matches(leaf.lower(), siblings, n=1, cutoff=0.75)
    if near:
        return f"; did you mean {siblings[near[0]]}?"
    return _elsewhere(leaf, parent, KEYS)


def _elsewhere(leaf: str, parent: str, keys) -> str:
    """' (did you mean K?)' for a key of another section named as `leaf` or nearly
    (`train.checkpoint_every`, `train.eval_evry`: the top level's), where only one is."""
    from difflib import get_close_matches
    by_leaf: dict = {}
    for k in keys:
        if k.rpartition(".")[0] != parent:
            by_leaf.setdefault(k.rpartition(".")[2], []).append(k)
    near = get_close_matches(leaf, by_leaf, n=1, cutoff=0.8)
    found = by_leaf[near[0]] if near else []
    return f"; did you mean {found[0]}{_choices_having(found[0])}?" if len(found) == 1 \
        else ""


def _choices_having(key: str) -> str:
    """' (a key of optimizer=adam, sgd)' where only some choices of key's group take it
    (a suggestion the run's choice then refused, re-check); '' where all do."""
    from dataclasses import fields

    from lptrain.config.schema import schema_nodes
    group, _, leaf = key.partition(".")
    nodes = schema_nodes().get(group, {})
    having = sorted(node.removesuffix("_schema") for node, cls in nodes.items()
                    if leaf in {f.name for f in fields(cls)})
    return "" if len(having) == len(nodes) else f" (a key of {group}={', '.join(having)})"


def integer_hint(error, overrides: list[str]):
    """`error` with the way out where an integer key was given a float as typed: an
    `interval`, which samples floats (README "Sweeps"), or a number like 1e0. Hydra
    names the first float it could not convert (1e0 as '1.0'); the override named is
    the first of the key holding that value."""
    text = str(error)
    key = text.split(":", 1)[0]
    shown = re.search(r"Value '([^']*)' of type 'float' could not be converted to Integer",
                      text)
    given = [a.split("=", 1)[1] for a in overrides
             if "=" in a and a.lstrip("+").split("=", 1)[0] == key]
    if shown is None or not given:
        return error
    from lptrain.errors import ConfigError
    typed, value = next(((g, v) for g in given for v in _floats(g)
                         if _same_number(v, shown[1])), (None, None))
    if typed is None and given[-1].startswith("interval("):
        return ConfigError(f"{error}; an interval samples floats: "
                           f"{key}=int({given[-1]}) for an integer key")
    if typed is None:
        return error
    return ConfigError(f"{key}={typed}: {value} is read as a float, and {key} takes an "
                       f"integer (digits only, e.g. 300)")


def _floats(typed: str) -> list[str]:
    """The elements of an override's value that read as floats but not as integers
    ('1e0,2' and 'choice(3,2.0)' hold '1e0' and '2.0'); none in a list ('[2.5]')."""
    if typed.lstrip().startswith("["):
        return []
    return [v for v in re.split(r"[\s,()]+", typed) if _float_not_int(v)]


def _same_number(typed: str, shown: str) -> bool:
    """Whether Hydra's `shown` value ('1.0', 'nan') is the float `typed` ('1e0')."""
    try:
        a, b = float(typed), float(shown)
    except ValueError:
        return False
    return a == b or (math.isnan(a) and math.isnan(b))


def _float_not_int(text: str) -> bool:
    """Whether `text` reads as a float but not as an integer ('1e0', '2.5')."""
    try:
        float(text)
    except ValueError:
        return False
    try:
        int(text)
    except ValueError:
        return True
    return False
