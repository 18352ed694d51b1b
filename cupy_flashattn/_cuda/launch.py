"""Launching the forward kernel for one :class:`~cupy_flashattn.problem.AttentionProblem`.

Everything here is host-side bookkeeping with no device synchronisation: no ``.get()``, no
``int(cupy_array)``; the grid comes from the host integer ``max_seqlen_q`` and every per-sequence
quantity is resolved on the device (``cuda_src/attn/block_info.cuh``).

Adaptations made before the launch (each costs a copy, and only when needed):
  * head dims that are not a multiple of 8 (e.g. 59): q/k/v are zero-padded to the next
    multiple of 8 and the output sliced back -- zero columns change neither Q K^T nor the
    kept part of P V.  Paged caches are padded whole, so prefer D % 8 == 0 for large caches;
  * float32 inputs run at float32 accuracy by default: on a compute capability 9.0 GPU, dense
    and varlen problems with D <= 128 on the sm90 kernel over float16 hi / lo planes
    (``f32_planes.py``; it computes the planes first), the rest on the sm80 float32 kernel
    (3xTF32); float64 runs on the float64 one (``sm80/flash_fwd_precise.cu``, both mma.sync, on
    every GPU); only with
    ``set_float32_precision("medium")`` is float32 cast to bfloat16 (not float16: bf16 has
    float32's exponent range), computed with fp32 accumulation and cast back;
  * q / out / k / v whose row or head strides are not multiples of 8 elements (16 bytes, as
    cp.async and the vector stores need), or k and v with different strides, are copied to
    contiguous arrays (out: written to a temporary, then copied back).
"""

from __future__ import annotations

import numpy as np

from ..problem import AttentionProblem
from .args import Operands, compute_dtype, problem_pointers
from .args import aligned as _aligned
from .compile import (FWD_ARGS, PRECISE_ARGS, SM90_ARGS, SM90_F32_ARGS, SM90_F32_HEAD_DIM_BUCKETS,
                      SM90_HEAD_DIM_BUCKETS, SM90_UNSHIPPED, KernelKey, bucket_for, get_kernel,
                      is_precise, kernel_dtype_tag, key_traits)
from .launcher import Launch, TmaLaunch, launch_packed
from .per_stream import PerStream
from .schedule import dynamic_schedule, launch_grid, new_tile_counter, prefill_grid
from .tma import fwd_geometries

__all__ = ["run_attention", "is_available", "select_kernel", "prefill_arch", "force_prefill_arch",
           "PREFILL_ARCH_ENV"]

#: Environment variable forcing the prefill kernel family: "sm80" (mma.sync, any GPU >= 8.0),
#: "sm90" (wgmma; compute capability 9.0 only) or "auto" (default: sm90 on 9.0, else sm80).
PREFILL_ARCH_ENV = "CUPY_FLASHATTN_PREFILL_ARCH"
_FORCED = {"arch": None}  # force_prefill_arch(); None: the environment variable / auto
_DEVICE_CC: dict = {}  # device id -> compute capability (an int such as 90)


def force_prefill_arch(arch) -> None:
    """Force the prefill family from now on ("sm80", "sm90"; None or "auto": back to
    ``$CUPY_FLASHATTN_PREFILL_ARCH`` / auto), e.g. to compare the two paths in one process.
    Cheap (a benchmark may switch per call): the forced family is part of the call cache's key,
    so the plans of either path stay cached."""
    from .._signature import PLAN_VARIANT

    if arch not in (None, "auto", "sm80", "sm90"):
        raise ValueError(f"force_prefill_arch: arch must be 'sm80', 'sm90', 'auto' or None, got {arch!r}")
    _FORCED["arch"] = PLAN_VARIANT[0] = None if arch == "auto" else arch


def _device_cc() -> int:
    """The current device's compute capability; 0 without a usable GPU (plans described on a
    CPU machine pick sm80)."""
    try:
        import cupy

        dev = cupy.cuda.runtime.getDevice()
    except Exception:
        return 0
    cc = _DEVICE_CC.get(dev)
    if cc is None:
        cc = _DEVICE_CC[dev] = int(cupy.cuda.Device(dev).compute_capability)
    return cc


