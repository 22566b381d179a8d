"""The configuration reference covers the whole schema with the composed defaults, `lptrain
--help` and docs/configuration.md are generated from it, and schema nodes are no choices."""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from helpers import config_of
from lptrain import config
from lptrain.config import meanings, reference as ref
from lptrain.config.schema import Config, schema_nodes
from lptrain.errors import ConfigError

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _schema_keys(cls=Config, prefix: str = "") -> set[str]:
    """Every dotted key of the schema: nested options, every optimizer's and dataset's."""
    hints, keys = typing.get_type_hints(cls), set()
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            keys |= _schema_keys(hints[f.name], f"{key}.")
        elif f.name in schema_nodes() and not prefix:     # chosen per group (Any)
            for node in schema_nodes()[f.name].values():
                keys |= _schema_keys(node, f"{key}.")
        else:
            keys.add(key)
    return keys


@pytest.fixture(scope="module", autouse=True)
def built():
    """The reference, built once for this module: `ref.text` and `ref.markdown` build
    from it here (each build composes the config for every optimizer and dataset)."""
    once = ref.reference()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ref, "reference", lambda: once)
        yield once


@pytest.fixture(scope="module")
def help_text():
    return ref.text(100)


def test_meanings_name_exactly_the_groups_choices_and_keys_there_are():
    assert set(meanings.GROUPS) == set(ref.config_groups())
    assert set(meanings.CHOICES) == set(ref.config_groups())
    for group, choices in meanings.CHOICES.items():
        assert set(choices) == set(config.yaml_choices(group)), group
    assert set(meanings.KEYS) == _schema_keys()
    assert set(meanings.VALUES) <= set(meanings.KEYS)
    lines = [*meanings.GROUPS.values(), *meanings.KEYS.values(),
             *(m for c in meanings.CHOICES.values() for m in c.values())]
    assert all(line and "\n" not in line for line in lines)


def test_every_key_appears_with_its_composed_default(built):
    _, sections = built
    seen = set()
    for section in sections:
        choice = section.title.split("(")[1].split(";")[0].rstrip(")") \
            if section.title.startswith(("optimizer", "dataset")) else None
        _, plain = config_of([choice] if choice else [])
        for key in section.keys:
            node = plain
            for part in key.key.split("."):
                node = node[part]
            assert key.default == node, (section.title, key.key)
            assert key.meaning == meanings.KEYS[key.key]
            seen.add(key.key)
    assert seen == _schema_keys()


def test_groups_list_the_yaml_choices_with_the_default_and_no_schema_node(built):
    groups, _ = built
    by_name = {g.name: g for g in groups}
    assert set(by_name) == set(ref.config_groups())
    assert (by_name["dataset"].default, by_name["mode"].default,
            by_name["experiment"].default) == ("peaks", "serial", None)
    for g in groups:
        assert list(g.choices) and set(g.choices) == set(config.yaml_choices(g.name))
        assert not set(g.choices) & set(schema_nodes().get(g.name, {}))


def test_help_lists_every_group_choice_and_key(help_text):
    words = {line.split()[0] for line in help_text.splitlines() if line.strip()}
    words |= {line.split()[1] for line in help_text.splitlines()
              if line.lstrip().startswith("* ")}
    assert set(ref.config_groups()) <= words
    for group in ref.config_groups():
        assert set(config.yaml_choices(group)) <= words, group
    assert _schema_keys() <= words
    assert "_schema" not in help_text
    line = next(ln for ln in help_text.splitlines() if ln.split()[:1] == ["train.iterations"])
    assert line.split()[1:3] == ["int", "300"]


def test_help_fits_the_terminal():
    for width in (80, 120):
        assert max(len(line) for line in ref.text(width).splitlines()) <= width


def test_text_keys_show_what_the_code_accepts():
    key = ref.Key("network.activation", "str", "tanh", meanings.KEYS["network.activation"])
    assert all(name in ref.meaning(key) for name in meanings.VALUES["network.activation"])


def test_docs_page_is_up_to_date():
    """Regenerate with: python -m lptrain.config.reference > docs/configuration.md"""
    assert DOC.read_text() == ref.markdown()


@pytest.mark.parametrize("override", ["mode=mode_schema", "dataset=peaks_schema",
                                      "optimizer=adam_schema", "network=network_schema",
                                      "mgrit=mgrit_schema"])
def test_a_schema_node_is_refused_as_a_choice(override):
    group = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"^{override}: the schema the {group} configs "
                                          rf"extend, not a choice; choose one of "):
        config.compose([override])
