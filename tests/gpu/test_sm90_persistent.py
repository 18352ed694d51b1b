"""The sm90 kernels' persistent schedule with many rounds per CTA on small problems: the grid
is capped at 3 CTAs (``CUPY_FLASHATTN_SM90_GRID=ctas=3``), so every CTA walks dozens of query
tiles -- the ring counters, the q_full / q_empty phases, the ping-pong turns, the snake order
and the per-tile geometry carried from tile to tile -- over the same problems as the edge
tests: ragged lengths, varlen with empty sequences, scattered pages of 1 / 7 / 16 / 256 rows,
windows with ALiBi and softcap, GQA, single query rows, head dims 64..256.  Same oracle and
bound as test_gpu_kernels.py.  (Launches with fewer tiles than SMs, the common case of the
other tests, run one round per CTA.)
"""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from test_gpu_kernels import make_problem  # noqa: E402
# sm90_path: the edge tests' autouse fixture (a 9.0 GPU, sm90 forced), active here too.
from test_sm90_edges import check_sm90, sm90_path  # noqa: E402, F401

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def few_persistent_ctas():
    from cupy_flashattn._cuda.schedule import SM90_GRID_ENV

    mp = pytest.MonkeyPatch()
    mp.setenv(SM90_GRID_ENV, "ctas=3")
    yield
    mp.undo()


def _check(problem):
    from cupy_flashattn._cuda.launch import PrefillPlan

    assert PrefillPlan(problem).grid[0] <= 3
    check_sm90(problem)


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_dense_many_rounds(d, causal):
    """Dense (the persistent grid users get), Sq != Sk and a partial last tile."""
    rng = np.random.default_rng(d + causal)
    _check(make_problem(rng, dtype="bf16", d=d, h=3, lens_q=[300, 300], lens_k=[1025, 1025],
                        causal=causal))


@pytest.mark.parametrize("causal", [False, True])
def test_ragged_many_rounds(causal):
    rng = np.random.default_rng(3 + causal)
    _check(make_problem(rng, dtype="bf16", d=128, h=3, lens_q=[97, 300], lens_k=[1025, 131],
                        causal=causal))


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_with_empty_sequences_many_rounds(causal):
    rng = np.random.default_rng(5 + causal)
    _check(make_problem(rng, dtype="f16", d=128, h=4, hk=2, lens_q=[0, 257, 1, 130, 0],
                        lens_k=[5, 400, 0, 130, 77], varlen=True, causal=causal))


@pytest.mark.parametrize("page", [1, 7, 16, 256])
def test_paged_many_rounds(page):
    rng = np.random.default_rng(page)
    _check(make_problem(rng, dtype="bf16", d=128, h=8, hk=2, lens_q=[130, 1, 257],
                        lens_k=[300, 129, 1000], page=page, causal=True))


@pytest.mark.parametrize("window", [(32, 0), (100, 100)])
def test_windows_alibi_softcap_many_rounds(window):
    rng = np.random.default_rng(sum(window))
    _check(make_problem(rng, dtype="f16", d=128, h=3, lens_q=[260, 260], lens_k=[400, 400],
                        window=window, alibi=True, softcap=30.0))


def test_gqa_and_single_rows_many_rounds():
    rng = np.random.default_rng(11)
    _check(make_problem(rng, dtype="bf16", d=64, h=16, hk=2, lens_q=[1, 200, 1],
                        lens_k=[4096, 333, 97], causal=True))


@pytest.mark.parametrize("page", [0, 16])
def test_dynamic_schedule_counter_is_ready_for_the_next_launch(page):
    """Varlen / paged launches claim tiles from a counter that the kernel's last CTA zeroes
    (sm90/tile_scheduler.cuh): one plan launched again and again -- back to back, then from a
    CUDA graph replayed twice -- computes every tile each time (the output is poisoned with NaN
    before each launch and must come back equal to the checked first one)."""
    from cupy_flashattn._cuda.launch import PrefillPlan

    rng = np.random.default_rng(21 + page)
    problem = make_problem(rng, dtype="bf16", d=128, h=4, hk=2, lens_q=[257, 1, 130, 400],
                           lens_k=[300, 129, 130, 1000], varlen=True, page=page, causal=True)
    plan = PrefillPlan(problem)
    assert plan.dynamic and plan.grid[0] <= 3
    check_sm90(problem)
    first = problem.out.view(cupy.uint16).copy()  # bit patterns
    for _ in range(3):
        problem.out.fill(np.nan)
        plan.run(problem)
        plan.run(problem)
        assert bool((problem.out.view(cupy.uint16) == first).all())
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        plan.run(problem)  # this stream's counter exists before the capture
        stream.synchronize()
        stream.begin_capture()
        plan.run(problem)
        graph = stream.end_capture()
        for _ in range(2):
            problem.out.fill(np.nan)
            graph.launch(stream)
            stream.synchronize()
            assert bool((problem.out.view(cupy.uint16) == first).all())
