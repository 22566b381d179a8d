"""The `lptrain` command: MPI-safe Hydra entry point that calls app.run.

Rank 0 chooses the run (or sweep) directory and broadcasts it, only rank 0
writes, every error ends the whole job with one line printed once.
"""
from __future__ import annotations

import sys
import traceback
from datetime import datetime
from pathlib import Path

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
PROG = "lptrain"
_failures: list[str] = []


def _say(msg: str) -> None:
    print(f"{PROG}: error: {msg}", file=sys.stderr, flush=True)


def _value(args: list[str], key: str) -> str | None:
    for a in args:
        if a.startswith(key + "="):
            return a.split("=", 1)[1]
    return None


def _directory_args(args: list[str], comm) -> tuple[list[str], str]:
    """Add hydra.run.dir / hydra.sweep.dir chosen on rank 0 to every rank's arguments."""
    multirun = "-m" in args or "--multirun" in args
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    chosen = _value(args, key)
    if chosen is None and comm.Get_rank() == 0:
        root = "multirun" if multirun else "outputs"
        chosen = datetime.now().strftime(f"{root}/%Y-%m-%d/%H-%M-%S")
    chosen = comm.bcast(chosen, root=0)
    extra = [] if _value(args, key) is not None else [f"{key}={chosen}"]
    if comm.Get_rank() != 0:
        extra += ["hydra.output_subdir=null", "hydra/job_logging=disabled",
                  "hydra/hydra_logging=disabled"]
    return args + extra, chosen


def _check_writable(directory: str) -> str | None:
    try:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".lptrain-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        return f"hydra.run.dir={directory!r}: cannot write there ({exc.strerror or exc})"
    return None


def _prevalidate(args: list[str]) -> None:
    """Compose and type-check the overrides once, turning Hydra's report into one line."""
    from hydra import compose, initialize_config_dir

    from lptrain.config.schema import register_configs
    register_configs()
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lptrain.app import options
    overrides = [a for a in args if not a.startswith("-") and not a.startswith("hydra")
                 and not a.startswith("+hydra")]
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            options(compose(config_name="config", overrides=overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise _one_line(exc) from None


def _one_line(exc: Exception):
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
        head = head.replace("In 'config': ", "") + (f"; available: {', '.join(avail)}"
                                                     if avail else "")
    return ConfigError(f"{key}: {head}" if key else head)


def main() -> None:
    import os

    from lptrain.errors import LptrainError
    from lptrain.parallel.context import (foreign_launch, keep_freed_memory, limit_threads,
                                          node_of, world)
    foreign = foreign_launch(os.environ)
    if foreign:
        if os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK", "0")) == "0":
            _say(foreign)
        sys.exit(2)
    keep_freed_memory()
    comm = world()
    limit_threads(node_of(comm))
    args = sys.argv[1:]
    plain = not any(a.startswith("-") for a in args)
    try:
        if plain:
            _prevalidate(args)
        args, directory = _directory_args(args, comm)
        problem = _check_writable(directory) if comm.Get_rank() == 0 else None
        problem = comm.bcast(problem, root=0)
        if problem:
            raise LptrainError(problem)
    except LptrainError as exc:
        if comm.Get_rank() == 0:
            _say(str(exc))
        sys.exit(2)
    sys.argv = [sys.argv[0], *args]
    _hydra_entry()
    if _failures:
        sys.exit(1)


def _task(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig

    from lptrain import app
    from lptrain.errors import LptrainError
    from lptrain.parallel.context import world
    comm = world()
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        app.run(cfg, comm, run_dir)
    except LptrainError as exc:      # raised identically on every rank
        _failures.append(str(exc))
        if comm.Get_rank() == 0:
            _say(str(exc))
    except Exception as exc:         # unexpected: log, say it once, end every rank
        log = run_dir / f"error-rank{comm.Get_rank()}.log"
        try:
            log.write_text(traceback.format_exc())
        except OSError:
            log = None
        _say(f"rank {comm.Get_rank()}: {type(exc).__name__}: {exc}"
             + (f" (traceback in {log})" if log else ""))
        if comm.Get_size() > 1:
            comm.Abort(1)
        sys.exit(1)


def _hydra_entry():
    import hydra

    from lptrain.config.schema import register_configs
    register_configs()
    return hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")(_task)()


if __name__ == "__main__":
    main()
