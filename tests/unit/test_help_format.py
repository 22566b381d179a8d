"""The tools' --help at 80 columns breaks lines between words, never inside a hyphenated
name (argparse's default cut `model-` / `last.pt` and `--adjoint-` / `time`)."""
import pytest

from lptrain import evaluate
from lptrain.model_perf import options


@pytest.mark.parametrize("main, name", [(evaluate.main, "model-last.pt"),
                                        (lambda argv: options.parser().parse_args(argv),
                                         "--adjoint-time")])
def test_help_keeps_hyphenated_names_whole(main, name, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert not any(line.rstrip().endswith("-") and not line.rstrip().endswith(" -")
                   for line in lines), text
    assert name in text
