"""The commands' argparse pieces: --help wrapped between words only (argparse breaks at
hyphens, which cut file and command names: `model-` / `last.pt`), a directory
argument that may not be empty, and the --version every command answers."""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path


def out_dir(text: str) -> Path:
    """An --out directory: `--out=` (empty, e.g. an unset variable) had written the
    report's files into the current directory; say `--out .` for that."""
    if not text:
        raise argparse.ArgumentTypeError("an empty directory is the current one: give "
                                         "it as . if that is meant")
    return Path(text)


class WordsFormatter(argparse.HelpFormatter):
    """argparse's help layout, lines broken between words, never inside a hyphenated
    name."""

    def _split_lines(self, text, width):
        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width,
                             break_on_hyphens=False)


def version_line() -> str:
    """`lptrain --version`: this package's version and the versions it runs on."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    ours = sys.modules["lptrain"].__version__   # this module's package, loaded first
    parts = []
    for dist in ("torch", "mpi4py", "hydra-core"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} not installed")
    return f"lptrain {ours} ({', '.join(parts)}, Python {platform.python_version()})"


class Parser(argparse.ArgumentParser):
    """argparse's parser, but --help and --version that cannot be written (stdout on a
    full disk) raise the OSError (argparse drops it and exits 0 as if shown), and
    --version prints `lptrain --version`'s line unwrapped."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_argument("--version", action=_Version, nargs=0,
                          help="the version of lptrain and of what it runs on, then exit")

    def print_help(self, file=None):
        (file or sys.stdout).write(self.format_help())


class _Version(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        sys.stdout.write(version_line() + "\n")
        parser.exit()
