"""Every config group option and experiment overlay composes into validated options.

Composition goes through Hydra's compose API against lptrain/conf/ (no subprocess); validation is
lptrain.config.typed.options, i.e. the typed schema and its __post_init__ checks.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ValidationError

from helpers import composed
from lptrain import config
from lptrain.config.schema import Config, dataset_options, register_configs
from lptrain.config.typed import options
from lptrain.errors import ConfigError

CONF = Path(config.CONF_DIR)

# The options each group must offer (a group may offer more; those are tested too).
DOCUMENTED = {
    "dataset": {"peaks", "indian_pines", "mnist", "fashion_mnist"},
    "network": {"dense", "conv"},
    "optimizer": {"lbfgs", "sgd", "adam"},
    "mode": {"serial", "mgrit", "simultaneous"},
    "mgrit": {"default", "paper"},
}
# Groups whose options carry their own name in a `name` field.
NAMED = ("dataset", "network", "optimizer", "mode")

REQUIRED_KEYS = ("dataset", "network.width", "network.layers", "network.T",
                 "network.activation", "optimizer", "train.iterations", "train.batch_size",
                 "eval_every", "seed", "mode", "dtype", "device")


def _yaml_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


GROUP_OPTIONS = [(group, name) for group in DOCUMENTED for name in _yaml_options(group)]
EXPERIMENTS = _yaml_options("experiment")


@pytest.fixture(scope="module", autouse=True)
def _schema():
    register_configs()


def _compose(*overrides: str) -> DictConfig:
    return composed(*overrides)


def _values(path: Path) -> dict:
    """The values a YAML file sets, as {dotted key: value}, without its defaults list."""
    raw = OmegaConf.to_container(OmegaConf.load(path))
    raw.pop("defaults", None)
    flat: dict = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}{key}.", value)
        else:
            flat[prefix[:-1]] = node

    walk("", raw)
    return flat


def _attr(obj, dotted: str):
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)  # network.step
    return obj


def test_default_config_validates():
    opts = options(_compose())
    assert isinstance(opts, Config)
    assert (opts.dataset.name, opts.network.name, opts.optimizer.name, opts.mode.name) == (
        "peaks", "dense", "lbfgs", "serial")


@pytest.mark.parametrize("group", sorted(DOCUMENTED))
def test_group_offers_the_documented_options(group):
    assert DOCUMENTED[group] <= set(_yaml_options(group))


@pytest.mark.parametrize(("group", "name"), GROUP_OPTIONS)
def test_every_group_option_composes_and_validates(group, name):
    opts = options(_compose(f"{group}={name}"))
    chosen = getattr(opts, group)
    if group in NAMED:      # a variant file (lbfgs_paper) keeps its component's name
        assert chosen.name == name or name.startswith(chosen.name + "_")
    if group == "dataset":
        assert type(chosen) is dataset_options()[name]
    # every value the file sets reaches the typed options unchanged
    values = _values(CONF / group / f"{name}.yaml")
    for key, value in values.items():
        assert _attr(chosen, key) == value, f"{group}/{name}.yaml: {key}"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_overlay_composes_and_wins(name):
    cfg = _compose(f"experiment={name}")
    options(cfg)
    values = _values(CONF / "experiment" / f"{name}.yaml")
    assert values, f"experiment/{name}.yaml sets nothing"
    for key, value in values.items():
        assert OmegaConf.select(cfg, key) == value, f"experiment/{name}.yaml: {key}"


def test_peaks_paper_has_the_authors_values():
    opts = options(_compose("experiment=peaks_paper"))
    net = opts.network
    assert opts.dataset.name == "peaks"
    assert (net.name, net.width, net.layers, net.T) == ("dense", 8, 30, 1.0)
    assert (net.activation, net.bias, net.init) == ("smoothrelu", "scalar", "uniform")
    assert net.h == pytest.approx(1.0 / 30, rel=1e-15)
    assert (opts.optimizer.name, opts.optimizer.memory) == ("lbfgs", 10)
    assert opts.train.iterations == 130
    assert opts.train.batch_size is None


@pytest.mark.parametrize("name", EXPERIMENTS)
@pytest.mark.parametrize("optimizer", ["adam", "sgd", "lbfgs_m20"])
def test_an_experiment_takes_the_optimizer_the_command_chooses(name, optimizer):
    """experiment=mnist_paper optimizer=adam was refused with a line ending in a colon
    (the overlay set optimizer.memory, which Adam lacks), and experiment=peaks_deep
    optimizer=lbfgs_m20 trained with memory 10: the overlays now choose an optimizer
    config, which the command line replaces."""
    chosen = options(_compose(f"experiment={name}", f"optimizer={optimizer}")).optimizer
    expected = OmegaConf.load(CONF / "optimizer" / f"{optimizer}.yaml")
    assert chosen.name == expected.name
    assert getattr(chosen, "memory", None) == expected.get("memory",
                                                           getattr(chosen, "memory", None))


def test_a_key_a_config_sets_is_said_with_its_reason_and_origin():
    from hydra.errors import ConfigCompositionException

    from lptrain.config import one_line_error
    exc = ConfigCompositionException(
        "In 'experiment/mine': ConfigKeyError raised while composing config:\n"
        "Key 'memory' not in 'AdamOptions'\n    full_key: optimizer.memory\n"
        "    object_type=AdamOptions")
    assert str(one_line_error(exc)) == ("optimizer.memory: Key 'memory' not in "
                                        "'AdamOptions' (set by experiment/mine)")


@pytest.mark.parametrize("given, message", [
    ("network.widht=4", "network.widht: no such key; did you mean network.width? (lptrain "
                        "--cfg job shows them)"),
    ("netwrk.width=4", "netwrk: no such key; did you mean network?"),
    ("mgrit.fwd_iter=4", "mgrit.fwd_iter: no such key; did you mean mgrit.fwd_iters?"),
    ("network.zzz=4", "network.zzz: no such key (lptrain --cfg job shows them)"),
    # another choice's key: said so, with the class that lacks it
    ("optimizer.lr=0.1", "optimizer.lr: not an option of this optimizer choice (LBFGSOptions); "
                         "lptrain --cfg job shows its options")])
def test_a_misspelt_key_is_named_with_the_nearest_one(given, message):
    """Was "Key 'widht' not in 'NetworkOptions'": a class name, no way out."""
    from lptrain.config import check_command
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        check_command([given])


def test_a_switch_given_a_number_is_refused():
    """OmegaConf read `train.fail_on_stall=2` (and -1) as true without a word."""
    from lptrain.config import check_command
    for given in ("train.fail_on_stall=2", "train.fail_on_stall=-1"):
        with pytest.raises(ConfigError, match=f"^{re.escape(given)}: train.fail_on_stall "
                                              f"takes true or false$"):
            check_command([given])
    for fine in ("train.fail_on_stall=true", "train.fail_on_stall=0", "train.fail_on_stall=Yes",
                 "train.fail_on_stall='true'", "train.fail_on_stall=y",       # review
                 "train.fail_on_stall=${mgrit.adaptive}", "train.iterations=2"):
        check_command([fine])


def test_experiment_values_can_still_be_overridden():
    opts = options(_compose("experiment=peaks_paper", "train.iterations=7",
                            "network.layers=6"))
    assert (opts.train.iterations, opts.network.layers, opts.network.width) == (7, 6, 8)


@pytest.mark.parametrize("key", REQUIRED_KEYS)
def test_required_key_exists_with_this_name(key):
    cfg = _compose()
    node = cfg
    for part in key.split("."):
        assert isinstance(node, DictConfig) and part in node, f"{key}: no {part!r}"
        assert not OmegaConf.is_missing(node, part), f"{key} is missing"
        node = node[part]
    _attr(options(cfg), key)  # the typed options have it under the same name


@pytest.mark.parametrize("override", ["network.widht=3", "train.iteration=3", "sede=1",
                                      "optimizer.memmory=5"])
def test_misspelled_key_fails(override):
    with pytest.raises(ConfigCompositionException) as err:
        _compose(override)
    cause = err.value.__cause__
    assert isinstance(cause, ConfigAttributeError)
    assert cause.full_key == override.split("=")[0]


@pytest.mark.parametrize("override", ["network.width=abc", "network.layers=2.5",
                                      "network.T=long", "train.iterations=many",
                                      "seed=x", "eval_every=[1]"])
def test_wrong_type_fails(override):
    with pytest.raises(ConfigCompositionException) as err:
        _compose(override)
    cause = err.value.__cause__
    assert isinstance(cause, ValidationError)
    assert cause.full_key == override.split("=")[0]


@pytest.mark.parametrize(("key", "raw", "typed"), [
    ("network.layers", "0", 0), ("network.layers", "-3", -3),
    ("network.width", "0", 0), ("network.width", "-1", -1),
    ("network.T", "0", 0.0), ("network.T", "-0.5", -0.5),
    ("train.iterations", "0", 0), ("train.iterations", "-2", -2),
    ("mode.warm_batches", "0", 0),      # was taken, and kept one batch's states anyway
])
def test_non_positive_value_raises_config_error(key, raw, typed):
    cfg = _compose(f"{key}={raw}")   # the type is right, so composing succeeds
    with pytest.raises(ConfigError) as err:
        options(cfg)
    message = str(err.value)
    assert key in message
    assert repr(typed) in message.split(key, 1)[1], message


@pytest.mark.parametrize("override,key", [("+foo=3", "foo"), ("+train.bar=1", "train.bar"),
                                          ("+optimizer.momentm=0.9", "optimizer.momentm")])
def test_keys_added_past_the_schema_are_rejected(override, key):
    # Hydra's '+key=value' slips past the schema; to_object would drop the value silently
    with pytest.raises(ConfigError, match=rf"^{key}: not an lptrain option"):
        options(_compose(override))


@pytest.mark.parametrize("override, message", [
    ("dataset.name=mnist", "dataset.name='mnist': the dataset chosen is peaks; choose "
                           "another with dataset=mnist"),
    ("dataset.name=cifar", "dataset.name='cifar': the dataset chosen is peaks; choose "
                           "another with dataset=NAME"),
    ("optimizer.name=adam", "optimizer.name='adam': the optimizer chosen is lbfgs; choose "
                            "another with optimizer=adam"),
])
def test_a_name_alone_does_not_choose_another_kind(override, message):
    # it renamed the chosen kind's options: a traceback from the loader (AttributeError)
    with pytest.raises(ConfigError) as err:
        options(_compose(override))
    assert str(err.value).startswith(message)


# Each dataset brings the network that suits its inputs (lptrain/conf/dataset/*.yaml defaults lists).
DATASET_NETWORK = {"peaks": "dense", "indian_pines": "dense_wide", "mnist": "conv_pooled",
                   "fashion_mnist": "conv_pooled"}


def _choice(cfg_overrides: list[str], group: str) -> str:
    return composed(*cfg_overrides, hydra_node=True).hydra.runtime.choices[group]


def test_every_dataset_brings_a_network():
    assert set(DATASET_NETWORK) == set(_yaml_options("dataset"))


@pytest.mark.parametrize("dataset", sorted(DATASET_NETWORK))
def test_dataset_selects_its_network(dataset):
    assert _choice([f"dataset={dataset}"], "network") == DATASET_NETWORK[dataset]
    opts = options(_compose(f"dataset={dataset}"))
    want = options(_compose(f"network={DATASET_NETWORK[dataset]}"))
    assert opts.network == want.network


@pytest.mark.parametrize("dataset", sorted(DATASET_NETWORK))
@pytest.mark.parametrize("network", ["dense", "conv"])
def test_explicit_network_wins_over_the_dataset(dataset, network):
    for order in ([f"dataset={dataset}", f"network={network}"],
                  [f"network={network}", f"dataset={dataset}"]):
        assert _choice(order, "network") == network
        assert options(_compose(*order)).network.name == network


@pytest.mark.parametrize("dataset", sorted(DATASET_NETWORK))
def test_network_keys_win_over_the_dataset_network(dataset):
    opts = options(_compose(f"dataset={dataset}", "network.layers=5", "network.T=2.5"))
    assert (opts.network.layers, opts.network.T) == (5, 2.5)
    assert _choice([f"dataset={dataset}", "network.layers=5"], "network") == \
        DATASET_NETWORK[dataset]


def test_mnist_network_is_the_papers_conv_net_deeper_wider_and_pooled():
    net = options(_compose("dataset=mnist")).network
    assert (net.name, net.channels, net.T, net.opening, net.pool) == ("conv", 8, 5.0, "conv", 4)
    assert net.layers == 32
    paper = options(_compose("experiment=mnist_paper")).network
    assert (paper.channels, paper.opening, paper.pool, paper.layers) == (4, "replicate", 1, 30)


@pytest.mark.parametrize("dataset", ["mnist", "fashion_mnist"])
def test_image_datasets_bring_their_training_recipe(dataset):
    opts = options(_compose(f"dataset={dataset}"))
    assert (opts.optimizer.name, opts.optimizer.schedule, opts.dtype) == \
        ("adam", "cosine", "float32")
    assert opts.train.batch_size == 100
    # the command line wins over the recipe; recipe=default is config.yaml's training
    opts = options(_compose(f"dataset={dataset}", "dtype=float64", "optimizer=sgd"))
    assert (opts.dtype, opts.optimizer.name, opts.optimizer.schedule) == \
        ("float64", "sgd", "constant")
    plain = options(_compose(f"dataset={dataset}", "recipe=default"))
    assert (plain.optimizer.name, plain.train.batch_size, plain.dtype) == \
        ("lbfgs", None, "float64")


def test_fashion_recipe_solves_its_cold_batches_on_two_fine_levels():
    # every Fashion-MNIST batch starts cold (600 an epoch in a fresh order): the latest
    # batch's states kept, two levels with c = 2 and plans of at most 2; MNIST's 48
    # batches all stay warm (the defaults)
    fashion, mnist = (options(_compose(f"dataset={d}")) for d in ("fashion_mnist", "mnist"))
    assert fashion.mode.warm_batches == 1
    assert mnist.mode.warm_batches >= 4800 // mnist.train.batch_size
    assert (fashion.mgrit.control_max_iters, mnist.mgrit.control_max_iters) == (2, 6)
    levels = [len(o.mgrit.hierarchy(32, 1).levels) for o in (fashion, mnist)]
    assert levels == [2, 3]
    assert fashion.mgrit.hierarchy(32, 1).levels[1].n_points == 17    # 16 coarse steps
    assert fashion.mgrit.grad_tol == mnist.mgrit.grad_tol == 0.2
    assert options(_compose("dataset=fashion_mnist", "mgrit.control_max_iters=5")) \
        .mgrit.control_max_iters == 5


@pytest.mark.parametrize("name", ["peaks_paper", "indian_pines_paper", "mnist_paper"])
def test_paper_experiments_train_full_batch_lbfgs_in_float64(name):
    opts = options(_compose(f"experiment={name}"))
    assert (opts.optimizer.name, opts.train.batch_size, opts.dtype) == ("lbfgs", None, "float64")


def _overlay_network(name: str) -> str:
    """The network an overlay's defaults list overrides to (following overlay parents)."""
    raw = OmegaConf.load(CONF / "experiment" / f"{name}.yaml")
    for entry in raw.get("defaults", []):
        if isinstance(entry, str):
            if entry != "_self_":
                return _overlay_network(entry)
        elif "override /network" in entry:
            return entry["override /network"]
    raise AssertionError(f"experiment/{name}.yaml names no network")


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_network_wins_over_its_dataset(name):
    """An overlay names its network; its dataset's default does not replace it."""
    assert _choice([f"experiment={name}"], "network") == _overlay_network(name)
    assert _choice([f"experiment={name}", "network=conv"], "network") == "conv"


