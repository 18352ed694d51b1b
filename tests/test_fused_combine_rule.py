"""decode.fused_combine_applies: when a decode launch may merge its split partials in its last
split CTAs (flash_decode.cu FA_DECODE_FUSED_COMBINE, a tuning switch, on by default since an H100
run verified it; FA_DECODE_FUSED_COMBINE=0 in $CUPY_FLASHATTN_SM90_DEFINES turns it off)."""

from __future__ import annotations

import numpy as np
import pytest

from cupy_flashattn._cuda.args import INT_MAX
from cupy_flashattn._cuda.decode import fused_combine_applies
from cupy_flashattn.problem import AttentionProblem


def _problem(varlen=False):
    q = np.zeros((4, 8, 64), np.float16)
    k = np.zeros((4 * 100, 2, 64), np.float16)
    return AttentionProblem(
        q=q, k=k, v=k, out=np.zeros_like(q), softmax_lse=np.zeros((8, 4), np.float32),
        batch_size=4, seqlen_q=0 if varlen else 1, seqlen_k=100, max_seqlen_q=1, max_seqlen_k=100,
        cu_seqlens_q=np.arange(5, dtype=np.int32) if varlen else None, softmax_scale=0.125)


def test_by_default_and_only_where_every_row_is_covered(monkeypatch):
    p = _problem()
    monkeypatch.delenv("CUPY_FLASHATTN_SM90_DEFINES", raising=False)
    assert fused_combine_applies(p, 4, 1, INT_MAX, True)  # on by default
    assert not fused_combine_applies(p, 1, 1, INT_MAX, True)  # no split: nothing to merge
    assert not fused_combine_applies(p, 4, 2, INT_MAX, True)  # V-split (D 384 / 512)
    assert not fused_combine_applies(p, 4, 1, 3, True)  # a mixed batch's decode launch
    assert not fused_combine_applies(p, 4, 1, INT_MAX, False)  # adapted operands
    assert not fused_combine_applies(_problem(varlen=True), 4, 1, INT_MAX, True)


@pytest.mark.parametrize("defines, fused", [
    ("FA_DECODE_FUSED_COMBINE=0", False),  # the A/B baseline: the combine kernel
    ("FA_SM90_PINGPONG=0,FA_DECODE_FUSED_COMBINE=0", False),
    ("FA_DECODE_FUSED_COMBINE=1", True),
    ("FA_SM90_PINGPONG=0", True),  # other switches leave it on
    ("", True),
])
def test_switch_off_only_with_zero(monkeypatch, defines, fused):
    monkeypatch.setenv("CUPY_FLASHATTN_SM90_DEFINES", defines)
    assert fused_combine_applies(_problem(), 4, 1, INT_MAX, True) == fused