def prefill_arch(head_dim: int, transform: bool, paged: bool, device_cc=None) -> str:
    """The prefill kernel family for a problem: forced (force_prefill_arch, then the environment
    variable), else sm90 on a compute capability 9.0 device and sm80 elsewhere.  sm_90a code
    runs only on 9.0, so a forced sm90 on another device is an error, not a silent fallback;
    the instantiations sm90 does not ship (compile.SM90_UNSHIPPED) and head dims above its
    largest bucket (256) run on sm80."""
    import os

    forced = _FORCED["arch"] or os.environ.get(PREFILL_ARCH_ENV, "auto") or "auto"
    if forced not in ("auto", "sm80", "sm90"):
        raise ValueError(f"{PREFILL_ARCH_ENV}={forced!r}: expected 'sm80', 'sm90' or 'auto'")
    if forced == "sm80":
        return "sm80"
    cc = _device_cc() if device_cc is None else int(device_cc)
    if forced == "sm90" and cc != 90:
        raise ValueError(f"{PREFILL_ARCH_ENV}=sm90: the sm_90a kernels need a compute capability "
                         f"9.0 GPU, this one is {cc // 10}.{cc % 10}. Fix: unset it (auto) or use sm80.")
    if cc != 90 or head_dim > SM90_HEAD_DIM_BUCKETS[-1]:
        return "sm80"  # head dims 257..512: the sm80 family's V-split kernels (kernel_traits.cuh)
    bucket = bucket_for(head_dim, SM90_HEAD_DIM_BUCKETS)
    return "sm80" if (bucket, transform, paged) in SM90_UNSHIPPED else "sm90"