def _float_keys(cfg, path: str = "") -> list[str]:
    out = []
    for key, value in cfg.items():
        if isinstance(value, dict):
            out += _float_keys(value, f"{path}{key}.")
        elif isinstance(value, float):
            out.append(f"{path}{key}")
    return out


def _float_keys_of(group: str) -> list[str]:
    return _float_keys(OmegaConf.to_container(_compose(group), resolve=True))


FLOAT_GROUPS = ["optimizer=lbfgs", "optimizer=adam", "optimizer=sgd"]


@pytest.mark.parametrize("group", FLOAT_GROUPS)
def test_every_float_option_refuses_nan_and_inf(group):
    """Each float key as a command-line override, refused by name. The check is one walk
    over the resolved config (config/typed.py), alike for every key and value: a key the
    groups share is tried in the first group that has it, the keys of the group's own
    node (its own dataclass) in each group, each key with one of nan, inf and -inf in
    turn (each value on a third of a group's keys, at least one)."""
    keys = _float_keys_of(group)
    assert len(keys) >= 10, keys
    earlier = {k for g in FLOAT_GROUPS[:FLOAT_GROUPS.index(group)] for k in _float_keys_of(g)}
    own = [k for k in keys if k.startswith("optimizer.") or k not in earlier]
    assert len(own) >= 3, own
    for i, key in enumerate(own):
        bad = ("nan", "inf", "-inf")[i % 3]
        with pytest.raises(ConfigError, match=rf"^{key}={bad}: must be a finite"):
            options(_compose(group, f"{key}={bad}"))


