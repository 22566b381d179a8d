"""The commands' --help wrapped between words only: argparse breaks at hyphens, which cut
file and command names (`model-` / `last.pt`)."""
from __future__ import annotations

import argparse
import textwrap


class WordsFormatter(argparse.HelpFormatter):
    """argparse's help layout, lines broken between words, never inside a hyphenated
    name."""

    def _split_lines(self, text, width):
        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width,
                             break_on_hyphens=False)