def is_available() -> bool:
    """True when CuPy imports, a CUDA device is visible and it is sm_80 or newer."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False
        return int(cupy.cuda.Device().compute_capability) >= 80
    except Exception:
        return False


_FAMILY_WORDS = {"sm80": "sm80 (mma.sync, any GPU of compute capability >= 8.0)",
                 "sm90": "sm90 (wgmma + TMA, warp-specialized; sm_90a, compute capability 9.0)"}


def describe_prefill_path(device_cc=None) -> str:
    """One line for ``python -m cupy_flashattn info``: which prefill family calls take on a GPU
    of compute capability ``device_cc`` (default: the current device) and why."""
    import os

    cc = _device_cc() if device_cc is None else int(device_cc)
    forced = _FORCED["arch"] or os.environ.get(PREFILL_ARCH_ENV, "auto") or "auto"
    how = ("forced by force_prefill_arch()" if _FORCED["arch"] else
           f"forced by {PREFILL_ARCH_ENV}={forced}" if forced != "auto" else
           f"auto for compute capability {cc // 10}.{cc % 10}; {PREFILL_ARCH_ENV}=sm80|sm90 forces one")
    try:
        family = prefill_arch(128, False, False, device_cc=cc)
    except ValueError as e:
        return f"none: {e}"
    from ..precision import get_float32_precision

    mode = get_float32_precision()
    f32 = {"highest": ("float32 accuracy: float16 hi / lo planes on sm90 for dense / varlen D <= "
                       "128, else 3xTF32 on sm80") if family == "sm90" else "3xTF32, float32 accuracy",
           "high": ("the float16 planes where they serve, else TF32 on sm80" if family == "sm90"
                    else "TF32"),
           "medium": "bfloat16 operands on the 16-bit kernels"}[mode]
    decode = ("sm80 split-KV; MQA steps (one query token, >= 16 heads): the sm90 split-KV kernel "
              "with swapped rows" if family == "sm90" else "sm80 split-KV")
    return (f"{_FAMILY_WORDS[family]} ({how}); decode: {decode}; float32: {mode!r} ({f32}; "
            "set_float32_precision), float64: DMMA on the sm80 float64 kernel")


def needs_transform(p: AttentionProblem) -> bool:
    """Whether the problem needs a kernel with the logit transform (KernelKey.transform): ALiBi,
    softcap, or a scale <= 0 / not finite, which cannot be folded into exp2 after the row max
    (it would flip the ordering) -- the transform path scales first; with no slopes it adds a
    zero bias."""
    scale_ok = p.softmax_scale > 0 and np.isfinite(p.softmax_scale)
    return p.alibi_slopes is not None or p.softcap > 0 or not scale_ok


def select_kernel(problem: AttentionProblem, arch=None, device_cc=None) -> KernelKey:
    """The instantiation that serves this problem (``arch``: the family, default
    :func:`prefill_arch`; ``device_cc`` stands in for the current device's)."""
    p = problem
    transform = needs_transform(p)
    dtype = kernel_dtype_tag(p.q.dtype)
    if is_precise(dtype):
        if sm90_f32_serves(p, transform, device_cc):
            arch, dtype = "sm90", "f32"  # "high" too: faster there than TF32 on mma.sync
        else:
            arch = "sm80"
    elif arch is None:
        arch = prefill_arch(p.head_dim, transform, p.paged, device_cc)
    from .compile import SM90_WIDE_BUCKETS, SM90_WIDE_MIN_KEYS, head_dim_buckets

    bucket = bucket_for(p.head_dim, head_dim_buckets(arch, dtype))
    # No causal / local window and long keys: the wider key tile (FlashAttention-3's choice;
    # with a window the narrower tile wastes fewer masked keys on the band, kernel_traits.cuh).
    wide = (arch == "sm90" and bucket in SM90_WIDE_BUCKETS and not transform and not p.paged
            and p.window_left < 0 and p.window_right < 0 and p.max_seqlen_k >= SM90_WIDE_MIN_KEYS)
    return KernelKey(dtype=dtype, head_dim=bucket, transform=transform, paged=p.paged, arch=arch,
                     wide=wide)


def sm90_f32_serves(problem: AttentionProblem, transform: bool, device_cc=None) -> bool:
    """Whether a float32 problem runs on the Hopper float32 kernel (float16 planes,
    f32_planes.py): where the prefill family is sm90, for dense / varlen K/V of D <= 128, at
    precision "highest" and also "high" (measured on an H100, D = 128 S = 4k: 187 TFLOP/s at
    float32 accuracy against 73 for one TF32 product on mma.sync -- the planes kernel is both
    the faster and the more accurate one there; benchmarks/NOTES.md, issue 14).  Not
    for paged K/V, nor with seqused_k / leftpad_k / cache_batch_idx (a KV cache): the planes'
    per-head scale comes from every row of K and V, and a cache's rows past its lengths hold
    whatever was there before -- a huge stale value there would cost the live keys bits."""
    p = problem
    if (kernel_dtype_tag(p.q.dtype) not in ("f32", "tf32") or p.paged
            or p.head_dim > SM90_F32_HEAD_DIM_BUCKETS[-1]):
        return False
    if p.seqused_k is not None or p.leftpad_k is not None or p.cache_batch_idx is not None:
        return False
    return prefill_arch(p.head_dim, transform, False, device_cc) == "sm90"


def needs_temporaries(problem: AttentionProblem) -> bool:
    """True when the launch writes into a temporary (padded head dim, an output of another dtype
    than the kernel's -- float32 on bf16 kernels --, misaligned out, strided LSE) that is copied
    back whole -- which would overwrite rows another kernel wrote, so a mixed batch then runs
    on one kernel."""
    p = problem
    out, lse = p.out, p.softmax_lse
    return (
        p.head_dim % 8 != 0
        or np.dtype(out.dtype) != compute_dtype(kernel_dtype_tag(p.q.dtype))
        or not _aligned(out)
        or lse.ndim != 2
        or lse.strides[-1] != lse.itemsize
    )


class PrefillPlan:
    """Host-side decisions of one prefill launch (kernel, grid, packed arguments), made once
    per problem shape; :meth:`run` rebinds the pointers of the problem's arrays and launches
    (no host sync, CUDA-graph safe).  When the launch needs adapted operands
    (:attr:`Operands.direct` is False) every run rebuilds them and copies the result back."""

    def __init__(self, problem: AttentionProblem, len_q_min: int = 0):
        p = problem
        key = select_kernel(p)
        tr = key_traits(key)
        self.compute_dtype = compute_dtype(key.dtype)
        self.len_q_min = len_q_min
        tiles = prefill_grid(p, tr)
        self.tiles_m = tiles[0]
        self.empty = not (tiles[0] > 0 and tiles[2] > 0 and p.total_q > 0)
        self.grid = tiles if self.empty else launch_grid(p, tr, key.arch)
        # sm90 CTAs claiming tiles from a counter (schedule.dynamic_schedule): one zeroed
        # counter per CUDA stream, kept by the plan (the kernel leaves it zeroed for the next
        # launch, see sm90/tile_scheduler.cuh); calls on one stream run in order, another
        # stream gets its own.
        self.dynamic = not self.empty and dynamic_schedule(p, tr, key.arch, self.grid)
        self._counter = PerStream(new_tile_counter) if self.dynamic else None
        self.block = (tr.num_threads,)
        self.smem = tr.smem_bytes
        self.kernel = None if self.empty else get_kernel(key)
        # sm90: the struct also carries TMA maps of q, k, v (paged k / v: only for page sizes
        # the kernel loads by TMA, tma.paged_tma_ok).
        self.tma = key.arch == "sm90"
        # The float32 / float64 kernels also take the scale and softcap in float64.
        self.args = PRECISE_ARGS if is_precise(key.dtype) else FWD_ARGS
        self.tile = (tr.block_m, tr.block_n, key.paged)
        ops = Operands(p, self.compute_dtype)
        self.direct = ops.direct
        self.launch = None
        # Float32 on sm90: the planes' pre-pass, then the kernel on the planes (_run_planes).
        self.planes = None
        if key.arch == "sm90" and key.dtype == "f32":
            self.direct = False
            self.args = SM90_F32_ARGS
            if not self.empty:
                from .f32_planes import F32Planes, plane_values

                self.planes = F32Planes(ops.q, ops.k, ops.v)
                values, map_values = plane_values(self._values(ops, p), self.planes.workspace())
                self.launch = TmaLaunch(self.kernel, self.grid, self.block, self.smem,
                                        SM90_F32_ARGS, SM90_F32_ARGS.new(values),
                                        self._geometries(map_values))
            return
        if self.direct and not self.empty:
            values = self._values(ops, p)
            if self.tma:
                self.launch = TmaLaunch(self.kernel, self.grid, self.block, self.smem, SM90_ARGS,
                                        SM90_ARGS.new(values), self._geometries(values))
            else:
                self.launch = Launch(self.kernel, self.grid, self.block, self.smem, self.args,
                                     self.args.new(values))

    def _tile_counter(self):
        """The dynamic schedule's counter of the current stream (None: static rounds)."""
        return self._counter.get() if self._counter is not None else None

    def _values(self, ops, p):
        values = ops.fwd_values(len_q_min=self.len_q_min, tiles_m=self.tiles_m)
        if self.tma:
            values["tile_counter"] = self._tile_counter()
        if self.args is PRECISE_ARGS:
            values.update(softmax_scale_f64=float(p.softmax_scale),
                          softcap_f64=float(p.softcap) if p.softcap > 0 else 0.0)
        return values

    def _geometries(self, values):
        block_m, block_n, paged = self.tile
        return fwd_geometries(values, block_m, block_n, paged)

    def _run_planes(self, p: AttentionProblem) -> None:
        """Float32 on sm90: planes of this call's operands, then the kernel on them."""
        ops = Operands(p, self.compute_dtype)
        if not self.empty:
            ws = self.planes.run(ops.q, ops.k, ops.v)
            pointers = problem_pointers(p)
            pointers.update(q=ws.q_planes, k=ws.k_planes, v=ws.v_planes, o=ops.o, lse=ops.lse,
                            q_rscale=ws.q_rscale, kv_rscale=ws.kv_rscale)
            if self.dynamic:
                pointers["tile_counter"] = self._tile_counter()
            self.launch(pointers)
        ops.finish()

    def run(self, p: AttentionProblem) -> None:
        if self.planes is not None:
            self._run_planes(p)
            return
        if self.direct:
            if self.launch is not None:
                pointers = problem_pointers(p)
                if self.dynamic:
                    pointers["tile_counter"] = self._tile_counter()
                self.launch(pointers)
            return
        ops = Operands(p, self.compute_dtype)
        if not self.empty:
            values = self._values(ops, p)
            if self.tma:
                args = SM90_ARGS.new(values)
                geometries = self._geometries(values)
                if geometries is not None:
                    SM90_ARGS.write_maps(args.view(np.uint64), geometries,
                                         [values[n].data.ptr for n in ("q", "k", "v")])
            else:
                args = self.args.new(values)
            launch_packed(self.kernel, self.grid, self.block, args, self.smem)
        ops.finish()


def run_attention(problem: AttentionProblem, len_q_min: int = 0) -> None:
    """Fill ``problem.out`` and ``problem.softmax_lse`` on the current CuPy stream.  With
    ``len_q_min``, only sequences of at least that many queries are served (mixed batch)."""
    PrefillPlan(problem, len_q_min).run(problem)
