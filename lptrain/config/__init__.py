"""The configuration: typed schema (schema.py), its validation (typed.py), the YAML defaults."""
from __future__ import annotations

import itertools
import math
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Mapping, Sequence

# the Hydra config directory inside the installed package (lptrain/conf/)
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
CONF_MODULE = "lptrain.conf"      # the same, as Hydra's package path pkg://lptrain.conf


def yaml_choices(group: str) -> list[str]:
    """The choices of a config group: its YAML configs (its schema nodes are none)."""
    return sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml"))


def refuse_schema_nodes(choices: Mapping[str, str | None]) -> None:
    """ConfigError if a group's choice (Hydra's runtime choices) is one of the schema
    nodes that group's configs extend: `mode=mode_schema` would run on the bare schema."""
    from lptrain.config.schema import schema_nodes
    from lptrain.errors import ConfigError, one_of
    for group, nodes in schema_nodes().items():
        chosen = choices.get(group)
        if chosen in nodes:
            raise ConfigError(f"{group}={chosen}: the schema the {group} configs extend, not "
                              f"a choice; {one_of(yaml_choices(group))}")


def compose_checked(overrides: Sequence[str], job: str | None = None, name: str = "config"):
    """The composed config `name` (its `hydra` node removed) after refusing schema nodes;
    Hydra's compose API, inside source.initialized(). With `job` ("run" or "sweep")
    Hydra's config is set as such a job's (as_a_job)."""
    from hydra import compose as hydra_compose
    from omegaconf import open_dict
    cfg = hydra_compose(config_name=name, overrides=list(overrides),
                        return_hydra_config=True)
    refuse_schema_nodes(cfg.hydra.runtime.choices)
    refuse_renamed(cfg, overrides, name)
    from lptrain.config.mixed import refuse_mixed
    refuse_mixed(cfg, overrides, name)
    with open_dict(cfg):
        if job is not None:
            _as_a_job(cfg.hydra, job == "sweep")
        del cfg["hydra"]
    return cfg


# groups whose choices share one options class: only `name` says which choice it is
NAMED_GROUPS = ("mode", "network")


def refuse_renamed(cfg, overrides: Sequence[str], name: str = "config") -> None:
    """`mode.name=mgrit` alone trained in mgrit mode with `mode: serial` recorded, and
    `network.name=conv` failed on an unrelated key: a name given apart from its choice is
    refused where it differs from the choice's own (ConfigError, as schema.check_chosen
    says it of dataset.name and optimizer.name)."""
    from hydra import compose as hydra_compose

    from lptrain.errors import ConfigError
    for o in overrides:
        group = _key_value(o)[0].removesuffix(".name")
        if group not in NAMED_GROUPS or _key_value(o)[0] != f"{group}.name":
            continue
        given = cfg[group].name
        rest = [x for x in overrides if x != o]
        if hydra_compose(config_name=name, overrides=rest)[group].name == given:
            continue
        choice = cfg.hydra.runtime.choices[group]
        other = given if given in yaml_choices(group) else "NAME"
        raise ConfigError(f"{group}.name={given!r}: the {group} chosen is {choice}; choose "
                          f"another with {group}={other} (`lptrain --help` lists them)")


def _as_a_job(hydra, sweep: bool) -> None:
    """Hydra's config set as a launched job's (check_command restores it), its runtime
    values that only such a job has filled in: its directory, and in a sweep its number
    and id as job 0's. A value that reads them (`'dataset.path=${hydra:runtime.cwd}/x'`,
    a sweep's `seed=${hydra:job.num}`) is checked, not refused; a single run has no job
    number."""
    import os

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf
    values = [(hydra.runtime, "output_dir", os.getcwd()), (hydra.runtime, "cwd", os.getcwd())]
    if sweep:
        values += [(hydra.job, "num", 0), (hydra.job, "id", "0")]
    for node, key, value in values:
        if OmegaConf.is_missing(node, key):
            node[key] = value
    HydraConfig.instance().set_config(OmegaConf.create({"hydra": hydra}))


@contextmanager
def _hydra_config_restored():
    """Hydra's global config as it was before the checks set a first job's."""
    from hydra.core.hydra_config import HydraConfig
    before = HydraConfig.instance().cfg
    try:
        yield
    finally:
        HydraConfig.instance().cfg = before


def compose(overrides: Sequence[str]):
    """(typed Config, plain dict) of the lptrain config with these overrides, without
    running Hydra's app (for tools and in-process runs); ConfigError if they are bad."""
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from lptrain.config.typed import options
    from lptrain.config.schema import register_configs
    register_configs()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose_checked(overrides)
        return options(cfg), OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as exc:
        raise one_line_error(exc) from None
    except ValueError as exc:         # Hydra's defaults list: a group given no name
        raise group_value_error(exc, overrides) from None


