"""Every config group option, experiment overlay and dataset default composes into validated
options that hold the values its file sets.

Composition goes through Hydra's compose API against lptrain/conf/ (no subprocess); validation is
lptrain.config.typed.options, i.e. the typed schema and its __post_init__ checks.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from helpers import composed
from lptrain import config
from lptrain.config.schema import Config, dataset_options, register_configs
from lptrain.config.typed import options

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