@pytest.mark.parametrize("group", ["dataset=indian_pines", "dataset=mnist",
                                   "dataset=fashion_mnist"])
def test_a_dataset_brings_no_float_option_the_optimizer_groups_lack(group):
    """... so that test_every_float_option_refuses_nan_and_inf tries every float key a
    dataset's composition has (its recipe's optimizer included)."""
    tried = {k for g in FLOAT_GROUPS for k in _float_keys_of(g)}
    keys = set(_float_keys_of(group))
    assert len(keys) >= 10 and keys <= tried, keys - tried


@pytest.mark.parametrize("override, message", [
    ("seed=99999999999999999999", "seed=99999999999999999999: is beyond the 64-bit"),
    ("seed=18446744073709551615", "seed=18446744073709551615: is beyond the 64-bit"),
    ("seed=4294967296", "seed=4294967296: must be in [0, 2**32 - 1]"),
    ("train.iterations=99999999999999999999", "train.iterations=99999999999999999999: is b"),
    ("network.T=1e300", "network.T=1e+300: must be in (0, 10000]"),
    # a tiny step: a ZeroDivisionError (h² underflows) on every rank, or 'diverged'
    ("network.T=1e-300", "network.T=1e-300: the layer step h = T/N = 3.13e-302 (N = 32) is "
                         "below 1e-08: take T >= 3.2e-07"),
    ("network.init_opening=1e200", "network.init_opening=1e+200: must be in [0, 100]"),
    ("network.init_hidden=-1", "network.init_hidden=-1.0: must be in [0, 100]"),
])
def test_numbers_the_code_cannot_handle_are_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        options(_compose(override))
    assert str(err.value).startswith(message), err.value


