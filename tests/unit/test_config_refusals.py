"""What the configuration refuses, in one line naming the key and the bad value:
misspelt and unknown keys, wrong types, numbers out of range or not finite, a name or a
group given in place of a choice."""
from __future__ import annotations

import re

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ValidationError

from helpers import composed
from lptrain.config.schema import register_configs
from lptrain.config.typed import options
from lptrain.errors import ConfigError


@pytest.fixture(scope="module", autouse=True)
def _schema():
    register_configs()


def _compose(*overrides: str) -> DictConfig:
    return composed(*overrides)


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
    # sections that are not groups (held-out: no suggestion)
    ("trian.iterations=5", "trian: no such key; did you mean train?"),
    ("paralel.layer_ranks=1", "paralel: no such key; did you mean parallel?"),
    ("Train.iterations=3", "Train: no such key; did you mean train?"),
    ("mgrit.fwd_iter=4", "mgrit.fwd_iter: no such key; did you mean mgrit.fwd_iters?"),
    ("network.zzz=4", "network.zzz: no such key (lptrain --cfg job shows them)"),
    # a key of another section (held-out: the top level's keys under train.)
    ("train.checkpoint_every=5", "train.checkpoint_every: no such key; did you mean "
                                 "checkpoint_every?"),
    ("train.eval_evry=5", "train.eval_evry: no such key; did you mean eval_every?"),
    ("mgrit.seed=5", "mgrit.seed: no such key; did you mean seed?"),
    # ... named with the choices that take it (re-check: lbfgs then refused optimizer.lr)
    ("train.lr=0.1", "train.lr: no such key; did you mean optimizer.lr (a key of "
                     "optimizer=adam, sgd)?"),
    ("network.grid=64", "network.grid: no such key; did you mean dataset.grid (a key of "
                        "dataset=peaks)?"),
    ("iterations=5", "iterations: no such key; did you mean train.iterations?"),
    ("train.name=x", "train.name: no such key (lptrain"),     # name: in every group
    # another choice's key: said so, with the choice that lacks it (was its class name)
    ("optimizer.lr=0.1", "optimizer.lr: not an option of this optimizer choice "
                         "(optimizer=lbfgs); lptrain --cfg job shows its options"),
    ("optimizer=sgd optimizer.memory=3", "optimizer.memory: not an option of this optimizer "
                                         "choice (optimizer=sgd); "),
    ("optimizer=adam optimizer.memory=3", "optimizer.memory: not an option of this "
                                          "optimizer choice (optimizer=adam); "),
    ("dataset.path=/tmp", "dataset.path: not an option of this dataset choice "
                          "(dataset=peaks); "),
    ("dataset=mnist dataset.grid=5", "dataset.grid: not an option of this dataset choice "
                                     "(dataset=mnist); ")])
def test_a_misspelt_key_is_named_with_the_nearest_one(given, message):
    """Was "Key 'widht' not in 'NetworkOptions'": a class name, no way out."""
    from lptrain.config import check_command
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        check_command(given.split())


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


def _refused_by_composition(override: str, cause_type: type) -> None:
    """Composing with the override fails with a cause of this type naming its key."""
    with pytest.raises(ConfigCompositionException) as err:
        _compose(override)
    cause = err.value.__cause__
    assert isinstance(cause, cause_type)
    assert cause.full_key == override.split("=")[0]


@pytest.mark.parametrize("override", ["network.widht=3", "train.iteration=3", "sede=1",
                                      "optimizer.memmory=5"])
def test_misspelled_key_fails(override):
    _refused_by_composition(override, ConfigAttributeError)


@pytest.mark.parametrize("override", ["network.width=abc", "network.layers=2.5",
                                      "network.T=long", "train.iterations=many",
                                      "seed=x", "eval_every=[1]"])
def test_wrong_type_fails(override):
    _refused_by_composition(override, ValidationError)


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


@pytest.mark.parametrize("given, message", [
    ("mode.name=mgrit", "mode.name='mgrit': the mode chosen is serial; choose another with "
                        "mode=mgrit (`lptrain --help` lists them)"),
    ("network.name=conv", "network.name='conv': the network chosen is dense; choose another "
                          "with network=conv"),
    ("network=dense_wide network.name=custom", "network.name='custom': the network chosen "
                                               "is dense_wide; choose another with "
                                               "network=custom"),
])
def test_a_mode_or_network_name_alone_is_refused(given, message):
    """mode.name=mgrit trained in mgrit mode while .hydra/hydra.yaml recorded mode: serial;
    network.name=conv failed on an unrelated key. The name its choice sets passes."""
    from lptrain.config import check_command
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        check_command(given.split())
    check_command(["mode=mgrit", "mode.name=mgrit", "network=dense_wide", "network.name=dense"])


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
    # no T can give these layers a step: the layers are named (was: take T >= 9.22e+10)
    ("network.layers=9223372036854775807", "network.layers=9223372036854775807: the layer "
     "step h = T/N is below 1e-08 for every network.T up to 10000: at most 1000000000000"),
    ("network.init_opening=1e200", "network.init_opening=1e+200: must be in [0, 100]"),
    # torch.optim.SGD refuses it; the functional sgd lptrain calls ran plain SGD
    ("optimizer=sgd optimizer.nesterov=true optimizer.momentum=0",
     "optimizer.nesterov=true: needs optimizer.momentum > 0"),
    ("network.init_hidden=-1", "network.init_hidden=-1.0: must be in [0, 100]"),
])
def test_numbers_the_code_cannot_handle_are_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        options(_compose(*override.split()))
    assert str(err.value).startswith(message), err.value


