"""The commands' argparse pieces: --help wrapped between words only (argparse breaks at
hyphens, which cut file and command names: `model-` / `last.pt`), and a directory
argument that may not be empty."""
from __future__ import annotations

import argparse
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
