"""The command's check reads the configuration where the run reads it: the user's own
config directory (--config-dir, hydra.searchpath) and primary config (--config-name)."""
from __future__ import annotations

import pytest

from lptrain.command_args import checked_args, config_source
from lptrain.config import check_command
from lptrain.config.schema import register_configs
from lptrain.config.source import ConfigSource
from lptrain.errors import ConfigError


@pytest.fixture(scope="module", autouse=True)
def _schema():
    register_configs()


@pytest.fixture
def own(tmp_path):
    """A user's config directory: an experiment, a network option, a primary config."""
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /optimizer: adam\n"
        "network:\n  layers: 6\n")
    (tmp_path / "network").mkdir()
    (tmp_path / "network" / "small.yaml").write_text(
        "defaults:\n  - network_schema\nname: dense\nwidth: 3\nlayers: 4\n")
    (tmp_path / "images.yaml").write_text(
        "defaults:\n  - config\n  - override dataset: mnist\n  - _self_\n")
    return tmp_path


def test_the_users_group_options_are_checked_from_their_directory(own):
    """`--config-dir DIR experiment=mine` was refused (`Could not find
    'experiment/mine'`) though Hydra's run finds it: the check composed lptrain's
    config directory alone."""
    with pytest.raises(ConfigError, match="Could not find 'experiment/mine'"):
        check_command(["experiment=mine"])
    source = ConfigSource(extra_dir=str(own))
    check_command(["experiment=mine", "optimizer=sgd"], source=source)
    check_command(["experiment=mine", f"hydra.searchpath=[file://{own}]"])
    with pytest.raises(ConfigError, match="network.widht: no such key"):
        check_command(["network=small", "network.widht=2"], source=source)


def test_a_group_chosen_over_an_experiments_keys_is_refused(own):
    """`experiment=peaks_paper network=dense_wide` trained peaks_paper's width, T and
    activation with `network: dense_wide` recorded: the overlay's keys are merged after
    the group's option. The keys are named; given on the command line they win over
    both, and the experiment's own choice mixes nothing."""
    source = ConfigSource(extra_dir=str(own))
    with pytest.raises(ConfigError, match=r"^network=small: experiment=mine sets "
                                          r"network.layers over its values \(the "
                                          r"experiment's own choice is network=dense\)"):
        check_command(["experiment=mine", "network=small"], source=source)
    check_command(["experiment=mine", "network=small", "network.layers=4"], source=source)
    check_command(["experiment=mine", "network=dense"], source=source)
    with pytest.raises(ConfigError, match=r"^network=dense_wide: experiment=peaks_paper "
                                          r"sets network.width, network.layers, network.T"):
        check_command(["experiment=peaks_paper", "network=dense_wide"])
    with pytest.raises(ConfigError, match=r"^dataset=mnist: experiment=peaks_deep sets "
                                          r"dataset.n_train, dataset.n_val over"):
        check_command(["dataset=mnist", "experiment=peaks_deep"])
    check_command(["experiment=peaks_paper", "optimizer=adam", "mode=simultaneous"])
    # a recipe's keys are in other nodes: recipe=mnist lost its 480 iterations and batch
    with pytest.raises(ConfigError, match=r"^recipe=mnist: experiment=peaks_paper sets "
                                          r"train.iterations, train.batch_size over"):
        check_command(["experiment=peaks_paper", "recipe=mnist"])
    check_command(["experiment=mnist_paper", "recipe=default"])


def test_the_users_primary_config_is_the_one_checked(own):
    """`--config-name images dataset.scaling=unit` was refused as not an option of
    dataset=peaks: the check composed lptrain's primary config."""
    with pytest.raises(ConfigError, match=r"dataset.scaling: not an option"):
        check_command(["dataset.scaling=unit"])
    check_command(["dataset.scaling=unit"], source=ConfigSource("images", extra_dir=str(own)))


def test_a_missing_directory_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"^--config-dir '.*nowhere': no such directory"):
        check_command([], source=ConfigSource(extra_dir=str(tmp_path / "nowhere")))
    with pytest.raises(ConfigError, match=r"^--config-path '.*nowhere': no such directory"):
        check_command([], source=ConfigSource(path=str(tmp_path / "nowhere")))


def test_the_commands_flags_and_overrides_are_told_apart():
    args = ["seed=3", "--config-dir", "/u/conf", "-cn", "mine", "--cfg", "job", "-m",
            "~train", "hydra.searchpath=[file:///x]"]
    assert config_source(args) == ConfigSource("mine", None, "/u/conf")
    assert checked_args(args) == ["-m", "seed=3", "~train", "hydra.searchpath=[file:///x]"]
    assert config_source(["seed=3"]) == ConfigSource()
    assert checked_args(["--experimental-rerun", "/r/config.pickle"]) is None


