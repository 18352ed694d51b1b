"""Splitting one pytest run into N processes (``$CUPY_FLASHATTN_TEST_SHARD="i/N"``, used by
tools/gpu_suite_parallel.sh): shard i keeps every N-th collected test from the i-th on, so the
parametrizations of one test spread over all shards and the shards take similar time."""

from __future__ import annotations

SHARD_ENV = "CUPY_FLASHATTN_TEST_SHARD"


def parse_shard(spec: str):
    """"i/N" -> (i, N) with 0 <= i < N; raises ValueError otherwise."""
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"{SHARD_ENV}={spec!r}: expected 'i/N', e.g. '0/4'") from None
    if not (n >= 1 and 0 <= i < n):
        raise ValueError(f"{SHARD_ENV}={spec!r}: need 0 <= i < N")
    return i, n


def select_shard(items: list, spec: str):
    """(kept, deselected) items of shard ``spec`` ("i/N"), in collection order."""
    i, n = parse_shard(spec)
    return items[i::n], [it for k, it in enumerate(items) if k % n != i]
