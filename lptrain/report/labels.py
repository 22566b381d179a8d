"""Run labels for lptrain-report: each run's mode, its ranks, and what sets it apart
(one run alone: the overrides its command typed).

What sets runs apart is looked for where the user chose it first: the overrides typed
on the command line (`.hydra/overrides.yaml` beside metrics.h5), then the config groups
Hydra chose (`.hydra/hydra.yaml`, e.g. the `network` a dataset brings), then the
flattened config stored in metrics.h5 (runs not started by the lptrain command have
only that). Every differing typed override is shown; chosen groups and config values
up to a total of MAX_LABEL_KEYS settings, those that tell most runs apart first.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import yaml

from lptrain.config import override_key
from lptrain.metrics import schema as s
from lptrain.metrics.reader import RunMetrics, interpolated
from lptrain.report.table import flat_config

MAX_LABEL_KEYS = 4
SHORT_DIGITS = 4       # significant digits of a long number in a label, at least
_NOT_LABELS = ("hydra", "resume", s.MODE)   # the mode is a label's first word


def run_labels(runs: Sequence[RunMetrics]) -> list[str]:
    """A label per run: its mode, P=ranks if ranks vary, every override typed differently,
    then (up to MAX_LABEL_KEYS settings in all) the chosen groups and config values that
    differ, those that tell most runs apart first; duplicates get a '#k' suffix."""
    sources = [[typed_overrides(run) for run in runs],
               [hydra_choices(run) for run in runs],
               [flat_config(run.attrs.get(s.CONFIG, "")) for run in runs]]
    reads = [_reader(run) for run in runs]
    ranks_vary = len({run.attrs.get(s.WORLD_SIZE) for run in runs}) > 1
    parts = [[run.mode] + ([f"P={run.attrs.get(s.WORLD_SIZE)}"] if ranks_vary else [])
             for run in runs]
    shown: list[str] = []
    if len(runs) == 1:       # nothing to tell it from: its command's own overrides
        typed = sources[0][0]
        parts[0] += [f"{k}={typed[k]}" for k in _labelled([typed]) if reads[0](k)]
        return [" ".join(_built(p, runs[0]) for p in parts[0])]
    for key in differing(sources[0], common_only=False):    # typed: all, even under a
        _show(key, _parts(key, reads, sources), parts, shown, typed=True)   # typed group
    rest = [(key, _parts(key, reads, sources))
            for rank in (1, 2) for key in differing(sources[rank], common_only=rank == 2)]
    while len(shown) < MAX_LABEL_KEYS:
        scored = [(_distinct([p + n for p, n in zip(parts, new)]), -i, key, new)
                  for i, (key, new) in enumerate(rest) if new and not _covered(key, shown)]
        if not scored:
            break
        _, _, key, new = max(scored)
        _show(key, new, parts, shown)
    return _unique([" ".join(_built(p, run) for p in part) for part, run in zip(parts, runs)],
                   runs)


def _built(part: str, run: RunMetrics) -> str:
    """A label part as shown: `mgrit.levels=N`, an upper bound, with the hierarchy the
    run built where that has fewer levels (`mgrit.levels=10 (built 30/15)`)."""
    key, _, value = part.partition("=")
    levels = str(run.attrs.get(s.MGRIT_LEVELS) or "")
    if key != "mgrit.levels" or not levels or str(len(levels.split("/"))) == value:
        return part
    return f"{part} (built {levels})"


def _parts(key: str, reads: Sequence, sources: list[list[dict]]):
    """The label part of each run for `key`, or None where the runs show the same value.
    A run shows the value it typed, else the group Hydra chose, else its config's, and
    none where it does not read the key (reads[i]: run i's _reader; a serial run's
    mgrit settings: config/inert.py, as its console said)."""
    values = [_value(key, [source[i] for source in sources]) if read(key) else None
              for i, read in enumerate(reads)]
    first: dict = {}          # one text per value: `0` and `0.0` are one learning rate
    values = [None if v is None else first.setdefault(_number(v), v) for v in values]
    if len({str(v) for v in values}) == 1:
        return None       # seed=0 typed in one run and the default in the others
    texts = _short_numbers(values)
    return [[] if v is None else [f"{key}={texts[v]}"] for v in values]


def _short_numbers(values) -> dict:
    """value -> its text in a label: a number with more than SHORT_DIGITS significant
    digits (a sweeper's draw, 0.501030153150023) at the fewest digits, SHORT_DIGITS or
    more, that keep the runs' different values apart; anything else as it is."""
    given = [v for v in dict.fromkeys(values) if v is not None]
    numbers = [v for v in given if isinstance(_number(v), float)
               and not _number(v).is_integer()]         # a count or a seed as typed
    for digits in range(SHORT_DIGITS, 18):
        texts = {v: f"{_number(v):.{digits}g}" for v in numbers}
        if len(set(texts.values())) == len(numbers):
            break
    return {v: texts[v] if v in texts and len(texts[v]) < len(str(v)) else v for v in given}


def _reader(run: RunMetrics):
    """key -> whether the run read it, judged from its stored config (parsed once) and
    MGRIT levels; a config too old or foreign to judge reads every key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from lptrain.config.inert import Built, reads
    from lptrain.model.network import VECTOR_OPENINGS
    judged = (OmegaConfBaseException, AttributeError, TypeError, ValueError)
    try:
        cfg = OmegaConf.create(run.attrs.get(s.CONFIG) or "{}")
        levels = str(run.attrs.get(s.MGRIT_LEVELS) or "")
        opening = OmegaConf.select(cfg, "network.opening")
        built = Built(None if opening is None else opening not in VECTOR_OPENINGS,
                      len(levels.split("/")) if levels else None)
    except judged:
        return lambda key: True

    def read(key: str) -> bool:
        try:
            return reads(cfg, built, key.replace("/", "."))
        except judged:
            return True
    return read


def _number(value):
    """The number a value's text is (`0`, `0.0` and 0.0 alike), else the text."""
    if isinstance(value, bool):
        return str(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def _show(key: str, new, parts: list[list[str]], shown: list[str], typed: bool = False
          ) -> None:
    """Add `new` (from _parts) to the labels' parts unless it is None or, for a setting
    not typed, a shown one sets `key` (network.name beside a typed network=...)."""
    if new and (typed or not _covered(key, shown)):
        shown.append(key.replace("/", "."))
        for part, more in zip(parts, new):
            part += more


def differing(values: Sequence[dict], common_only: bool) -> list[str]:
    """Keys whose values are not the same in all `values` (a key one run lacks differs
    unless `common_only`), in first-seen order, leaving out the mode, Hydra's own
    settings and paths (those differ in every multirun job)."""
    keys = list(dict.fromkeys(k for v in values for k in v))
    if common_only:
        keys = [k for k in keys if all(k in v for v in values)]
    return [k for k in _labelled(values, keys) if len({repr(v.get(k)) for v in values}) > 1]


def _labelled(values: Sequence[dict], keys=None) -> list[str]:
    """The keys of `values` (or `keys`) a label may show: not the mode, Hydra's own
    settings, resume= or a path."""
    keys = list(dict.fromkeys(k for v in values for k in v)) if keys is None else keys
    return [k for k in keys
            if k.replace("/", ".").split(".")[0] not in _NOT_LABELS
            and not any("/" in str(v.get(k, "")) for v in values)]


def typed_overrides(run: RunMetrics) -> dict:
    """{key: value as typed} of the run's command-line overrides; {} without the file.
    A value typed as an interpolation (`seed=${hydra:job.num}`) is left out: the same
    text in every job, it would hide the value each job ran with, which its config has."""
    items = _hydra_file(run, "overrides.yaml")
    if not isinstance(items, list):
        return {}
    pairs = (str(item).split("=", 1) for item in items)
    return {override_key(key): value for key, value, *_ in (p + [""] for p in pairs)
            if not interpolated(value)}


def hydra_choices(run: RunMetrics) -> dict:
    """{group: option} Hydra chose for the run (`runtime.choices`); {} without the file."""
    try:
        choices = _hydra_file(run, "hydra.yaml")["hydra"]["runtime"]["choices"]
    except (KeyError, TypeError):
        return {}
    return {k: v for k, v in choices.items() if v is not None} if isinstance(
        choices, dict) else {}


def _hydra_file(run: RunMetrics, name: str):
    """A YAML file Hydra wrote beside the run's metrics.h5, parsed; None if unreadable."""
    try:
        return yaml.safe_load((Path(run.path).parent / ".hydra" / name).read_text())
    except (OSError, yaml.YAMLError):
        return None   # not run by the lptrain command, or Hydra wrote no files


def _value(key: str, run_sources: list[dict]):
    """The run's value of `key`, from the first source that has it (a group a run did
    not type is shown as Hydra chose it); None if none has."""
    return next((values[key] for values in run_sources if key in values), None)


def _covered(key: str, shown: list[str]) -> bool:
    """Whether a shown key sets `key` too: `network` (a group chosen) sets `network.name`."""
    dotted = key.replace("/", ".")
    return any(dotted == k or dotted.startswith(k + ".") for k in shown)


def _distinct(parts: list[list[str]]) -> int:
    """How many different labels `parts` make."""
    return len({tuple(p) for p in parts})


def _unique(labels: list[str], runs: Sequence[RunMetrics]) -> list[str]:
    """Labels that two runs share get where each run is: a sweep's job number (`#0`, as
    Hydra and the sweep's closing line name the job) or the shortest tail of the run's
    directory that tells them apart (`(B_ref)`); their order where nothing does."""
    out = list(labels)
    for label in set(labels):
        idx = [i for i, x in enumerate(labels) if x == label]
        if len(idx) < 2:
            continue
        for i, tail in zip(idx, _tails([runs[i].path.parent for i in idx])):
            out[i] = f"{label} #{tail}" if tail.isdigit() else f"{label} ({tail})"
    return out


def _tails(dirs: list[Path]) -> list[str]:
    """Each directory's fewest trailing parts that no other of `dirs` ends with ('run 1',
    'run 2', ... where the directories are the same)."""
    if len(set(dirs)) < len(dirs):
        return [f"run {i}" for i in range(1, len(dirs) + 1)]

    def tail(d: Path, k: int) -> str:
        return "/".join(d.parts[-k:])
    return [next((tail(d, k) for k in range(1, len(d.parts) + 1)
                  if all(tail(o, k) != tail(d, k) for o in dirs if o != d)), str(d))
            for d in dirs]
