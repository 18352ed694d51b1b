"""``python -m cupy_flashattn``: info, check, precompile, bench, run as a user would (a
subprocess from the checkout, CPU backend), plus the failure paths in-process."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cupy_flashattn as fa
from cupy_flashattn import cli
from cupy_flashattn._arrays import gpu_available

REPO = Path(__file__).resolve().parent.parent
FAKE_KERNEL = "fa_fwd_bf16_d128_local_paged"


def run_cli(*args, env_extra=None, timeout=600):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "cupy_flashattn", *args], check=False, cwd=REPO, env=env,
        capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture
def fake_cache(tmp_path):
    """A CUPY_CACHE_DIR holding one file that looks like a cubin of ours and one of another
    program's."""
    cache = tmp_path / "kernel_cache"
    cache.mkdir()
    name = FAKE_KERNEL.encode()
    (cache / ("a" * 32 + ".cubin")).write_bytes(
        b"0" * 40 + b"\x7fELF\x00.text." + name + b"\x00" + name + b"\x00" * 8)
    (cache / ("b" * 32 + ".cubin")).write_bytes(b"0" * 40 + b"\x7fELF\x00cupy_add\x00" * 10)
    return cache


def test_info(fake_cache):
    res = run_cli("info", env_extra={"CUPY_CACHE_DIR": str(fake_cache)})
    assert res.returncode == 0, res.stderr
    out = res.stdout
    for key in ("cupy_flashattn", "NumPy / Numba", "CuPy", "Kernel cache", "ours in cache",
                "this process"):
        assert key in out, out
    assert str(fake_cache) in out and "CUPY_CACHE_DIR" in out
    assert "2 file(s)" in out
    assert FAKE_KERNEL in out and "cupy_add" not in out
    if gpu_available():
        assert "compute capability" in out and "CUDA driver" in out, out
    else:
        assert "GPU" in out and "none usable" in out, out
        assert "CPU backend (Numba)" in out, out


def test_info_without_cache_dir(tmp_path):
    missing = tmp_path / "nowhere"
    res = run_cli("info", env_extra={"CUPY_CACHE_DIR": str(missing)})
    assert res.returncode == 0, res.stderr
    # CuPy creates the directory when imported; info scans it before that
    assert "does not exist yet" in res.stdout


def test_check_cpu_passes():
    res = run_cli("check", "--cpu")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("PASS", "FAIL"))]
    assert [ln.split()[1] for ln in lines] == list(cli.CHECKS)
    assert all(ln.startswith("PASS") for ln in lines), res.stdout
    for case in ("dense", "varlen", "paged", "kvcache", "paged-kvcache"):
        assert any(ln.split()[1] == case for ln in lines)
    assert f"check: all {len(cli.CHECKS)} passed" in res.stdout
    assert "CPU" in res.stdout.splitlines()[0]


def test_check_float16_subset():
    res = run_cli("check", "--cpu", "--dtype", "float16", "--cases", "dense", "paged")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "dtype float16" in res.stdout and "check: all 2 passed" in res.stdout


