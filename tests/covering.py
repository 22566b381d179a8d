"""Covering subsets of parameter products for the default run, the full product under
`slow`: pairwise cases hold every value of every parameter together with every value of
every other one at least once, so each parameter's effect and each interaction of two
runs in `make test-fast`; only interactions of three or more wait for `make test`."""
from __future__ import annotations

import itertools

import pytest


def _pairs(case: dict) -> set:
    return {((a, case[a]), (b, case[b])) for a, b in itertools.combinations(case, 2)}


def product(factors: dict[str, tuple]) -> list[dict]:
    """Every combination, in itertools.product order."""
    return [dict(zip(factors, values)) for values in itertools.product(*factors.values())]


def pairwise(cases: list[dict]) -> list[dict]:
    """A small subset of `cases` holding every pair of values they hold (greedy: each next
    case covers the most pairs still missing, the first such in order, so it is fixed)."""
    missing = set().union(*map(_pairs, cases)) if cases else set()
    chosen = []
    while missing:
        best = max(cases, key=lambda case: len(_pairs(case) & missing))
        chosen.append(best)
        missing -= _pairs(best)
    return chosen


def params(cases: list[dict], make, ids) -> list:
    """`cases` as pytest params (values `make(case)`, id `ids(case)`): a pairwise subset
    plain, the others marked slow."""
    cover = pairwise(cases)
    return [pytest.param(*make(case), id=ids(case),
                         marks=() if case in cover else pytest.mark.slow)
            for case in cases]
