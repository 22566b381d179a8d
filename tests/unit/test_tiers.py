"""Every test file says which tier it is in (tests/tiers.py), and the covering subsets of
parameter products hold every pair of values (tests/covering.py)."""
import re
from pathlib import Path

from covering import pairwise, product
from tiers import FILES, TIERS

UNIT = Path(__file__).resolve().parent


def test_every_unit_test_file_has_a_tier():
    marked = re.compile(rf"^pytestmark = .*pytest\.mark\.({'|'.join(TIERS)})\b", re.M)
    missing = [p.name for p in sorted(UNIT.glob("test_*.py"))
               if p.name not in FILES and not marked.search(p.read_text())]
    assert not missing, f"add these to tests/tiers.py FILES (or a pytestmark): {missing}"
    assert set(FILES.values()) <= set(TIERS)


def test_pairwise_cases_hold_every_pair_and_fewer_than_the_product():
    factors = dict(a=(1, 2, 3), b=("x", "y"), c=(True, False), d=(0, 1, 2))
    full, cover = product(factors), pairwise(product(factors))
    assert len(full) == 36 and 9 <= len(cover) < 13
    for one, two in [("a", "b"), ("a", "d"), ("b", "c"), ("c", "d")]:
        assert {(c[one], c[two]) for c in cover} == {(c[one], c[two]) for c in full}
    assert pairwise(product(factors)) == cover          # fixed, not random