def test_check_reports_failure_and_exits_nonzero(monkeypatch, capsys):
    """A wrong answer is a FAIL line and exit status 1 (in-process, with a broken function)."""
    real = fa.flash_attn_func

    def off_by_a_bit(*args, **kwargs):
        out, lse = real(*args, **kwargs)
        return out + np.asarray(0.5, out.dtype), lse

    monkeypatch.setattr(fa, "flash_attn_func", off_by_a_bit)
    assert cli.main(["check", "--cpu", "--cases", "dense", "varlen"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  dense" in out and "ABOVE bound" in out
    assert "PASS  varlen" in out
    assert "FAILED 1 of 2 (dense)" in out


def test_check_exception_is_a_failure(monkeypatch, capsys):
    def boom(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(fa, "flash_attn_varlen_func", boom)
    assert cli.main(["check", "--cpu", "--cases", "varlen"]) == 1
    assert "FAIL  varlen" in capsys.readouterr().out


def test_usage_errors():
    assert run_cli().returncode == 2
    res = run_cli("check", "--cases", "nonsense")
    assert res.returncode == 2 and "invalid choice" in res.stderr


@pytest.mark.skipif(gpu_available(), reason="tests the no-GPU message")
def test_precompile_without_gpu_fails_clearly():
    res = run_cli("precompile", "--dtype", "bf16", "--head-dim", "128")
    assert res.returncode == 1
    assert "no usable CUDA GPU" in res.stderr and "CPU backend" in res.stderr


def test_bench_cpu_small():
    res = run_cli("bench", "--cpu", "--seqlen", "64", "--head-dim", "32", "--repeats", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "prefill causal" in res.stdout and "decode paged" in res.stdout
    assert res.stdout.count("cupy_flashattn") >= 2 and "reference (NumPy float64" in res.stdout
    assert "FLOP/s" in res.stdout and "GB/s" in res.stdout


def test_bench_cpu_compares_with_numpy_float32_and_pool_sizes():
    """Issue 10, defect 8: the CPU bench also times a plain NumPy float32 matmul + softmax of the
    same work (not only the float64 oracle), and decode steps against pools of several sizes
    (defect 5)."""
    res = run_cli("bench", "--cpu", "--seqlen", "64", "--head-dim", "32", "--repeats", "1",
                  "--pool-pages", "64", "2048")
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert "NumPy float32 (matmul + softmax)" in out and "reference (NumPy float64)" in out
    assert "NumPy float32 (matmul + softmax, contiguous)" in out
    assert "x its time" in out and "max |ours - NumPy float32|" in out
    for dtype in ("bfloat16", "float32"):
        for pages in (64, 2048):
            assert f"decode PagedKVCache {dtype}, pool {pages} pages" in out
    assert "BLAS" in out  # says when NumPy is the faster choice


@pytest.mark.parametrize("argv, fragment", [
    (["--seqlen", "0"], "--seqlen: 0 is out of range"),
    (["--seqlen", "-5"], "--seqlen: -5 is out of range"),
    (["--seqlen", "abc"], "--seqlen: 'abc' is not an int"),
    (["--head-dim", "0"], "--head-dim: 0 is out of range: the head dim must be in 1..512"),
    (["--head-dim", "600"], "--head-dim: 600 is out of range"),
    (["--repeats", "0"], "--repeats: 0 is out of range: the number of timed runs must be >= 1"),
    (["--pool-pages", "0"], "--pool-pages: 0 is out of range"),
])
def test_bench_rejects_bad_arguments(capsys, argv, fragment):
    """Issue 10, defect 8: these gave a traceback or silently used the defaults."""
    assert cli.main(["bench", "--cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "usage:" in err and "Traceback" not in err


def test_numpy_attention_f32_matches_reference():
    from cupy_flashattn.reference import attention_ref

    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 5, 4, 16)).astype(np.float32)
    k = rng.standard_normal((2, 7, 2, 16)).astype(np.float32)
    v = rng.standard_normal((2, 7, 2, 16)).astype(np.float32)
    for causal in (False, True):
        got = cli.numpy_attention_f32(q, k, v, causal=causal)
        assert got.dtype == np.float32 and got.shape == q.shape
        np.testing.assert_allclose(got, attention_ref(q, k, v, causal=causal), atol=1e-5)


def test_progress_bar_without_tty():
    buf = io.StringIO()
    bar = cli.ProgressBar(4, stream=buf, width=8)
    for i in range(5):
        bar.update(i, f"step {i}")
    bar.close()
    lines = buf.getvalue().splitlines()
    assert lines[0] == "[--------] 0/4  step 0"
    assert lines[2] == "[####----] 2/4  step 2"
    assert lines[-1] == "[########] 4/4  step 4"


def test_feature_sets():
    known = ("transform", "paged")
    assert cli._parse_feature_sets(["none", "paged", "transform+paged", "paged+transform"],
                                   known) == [{}, {"paged": True}, {"transform": True, "paged": True}]
    with pytest.raises(ValueError, match="unknown feature causal"):
        cli._parse_feature_sets(["causal"], known)


def test_kernel_vocabulary_matches_cuda_backend():
    """The flags precompile offers are KernelKey's boolean fields."""
    dtypes, dims, feats = cli._kernel_vocabulary()
    assert "bf16" in dtypes and 128 in dims and "paged" in feats


def test_scan_kernel_cache(fake_cache, tmp_path):
    files, size, names = cli.scan_kernel_cache(fake_cache)
    assert files == 2 and size > 0 and names == [FAKE_KERNEL]
    assert cli.scan_kernel_cache(tmp_path / "missing") == (0, 0, [])