def test_a_samplers_intervals_are_checked_before_any_job():
    """`optimizer.lr=interval(0.5,1.0)` under hydra/sweeper=optuna (lbfgs has no lr)
    passed the check: each job then failed in Hydra with four lines and exit 1 (an
    integer key sampled as a float too)."""
    from lptrain.config import check_command, sweep_samples
    assert sweep_samples(["a=interval(0.5,1)", "b=1,2"]) == [
        ["a=0.5", "b=1"], ["a=1.0", "b=1"], ["a=0.5", "b=2"]]
    with pytest.raises(ConfigError, match=r"^optimizer.lr: not an option of this optimizer "
                                          r"choice \(LBFGSOptions\)"):
        check_command(["optimizer.lr=interval(0.5,1.0)"])
    with pytest.raises(ConfigError, match=re.escape(        # optuna samples floats
            "train.iterations: Value '2.0' of type 'float' could not be converted to "
            "Integer; an interval samples floats: train.iterations=int(interval(2,4)) "
            "for an integer key")):
        check_command(["train.iterations=interval(2,4)"])
    check_command(["optimizer=adam", "optimizer.lr=tag(log, interval(0.001, 0.1))",
                   "train.iterations=int(interval(2, 4))"])


def test_a_step_given_to_a_built_in_network_says_which_network_takes_one():
    """Was 'add a keyword argument of the step with +network.step._target_=VALUE', whose
    advice led to a second error."""
    from lptrain.config import check_command
    with pytest.raises(ConfigError, match=r"^network.step._target_: .*; only network=custom "
                                          r"takes a step"):
        check_command(["network=dense", "network.step._target_=mypkg.Step"])


