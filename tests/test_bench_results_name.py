"""benchmarks/measure.py gpu_slug: the file a benchmark run writes its tables to is named after
the card that ran it (an H100's rows must not land in h200.md)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import measure  # noqa: E402


@pytest.mark.parametrize("name, slug", [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA GeForce RTX 4090", "nvidia_geforce_rtx_4090"),
])
def test_results_file_is_named_after_the_card(name, slug):
    assert measure.gpu_slug(name) == slug