def override_key(override: str) -> str:
    """An override's key, without Hydra's `+`, `++` or `~` (`+seed=3` sets seed)."""
    return override.split("=", 1)[0].lstrip("+~")


def _key_value(override: str) -> tuple[str, str]:
    """An override's key (override_key) and its value as typed."""
    return override_key(override), override.partition("=")[2]


def group_value_error(exc: ValueError, overrides: Sequence[str]):
    """The ConfigError of Hydra's 'Config group override must be a string' (a group set
    to null, a number or true; an override without a key: `lptrain $UNSET=5`), naming
    the override; other ValueErrors are not Hydra's: raised as they are."""
    from lptrain.config.meanings import GROUPS
    from lptrain.errors import ConfigError
    if "Config group override" not in str(exc):
        raise exc
    for o in overrides:
        key, val = _key_value(o)
        if not key:
            return ConfigError(f"{o!r}: an override needs a key (key=value)")
        group = key in GROUPS or key.startswith("hydra/")
        if group and (val == "null" or not re.fullmatch(r"[A-Za-z_][\w-]*", val)):
            return ConfigError(f"{o}: {key} is a config group: it takes one of its options "
                               f"by name (lptrain --help lists them)")
    return ConfigError(f"{str(exc).splitlines()[0]} (lptrain --help lists the groups)")




# keys whose values decide together whether a layer x data split can be taken, or a
# mini-batch: their sweeps are checked in every combination (up to JOINT_MOST), the
# others value by value
SPLIT_KEYS = ("network.layers", "mgrit.cfactor0", "mgrit.levels", "mgrit.min_coarse",
              "parallel.layer_ranks", "parallel.data_ranks", "mode", "experiment", "network",
              "dataset", "mgrit", "recipe", "train.batch_size", "dataset.n_train",
              "optimizer")
JOINT_MOST = 32


def sweep_samples(overrides: list[str], group_options=None) -> list[list[str]]:
    """Override lists that together try every value of every sweep (`a=1,2`, `range`,
    `choice`; both ends of an `interval`; a group's `glob()` expanded over
    `group_options(group)`, the group's options as Hydra lists them, where given), the
    other sweeps at their first value: one composition per value, but every combination
    of the SPLIT_KEYS' sweeps (a split only one combination cannot take:
    `network.layers=64,1 parallel.layer_ranks=1,2`) where there are at most JOINT_MOST.
    Without sweeps, the overrides themselves."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob, IntervalSweep
    from hydra.errors import HydraException
    parsed = OverridesParser.create().parse_overrides(overrides)
    values = []
    for o in parsed:
        try:
            swept = list(o.sweep_string_iterator()) if o.is_sweep_override() else None
        except HydraException:     # glob(): needs Hydra's config loader
            if isinstance(o.value(), Glob) and group_options is not None:
                # left out, the group's keys in the other overrides were checked
                # against its default choice (`optimizer=glob(sgd) optimizer.momentum=..`)
                swept = _globbed(o, group_options(o.get_key_element()))
            elif not isinstance(o.value(), IntervalSweep):
                continue
            else:
                # a sampler's interval (hydra/sweeper=optuna): both ends, of the type it
                # samples (float, unless cast: int(interval(2, 8)))
                swept = [str(v) for v in (o.value().start, o.value().end)]
        values.append([f"{o.get_key_element()}={v}" for v in swept] if swept
                      else [o.input_line])
    if not values:
        return [[]]
    first = [v[0] for v in values]
    samples = [first]
    for i, vs in enumerate(values):
        samples += [first[:i] + [v] + first[i + 1:] for v in vs[1:]]
    joint = [i for i, vs in enumerate(values) if len(vs) > 1 and
             _key_value(vs[0])[0] in SPLIT_KEYS]
    if len(joint) > 1 and math.prod(len(values[i]) for i in joint) <= JOINT_MOST:
        for chosen in itertools.product(*(values[i] for i in joint)):
            sample = list(first)
            for i, v in zip(joint, chosen):
                sample[i] = v
            if sample not in samples:
                samples.append(sample)
    return samples


def check_switches(cfg, overrides: Sequence[str]) -> None:
    """ConfigError for a true/false key given a number other than 0 and 1 (OmegaConf
    reads `train.fail_on_stall=2`, and -1, as true); its words (true, 'yes', on, ...) are
    OmegaConf's to take or refuse."""
    from omegaconf import OmegaConf

    from lptrain.errors import ConfigError
    for o in overrides:
        key, val = _key_value(o)
        try:
            number = float(val.strip().strip("'\""))
        except ValueError:
            continue
        if number not in (0.0, 1.0) and not key.startswith("hydra") and \
                isinstance(OmegaConf.select(cfg, key, default=None), bool):
            raise ConfigError(f"{o}: {key} takes true or false")


