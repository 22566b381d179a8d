"""The import layers of pyproject.toml's [tool.importlinter] hold (docs/architecture.md
"Import layers"): what `lint-imports` checks, run in this process."""
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def test_the_import_contracts_are_kept(capsys):
    from importlinter.cli import lint_imports
    status = lint_imports(config_filename=str(REPO / "pyproject.toml"), no_cache=True,
                          no_logo=True)
    report = capsys.readouterr().out
    assert status == 0, report[report.find("Broken contracts"):] or report


def test_the_architecture_note_lists_the_layers_the_contract_checks():
    from importlinter.api import read_configuration
    contracts = read_configuration(str(REPO / "pyproject.toml"))["contracts_options"]
    layers = next(c for c in contracts if c["id"] == "layers")["layers"]
    note = (REPO / "docs" / "architecture.md").read_text()
    for layer in layers:
        names = [f"`{name.strip()}`" for name in layer.split("|")]
        assert " | ".join(names) in note, f"docs/architecture.md lacks the layer {layer!r}"