def test_a_value_read_from_hydras_runtime_is_checked_as_a_first_jobs():
    """`-m seed=${hydra:job.num} ...` (a seed per job) was refused: 'HydraConfig was not
    set'; the jobs then get 0, 1, ..."""
    from lptrain.config import check_command
    check_command(["-m", "seed=${hydra:job.num}", "optimizer.step0=0.5,1.0"])
    with pytest.raises(ConfigError, match=r"^seed: .*hydra:job.nam"):
        check_command(["-m", "seed=${hydra:job.nam}"])
    # a sweep however written (review: hydra.mode=MULTIRUN was checked as a single run)
    check_command(["hydra.mode=MULTIRUN", "seed=${hydra:job.num}", "optimizer.step0=0.5,1.0"])
    # a single run has no job number: refused before anything is made, in one line
    with pytest.raises(ConfigError, match=r"a single run has no job number \(a sweep's "
                       r"\$\{hydra:job.num\}: -m\)$"):
        check_command(["seed=${hydra:job.num}"])
    # a sweep's job resumed alone has its own (resume_args.resume_args)
    check_command(["seed=${hydra:job.num}", "hydra.job.num=1"])
    # but it has Hydra's runtime otherwise (review: was refused)
    check_command(["dataset=mnist", "dataset.path=${hydra:runtime.cwd}/nodata"])


