"""The test-sharding helper of tests/conftest.py (tools/gpu_suite_parallel.sh)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from _shard import parse_shard, select_shard


def test_shards_partition_the_collected_tests_in_order():
    items = list(range(11))
    shards = [select_shard(items, f"{i}/3") for i in range(3)]
    kept = [k for k, _ in shards]
    assert kept == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8]]
    assert sorted(sum(kept, [])) == items
    for (k, d) in shards:
        assert sorted(k + d) == items and not set(k) & set(d)


@pytest.mark.parametrize("bad", ["", "3", "3/3", "-1/2", "a/b", "1/0"])
def test_a_bad_spec_says_what_is_expected(bad):
    with pytest.raises(ValueError, match="CUPY_FLASHATTN_TEST_SHARD"):
        parse_shard(bad)


def test_pytest_runs_only_its_shard():
    """Through conftest.py: the two shards of this module's spec test collect disjoint halves."""
    here = os.path.dirname(os.path.abspath(__file__))
    target = os.path.join(here, "test_shard.py") + "::test_a_bad_spec_says_what_is_expected"
    seen = []
    for i in range(2):
        env = dict(os.environ, CUPY_FLASHATTN_TEST_SHARD=f"{i}/2")
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                              "-p", "no:cacheprovider", target], env=env, cwd=os.path.dirname(here),
                             capture_output=True, text=True, timeout=120).stdout
        seen.append({line for line in out.splitlines() if "::" in line})
    assert len(seen[0]) == 3 and len(seen[1]) == 3 and not seen[0] & seen[1]