def test_the_directory_the_run_writes_is_the_one_claimed(own, tmp_path):
    """`hydra.run.dir=runs/${now:%Y}` was locked and checked under its literal name, so a
    second run rewrote the first one's .hydra/ before failing; a run directory, or
    hydra.mode: MULTIRUN, set in the user's config was ignored (the run went to
    outputs/<date>/<time>, and a sweep left such an empty directory behind)."""
    from datetime import datetime

    from lptrain.command_args import configured_args as configured

    def configured_args(args):
        return configured(args, checked_args(args), config_source(args))
    year = datetime.now().strftime("%Y")
    assert configured_args(["seed=1", "hydra.run.dir=runs/${now:%Y}"]) == [
        "seed=1", f"hydra.run.dir=runs/{year}"]
    assert configured_args(["-m", "seed=1,2", "hydra.sweep.dir=m/${seed}"]) == [
        "-m", "seed=1,2", "hydra.sweep.dir=m/1"]
    assert configured_args(["seed=1", "hydra.run.dir=runs/a"]) == [
        "seed=1", "hydra.run.dir=runs/a"]
    (own / "placed.yaml").write_text(
        f"defaults:\n  - config\n  - _self_\nhydra:\n  run:\n    dir: {tmp_path}/r_${{seed}}\n")
    (own / "swept.yaml").write_text(
        "defaults:\n  - config\n  - _self_\nhydra:\n  mode: MULTIRUN\n")
    flags = ["--config-dir", str(own), "--config-name"]
    assert configured_args([*flags, "placed", "seed=4"]) == [
        *flags, "placed", "seed=4", f"hydra.run.dir={tmp_path}/r_4"]
    assert configured_args([*flags, "placed", "hydra.run.dir=mine"])[-1] == \
        "hydra.run.dir=mine"
    assert configured_args([*flags, "swept", "seed=1,2"]) == [
        "-m", *flags, "swept", "seed=1,2"]
    with pytest.raises(ConfigError, match=r"^hydra.run.dir: Interpolation key 'nonexist' "
                                          r"not found$"):       # was a 60-line traceback
        configured_args(["hydra.run.dir=runs/${nonexist}"])


def test_shell_completion_words_are_not_overrides():
    """`lptrain --shell-completion install=bash`, as --hydra-help advertises it, was
    refused (`install: no such key`): its words are Hydra's completion commands."""
    assert checked_args(["--shell-completion", "install=bash"]) is None
    assert checked_args(["-sc", "query=bash"]) is None


def test_the_flags_answered_before_mpi_know_their_rank():
    """`mpiexec -n 2 lptrain --help` printed the 319-line page twice."""
    from lptrain.command_args import launched_rank
    assert launched_rank({}) == 0
    assert launched_rank({"PMI_RANK": "1"}) == 1
    assert launched_rank({"OMPI_COMM_WORLD_RANK": "3", "PMI_FD": "7"}) == 3
    assert launched_rank({"PMIX_RANK": "0"}) == 0
    assert launched_rank({}, None) is None and launched_rank({"PMI_RANK": "1"}, None) == 1


def test_the_tools_run_once_under_a_launcher(monkeypatch):
    """`mpiexec -n 2 lptrain-report RUN` printed every line twice, and both processes
    wrote the same PNGs at once: rank 0 runs a tool, other ranks end with 0."""
    from lptrain import commands
    ran = []
    monkeypatch.setattr(commands, "stops_on_signals", lambda prog, load: ran.append(prog) or 3)
    monkeypatch.setenv("PMI_RANK", "1")
    assert [commands.evaluate(), commands.report()] == [0, 0]
    assert ran == []
    # lptrain-model measures the link with rank 1 (it hung for ever without it)
    assert commands.model() == 3 and ran == ["lptrain-model"]
    monkeypatch.setenv("PMI_RANK", "0")
    assert [commands.evaluate(), commands.report(), commands.model()] == [3, 3, 3]
    assert ran == ["lptrain-model", "lptrain-eval", "lptrain-report", "lptrain-model"]


def test_resolve_alone_is_refused_before_anything_is_written():
    """`lptrain --resolve` made outputs/<date>/<time>/error-hydra.log and exited 1."""
    from lptrain.command_args import check_flags
    with pytest.raises(ConfigError, match=r"^--resolve: it goes with --cfg"):
        check_flags(["--resolve", "seed=1"])
    check_flags(["--cfg", "job", "--resolve"])


def test_shell_completion_without_its_action_is_a_usage_error():
    """`lptrain --shell-completion` exited 1 with Hydra's ValueError (held-out)."""
    from lptrain.command_args import check_flags
    with pytest.raises(ConfigError, match=r"^--shell-completion: add one of install=SHELL, "
                       r"uninstall=SHELL, query=SHELL"):
        check_flags(["--shell-completion"])
    check_flags(["--shell-completion", "install=bash"])


def test_a_resume_runs_with_the_configuration_source_the_run_had(tmp_path):
    """A run of `--config-dir DIR experiment=mine` (or hydra.searchpath, or its own
    primary config) could not be resumed: the resume rebuilt the command from
    .hydra/overrides.yaml alone ('Could not find experiment/mine'), and a run with
    hydra.job.chdir=true lost it."""
    import yaml

    from lptrain.resume_args import resume_args
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "checkpoint.pt").write_bytes(b"")
    (run / ".hydra" / "overrides.yaml").write_text("- experiment=mine\n")
    hydra = {"job": {"config_name": "mine_primary"},
             "runtime": {"config_sources": [
                 {"path": "hydra.conf", "schema": "pkg", "provider": "hydra"},
                 {"path": "lptrain.conf", "schema": "pkg", "provider": "main"},
                 {"path": "/u/conf", "schema": "file", "provider": "command-line"}]},
             "overrides": {"hydra": [f"hydra.run.dir={run}", "hydra.mode=RUN",
                                     "hydra.job.chdir=true",
                                     "hydra.searchpath=[file:///u/more]"]}}
    (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": hydra}))
    assert resume_args([f"resume={run}", "train.iterations=9"]).args == [
        "--config-name", "mine_primary", "--config-dir", "/u/conf", "hydra.job.chdir=true",
        "hydra.searchpath=[file:///u/more]", "experiment=mine", "train.iterations=9",
        f"hydra.run.dir={run}"]
    (run / ".hydra" / "hydra.yaml").unlink()            # a run without it: lptrain's
    assert resume_args([f"resume={run}"]).args == ["experiment=mine", f"hydra.run.dir={run}"]
