"""The run, sweep and resume directories as typed: values lptrain refuses in one line,
exit 2, before any directory is made or looked into."""
import re

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


@pytest.mark.parametrize("arg", ["hydra.run.dir=~/x", "hydra.run.dir='~/x'", "resume=~/x"])
def test_a_leading_tilde_is_refused_naming_the_home_directory(tmp_path, monkeypatch,
                                                               capsys, arg):
    """The fix lptrain suggested for `hydra.run.dir=~/x` (quote it) wrote the run into
    a directory named '~' under the current one."""
    import os

    from lptrain import cli
    monkeypatch.chdir(tmp_path)
    assert cli._lead([arg, "train.iterations=1"], 1) == REFUSED
    key = arg.split("=", 1)[0]
    assert capsys.readouterr().err.strip() == (
        f"lptrain: error: {arg}: a leading ~ is not your home directory here (it names a "
        f"directory '~' in the current one); give {key}={os.path.expanduser('~/x')}")
    assert list(tmp_path.iterdir()) == []


def test_a_run_without_its_hydra_files_is_refused(tmp_path, monkeypatch, capsys):
    """hydra.output_subdir=null ran, and its resume was refused for a missing
    .hydra/overrides.yaml that never existed."""
    from lptrain import cli
    monkeypatch.chdir(tmp_path)
    for given in ("null", "NULL", "meta"):         # Hydra reads null in any case
        assert cli._lead([f"hydra.output_subdir={given}", "train.iterations=1"], 1) == REFUSED
        assert "cannot be resumed" in capsys.readouterr().err
    assert cli._lead(["hydra.output_subdir=.hydra", "--cfg", "job"], 1) == 0
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_sweep_directory_is_named_as_such(tmp_path):
    from lptrain.command_args import check_writable
    (tmp_path / "file").write_text("")
    assert check_writable(str(tmp_path / "file" / "x"), "hydra.sweep.dir").startswith(
        f"hydra.sweep.dir='{tmp_path}/file/x': cannot write there")


@pytest.mark.parametrize("value", ["0", "-1", "x", "2.5"])
def test_a_sweepers_count_below_one_is_refused_before_the_sweep(value):
    """`hydra.sweeper.n_trials=0` ended an Optuna sweep in the plugin's 'No trials are
    completed yet', exit 1 (held-out)."""
    from lptrain.command_args import check_hydra_keys
    from lptrain.errors import ConfigError
    with pytest.raises(ConfigError, match=re.escape(
            f"hydra.sweeper.n_trials={value}: must be a whole number >= 1 (the trials")):
        check_hydra_keys([f"hydra.sweeper.n_trials={value}"])
    check_hydra_keys(["hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=1"])
