"""The run, sweep and resume directories as typed: values lptrain refuses in one line,
exit 2, before any directory is made or looked into."""
import pytest

from lptrain.errors import REFUSED


@pytest.mark.parametrize("arg, more, default", [
    ("hydra.run.dir=", [], ", or leave hydra.run.dir out for a new outputs/<date>/<time>"),
    ("hydra.run.dir=''", [], ", or leave hydra.run.dir out for a new outputs/<date>/<time>"),
    ("hydra.sweep.dir=", ["-m"],
     ", or leave hydra.sweep.dir out for a new multirun/<date>/<time>"),
    ("resume=", [], ""), ("resume=''", [], "")])
def test_an_empty_directory_is_refused(tmp_path, monkeypatch, capsys, arg, more, default):
    """`hydra.run.dir=` wrote the run into the current directory, and `resume=` looked
    for the run there."""
    from lptrain import cli
    monkeypatch.chdir(tmp_path)
    assert cli._lead([arg, "train.iterations=1", *more], 1) == REFUSED
    assert capsys.readouterr().err.strip().splitlines() == [
        f"lptrain: error: {arg}: no directory given (an empty one is the current "
        f"directory); name one{default}"]
    assert list(tmp_path.iterdir()) == []
