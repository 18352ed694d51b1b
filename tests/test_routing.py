"""Which CUDA kernel serves which problem (pure host logic: runs without a GPU)."""

import numpy as np
import pytest

pytest.importorskip("cupy")
from cupy_flashattn._cuda import decode_applies, decode_len_q_limit, mixed_split  # noqa: E402
from cupy_flashattn.problem import AttentionProblem  # noqa: E402


def _problem(H, Hk, max_q, cu=True, B=3, D=128, out_dtype=np.float16):
    q = np.zeros((8, H, D), np.float16)
    k = np.zeros((8, Hk, D), np.float16)
    return AttentionProblem(
        q=q, k=k, v=k, out=np.zeros((8, H, D), out_dtype), softmax_lse=np.zeros((H, 8), np.float32),
        batch_size=B, seqlen_q=0, seqlen_k=0, max_seqlen_q=max_q, max_seqlen_k=8,
        cu_seqlens_q=np.zeros(B + 1, np.int32) if cu else None,
    )


@pytest.mark.parametrize("H,Hk,limit", [(32, 8, 16), (32, 32, 16), (32, 1, 2), (48, 8, 10)])
def test_decode_limit_agrees_with_decode_applies(H, Hk, limit):
    """The mixed-batch threshold is exactly the longest query length decode serves alone."""
    assert decode_len_q_limit(H, Hk) == limit
    assert decode_applies(_problem(H, Hk, limit))
    assert not decode_applies(_problem(H, Hk, limit + 1))


def test_mixed_split_only_for_varlen_batches_without_temporaries():
    assert mixed_split(_problem(32, 8, 300)) == 16
    assert mixed_split(_problem(32, 8, 300, cu=False)) is None  # dense: one kernel
    assert mixed_split(_problem(32, 8, 300, B=1)) is None
    assert mixed_split(_problem(32, 8, 300, D=59)) is None  # padded head dim: temporaries
    assert mixed_split(_problem(32, 8, 300, out_dtype=np.float32)) is None