@pytest.mark.parametrize("override, message", [
    ("mgrit.nrelax=1000000000", "mgrit.nrelax=1000000000: must be at most 32 (CF sweeps "
                                "per relaxation)"),
    ("mgrit.nrelax0=33", "mgrit.nrelax0=33: must be at most 32"),
    *((f"mgrit.{key}=1001", f"mgrit.{key}=1001: must be at most 1000 (iterations per solve)")
      for key in ("max_iter", "adj_max_iter", "fwd_iters", "adj_iters",
                  "control_max_iters", "adaptive_max_extra")),
])
def test_iteration_counts_have_an_upper_bound(override, message):
    """mode=mgrit mgrit.nrelax=1000000000 ran for ever: a stop signal is acted on only
    between optimizer iterations."""
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        options(_compose(override))
    options(_compose(override.split("=")[0] + "=" + message.split("at most ")[1].split()[0]))


def test_a_step_given_to_a_built_in_network_says_which_network_takes_one():
    """Was 'add a keyword argument of the step with +network.step._target_=VALUE', whose
    advice led to a second error."""
    from lptrain.config import check_command
    with pytest.raises(ConfigError, match=r"^network.step._target_: .*; only network=custom "
                                          r"takes a step"):
        check_command(["network=dense", "network.step._target_=mypkg.Step"])


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


@pytest.mark.parametrize("overrides", [["mgrit.control_min_iters=7"],
                                       ["mgrit.control_max_iters=0"],
                                       ["mgrit.control_min_iters=3", "mgrit.control_max_iters=2"]])
def test_crossed_plan_bounds_name_both_values(overrides):
    """Was 'mgrit.control_max_iters=6: must be >= ...' for control_min_iters=7: it led
    with the key the user had not typed."""
    min_, max_ = (options(_compose()).mgrit.control_min_iters,
                  options(_compose()).mgrit.control_max_iters)
    for o in overrides:
        key, value = o.split("=")
        min_, max_ = (int(value), max_) if key.endswith("min_iters") else (min_, int(value))
    with pytest.raises(ConfigError) as err:
        options(_compose(*overrides))
    assert str(err.value) == (f"mgrit.control_min_iters={min_} and mgrit.control_max_iters="
                              f"{max_}: the fewest iterations planned exceed the most")


@pytest.mark.parametrize("overrides, key", [
    (["mgrit.coarse_weights=x"], "mgrit.coarse_weights"), (["mgrit.control=x"], "mgrit.control"),
    (["mgrit.cycle=x"], "mgrit.cycle"), (["mgrit.level_ops=x"], "mgrit.level_ops"),
    (["dtype=x"], "dtype"), (["device=x"], "device"), (["logger=x"], "logger"),
    (["network.bias=x"], "network.bias"), (["network.init=x"], "network.init"),
    (["network.activation=x"], "network.activation"), (["network.opening=x"], "network.opening"),
    (["optimizer=adam", "optimizer.schedule=x"], "optimizer.schedule"),
    (["dataset=mnist", "dataset.scaling=x"], "dataset.scaling"),
    (["dataset=indian_pines", "dataset.variant=x"], "dataset.variant")])
def test_every_choice_refusal_lists_the_choices_alike(overrides, key):
    """The choices were worded four ways: ('a', 'b'), ['a', 'b'], 'a or b', and
    'must be one of'."""
    with pytest.raises(ConfigError) as err:
        options(_compose(*overrides))
    assert re.fullmatch(rf"{re.escape(key)}='x': choose one of [\w.-]+(, [\w.-]+)+( .*)?",
                        str(err.value)), err.value


@pytest.mark.parametrize("given", ["~train", "~seed", "~network.width"])
def test_a_deleted_key_is_refused(given):
    """`~train` ran on the schema's hidden defaults (100 iterations, not 300) with no
    train section in the saved config; `~seed` dropped the key."""
    from lptrain.config import check_command
    with pytest.raises(ConfigError, match=rf"^{given}: lptrain's configuration keeps every "
                                          rf"key .*; give {given[1:]} a value instead$"):
        check_command([given])


def test_hydras_way_out_is_kept_in_the_one_line():
    """Hydra's '3. To sweep over it, add --multirun' and 'To append to your config use
    +hydra.…' were cut with the lines after the first."""
    from lptrain.config import one_line_error
    exc = ConfigCompositionException("Ambiguous value for argument 'seed=1,2'\n1. To use "
                                     "it as a list, use key=[value1,value2]\n3. To sweep "
                                     "over it, add --multirun to your command line")
    assert str(one_line_error(exc)).startswith(
        "Ambiguous value for argument 'seed=1,2'; a ',' gives several values: a sweep "
        "over them needs -m")
    exc = ConfigCompositionException("Could not override 'hydra.job.env_set'.\nTo append "
                                     "to your config use +hydra.job.env_set={FOO:bar}")
    assert str(one_line_error(exc)).endswith(
        "; to append to your config use +hydra.job.env_set={FOO:bar}")
    exc = ConfigCompositionException("Could not override 'foo'.\nTo append to your config "
                                     "use +foo=1")       # lptrain's schema takes no '+'
    assert "append" not in str(one_line_error(exc))


def test_a_group_added_with_plus_is_told_to_be_chosen():
    """`+experiment=peaks_paper` got Hydra's defaults-list advice, 'To override a value
    use 'override experiment: peaks_paper'', which a command line cannot take."""
    from lptrain.config import check_command
    with pytest.raises(ConfigError, match=r"^experiment is in the defaults list already; "
                                          r"choose with experiment=peaks_paper, "
                                          r"without '\+'$"):
        check_command(["+experiment=peaks_paper"])
