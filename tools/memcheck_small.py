"""Small problems for compute-sanitizer (memcheck / racecheck): paged (scattered pages,
page sizes 1/16/48, a partial last page), varlen with empty sequences, causal, local, GQA,
alibi + softcap.  Prints one line per case and the max error vs the float64 reference."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.gpu.test_gpu_kernels import check, make_problem  # noqa: E402

rng = np.random.default_rng(0)
cases = [
    dict(dtype="bf16", d=128, h=4, hk=1, lens_q=[70, 1, 0], lens_k=[100, 33, 5], page=16, causal=True),
    dict(dtype="f16", d=64, h=4, hk=2, lens_q=[20, 3], lens_k=[47, 9], page=1),
    dict(dtype="bf16", d=96, h=2, lens_q=[33, 40], lens_k=[70, 55], page=48, window=(8, 4)),
    dict(dtype="f16", d=80, h=6, hk=3, lens_q=[5, 0, 70, 1], lens_k=[0, 9, 90, 64], causal=True),
    dict(dtype="bf16", d=256, h=2, lens_q=[40], lens_k=[70], alibi=True, softcap=15.0),
    dict(dtype="bf16", d=32, h=2, lens_q=[130], lens_k=[20], causal=True),
]
for c in cases:
    check(make_problem(rng, **c))
    print("ok", c, flush=True)
print("memcheck cases done")

# Absent pages (ids -1, num_pages, INT_MIN, INT_MAX in the table): must read nothing.
from tests.gpu.test_gpu_kernels import test_absent_pages  # noqa: E402

for page, d in ((16, 128), (48, 96), (256, 128)):
    test_absent_pages(page, d)
    print("ok absent pages", page, d, flush=True)
print("memcheck absent-page cases done")
