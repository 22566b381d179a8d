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


@pytest.mark.parametrize("key", ["hydra.run.dir", "hydra.sweep.dir"])
def test_a_directory_with_a_comma_is_refused_naming_the_quoted_form(tmp_path, capsys, key):
    """hydra.run.dir=runs/a,b got Hydra's 'Ambiguous value for argument', and with -m
    'Sweeping over Hydra's configuration is not supported'; '=', '[' and 'ü' got the
    quoted form, as README says."""
    from lptrain import cli
    from lptrain.rundir import dir_override
    run = tmp_path / "a,b"
    args = [f"{key}={run}", "train.iterations=1", *(["-m"] if "sweep" in key else [])]
    assert cli._lead(args, 1) == REFUSED
    assert capsys.readouterr().err.strip().splitlines() == [
        f"lptrain: error: {key}={run}: a ',' makes it several directories; a value with "
        f"'=', ',', quotes, brackets or non-ASCII letters goes in quotes: "
        f"{dir_override(key, run)}"]
    assert list(tmp_path.iterdir()) == []