def multirun(args: list[str]) -> bool:
    """Whether a command's arguments ask for a sweep (-m, or hydra.mode=MULTIRUN)."""
    return any(a in ("-m", "--multirun") or a.replace(" ", "") == "hydra.mode=MULTIRUN"
               for a in args)


def _globbed(override, options: list[str]) -> list[str]:
    """The options a group's glob() sweep takes; ConfigError where they include a schema
    node (Hydra's glob lists the group's every node: each would be a failed job)."""
    from lptrain.config.schema import schema_nodes
    from lptrain.errors import ConfigError
    group = override.get_key_element()
    taken = override.value().filter(options)
    schemas = [name for name in taken if name in schema_nodes().get(group, {})]
    if schemas:
        raise ConfigError(f"{override.input_line}: takes {', '.join(schemas)}, the schema "
                          f"the {group} configs extend, not a choice; leave it out with "
                          f"exclude, e.g. {group}='glob(*,exclude=*_schema)'")
    return taken


def _group_options(group: str) -> list[str]:
    """The options of config group `group` as Hydra's initialised loader lists them
    (glob() sweeps are expanded over these)."""
    from hydra.core.global_hydra import GlobalHydra
    return GlobalHydra.instance().config_loader().get_group_options(group)


def check_command(args: list[str], ranks: int | None = None, source=None) -> None:
    """Compose and type-check a command's overrides once per swept value (the lptrain
    command, rank 0, before anything is written), with Hydra's own group choices
    (`hydra/launcher=`, `hydra/sweeper=`) and its search path (`hydra.searchpath=`), from
    the command's configuration `source` (source.ConfigSource: lptrain's by default);
    Hydra's report becomes one ConfigError line. `args` are the overrides and -m.
    With `ranks`, each job's layer × data split is tried on that many ranks."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lptrain.config.schema import register_configs
    from lptrain.config.source import ConfigSource, initialized
    from lptrain.config.typed import options
    from lptrain.modes import LAYERED
    from lptrain.parallel.grid import run_grids
    register_configs()
    source = source or ConfigSource()
    overrides = [a for a in args if not a.startswith("-") and not a.startswith("hydra")
                 and not a.startswith("+hydra")]
    refuse_deletions(overrides)
    refuse_group_lists(overrides)
    # a sweep's job resumed alone keeps its number (resume_args.resume_args); the
    # search path finds the user's group options
    overrides += [a for a in args if a.startswith(("hydra.job.num=", "hydra.searchpath="))]
    groups = [a for a in args if a.startswith("hydra/")]  # launcher, sweeper: must exist
    sweep = multirun(args)
    job = "sweep" if sweep else "run"
    try:
        with initialized(source), _hydra_config_restored():
            for combination in sweep_samples(overrides, _group_options):
                cfg = compose_checked([*combination, *groups], job=job, name=source.name)
                check_switches(cfg, combination)
                typed = options(cfg)
                _batch_fits(typed)
                if ranks is not None:       # the split on these ranks, job by job
                    run_grids(typed, ranks, typed.mode.name in LAYERED)
    except (HydraException, OmegaConfBaseException) as exc:
        from lptrain.config.suggest import integer_hint
        error = integer_hint(one_line_error(exc), overrides)
        if not sweep and ("hydra:job.num" in str(error) or "hydra.job.num" in str(error)):
            from lptrain.errors import ConfigError
            error = ConfigError(f"{error}: a single run has no job number (a sweep's "
                                f"${{hydra:job.num}}: -m)")
        raise error from None
    except ValueError as exc:        # Hydra's own groups too (hydra/job_logging=null)
        raise group_value_error(exc, [*overrides, *groups]) from None


def _batch_fits(typed) -> None:
    """ConfigError where a job's mini-batch does not fit its data or optimizer (the
    run's preflight check, made for every job of a sweep before any runs); data that
    cannot be found is the run's to say when it loads it (the sizes are read without
    the samples)."""
    from lptrain.data.base import dataset_sizes
    from lptrain.errors import DataError
    from lptrain.train.batching import check_batch
    if typed.train.batch_size is None:
        return
    try:
        n_train = dataset_sizes(typed.dataset).n_train
    except DataError:
        return
    check_batch(typed.train.batch_size, typed.optimizer.name, n_train)


def refuse_group_lists(overrides: list[str]) -> None:
    """ConfigError for `GROUP=[a,b]`: Hydra merges the listed options into one config
    (`mode=[serial,mgrit]` trained mgrit, unsaid; `optimizer=[sgd,adam]` failed in a
    merge of their schemas)."""
    from lptrain.config.meanings import GROUPS
    from lptrain.errors import ConfigError
    for o in overrides:
        key, val = _key_value(o)
        if key in GROUPS and val.strip().startswith("["):
            raise ConfigError(f"{o}: {key} is a config group: a run takes one of its "
                              f"options; a sweep over them needs -m "
                              f"{key}={val.strip().strip('[]')}")


def refuse_deletions(overrides: list[str]) -> None:
    """ConfigError for `~KEY`: `~train` ran on the schema's hidden defaults (100
    iterations, not the documented 300) with no train section in the saved config."""
    from lptrain.errors import ConfigError
    for o in overrides:
        if o.startswith("~"):
            key = override_key(o)
            raise ConfigError(f"{o}: lptrain's configuration keeps every key (a deleted one "
                              f"falls back to a hidden default); give {key} a value instead")


def _documented(key: str) -> bool:
    """Whether `key` is an option of some choice (`optimizer.lr` is SGD's, not L-BFGS's:
    Hydra's message names the class that lacks it)."""
    from lptrain.config.meanings import GROUPS, KEYS
    return key in KEYS or key in GROUPS


def _choice_of(group: str, class_name: str) -> str:
    """' (optimizer=lbfgs)': the choice of `group` whose options class is `class_name`, as
    a user chooses it (the class name said nothing); '' where none is."""
    from lptrain.config.schema import schema_nodes
    names = [node.removesuffix("_schema") for node, cls in schema_nodes().get(group, {}).items()
             if cls.__name__ == class_name]
    return f" ({group}={names[0]})" if names else ""


def one_line_error(exc: Exception):
    """The ConfigError of a Hydra or OmegaConf error: its key and first line, and for a
    missing group option the options there are (schema nodes left out)."""
    from lptrain.errors import ConfigError
    cause = exc.__cause__ or exc
    key = getattr(cause, "full_key", None)
    text = str(cause).strip().splitlines()
    head = text[0] if text else type(cause).__name__
    if "Could not find" in head:
        # the option names, without the schema nodes and the search path after them
        avail = []
        for ln in text[1:]:
            if ln.startswith("Config search path"):
                break
            if ln.startswith("\t") and not ln.strip().endswith("_schema"):
                avail.append(ln.strip())
        head = re.sub(r"^In '[^']*': ", "", head) + (f"; available: {', '.join(avail)}"
                                                      if avail else "")
    again = re.match(r"Multiple values for (\S+)\. To override a value use 'override "
                     r"(\S+): (\S+)'", head)
    if again:       # `+experiment=peaks_paper`: Hydra's advice is for a defaults list
        head = (f"{again[1]} is in the defaults list already; choose with "
                f"{again[2]}={again[3]}, without '+'")
    origin = re.match(r"In '([^']*)': \w+ raised while composing config:$", head)
    if origin and len(text) > 1:     # the reason is on the lines below: a key a config sets
        head = f"{text[1].strip()} (set by {origin[1]})"
        named = [ln.split(":", 1)[1].strip() for ln in text[2:]
                 if ln.strip().startswith("full_key:")]
        key = key or (named[0] if named else None)
    known = re.fullmatch(r"Key '[\w-]+' not in '(\w+)'", head)
    if key and known and not key.startswith("hydra."):   # Hydra's own: --cfg hydra
        from lptrain.config.suggest import did_you_mean
        # its schema's class name said nothing to a user
        group = key.rpartition(".")[0]
        head = (f"not an option of this {group} choice{_choice_of(group, known[1])}; "
                f"lptrain --cfg job shows its options" if _documented(key) else
                "no such key" + did_you_mean(key) + " (lptrain --cfg job shows them)")
    if key == "network.step._target_" and "not in struct" in head:
        head += "; only network=custom takes a step: network=custom network.step._target_=..."
    elif key and key.startswith("network.step.") and "not in struct" in head:
        head += f"; add a keyword argument of the step with +{key}=VALUE"
    return ConfigError((f"{key}: {head}" if key else head) + _hydra_hint(str(exc)))


def _hydra_hint(text: str) -> str:
    """The way out Hydra's message gives on its later lines, where it has one: a value
    with ',' outside a sweep, a new key of Hydra's own config."""
    if text.startswith("Ambiguous value for argument"):
        return ("; a ',' gives several values: a sweep over them needs -m; quote the value "
                "for a string or bracket it for a list ([a,b])")
    # lptrain's own keys take no '+' (schema); Hydra's config takes new ones
    append = [ln for ln in text.splitlines()
              if ln.startswith("To append to your config use +hydra.")]
    return f"; t{append[0][1:]}" if append else ""