def test_a_sweeps_split_is_checked_on_the_commands_ranks_before_any_job():
    """`mpiexec -n 2 lptrain -m mode=mgrit parallel.layer_ranks=1,3`: job 0 trained,
    then job 1 was refused (README: a bad value of a sweep is found before any job)."""
    from lptrain.config import check_command
    with pytest.raises(ConfigError, match=re.escape(
            "parallel.layer_ranks=3: must divide the 2 ranks (choose one of [1, 2])")):
        check_command(["-m", "mode=mgrit", "parallel.layer_ranks=1,3"], ranks=2)
    with pytest.raises(ConfigError, match=r"parallel.layer_ranks=4: only 2 C-intervals"):
        check_command(["-m", "mode=mgrit", "network.layers=64,8", "parallel.layer_ranks=4"],
                      ranks=4)
    check_command(["-m", "mode=mgrit", "parallel.layer_ranks=1,2"], ranks=2)
    # a split only one combination cannot take (value by value, each was fine): every
    # combination of the keys a split depends on is tried
    with pytest.raises(ConfigError, match=r"parallel.layer_ranks=2: only 1 C-interval"):
        check_command(["-m", "mode=mgrit", "network.layers=64,1", "parallel.layer_ranks=1,2"],
                      ranks=2)
    # a group that sets cfactor0 and levels joins them (review)
    with pytest.raises(ConfigError, match=r"parallel.layer_ranks=4: only 2 C-intervals"):
        check_command(["-m", "mode=mgrit", "network.layers=8", "mgrit=paper,default",
                       "parallel.layer_ranks=1,4"], ranks=4)
    from lptrain.config import sweep_samples
    assert sweep_samples(["network.layers=64,1", "parallel.layer_ranks=1,2", "seed=1,2"]) == [
        ["network.layers=64", "parallel.layer_ranks=1", "seed=1"],
        ["network.layers=1", "parallel.layer_ranks=1", "seed=1"],
        ["network.layers=64", "parallel.layer_ranks=2", "seed=1"],
        ["network.layers=64", "parallel.layer_ranks=1", "seed=2"],
        ["network.layers=1", "parallel.layer_ranks=2", "seed=1"]]


@pytest.mark.parametrize("given, message", [
    ("dataset=null", "dataset=null: dataset is a config group: it takes one of its options "
                     "by name (lptrain --help lists them)"),
    ("experiment=null", "experiment=null: experiment is a config group"),
    ("mode=3", "mode=3: mode is a config group"),
    ("=5", "'=5': an override needs a key (key=value)"),        # lptrain $UNSET=5
    ("hydra/job_logging=null", "hydra/job_logging=null: hydra/job_logging is a config group"),
    # the group, not the first override of a number or null (review)
    ("seed=5 dataset=null", "dataset=null: dataset is a config group"),
    ("train.patience=null mode=3", "mode=3: mode is a config group")])
def test_a_group_given_no_name_is_one_line(given, message):
    """Hydra's defaults list raised a plain ValueError ('Config group override must be a
    string or a list. Got NoneType'): a 33-line traceback and exit 1."""
    from lptrain.config import check_command, compose
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        check_command(given.split())
    if not given.startswith("hydra/"):
        with pytest.raises(ConfigError, match="^" + re.escape(message)):
            compose(given.split())    # the tools' composition (lptrain-model, -eval)
