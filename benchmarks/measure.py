"""What a user waits for, measured the same way for us and for the peers (issue 15, item 4).

Shared by ``bench.py`` (prefill) and ``bench_decode.py`` (decode); docs/performance.md, "The
four measurements", explains them.  Every helper times a zero-argument callable that makes one
call exactly as a user would (our public function, or torch SDPA), on the current stream:

* :func:`one_call` -- *one call, start to end*: a CUDA-event pair recorded around the Python
  call on an idle GPU, so the host work of the call (argument checks, planning, launches) and
  its kernels are both inside the window.  :func:`median_one_call` repeats it with a
  synchronisation between repetitions.
* :func:`back_to_back` -- *throughput*: wall time per call of ``n`` calls issued without any
  synchronisation in between, one at the end.  Host work of a call overlaps the kernels of the
  previous ones, so this is max(host time, GPU time) per call: what a loop of calls costs.
* :func:`cupy_graph` / :func:`torch_graph` -- capture one call in a CUDA graph; replaying the
  graph is then timed with :func:`one_call` (*graph-replayed time*: no Python work is left
  in it, only the graph launch and the kernels).

The fourth measurement, *kernel-only* time, is each script's own (it needs the launcher below
the public function, and each script hides host work its own way): see ``bench.py``'s
``time_interleaved`` and ``bench_decode.py``'s ``Timer.kernel``.

All events are recorded on CuPy's current stream, by default the legacy default stream, which
is also torch's default stream, so our calls and torch's are timed on one timeline.
"""

from __future__ import annotations

import time

import numpy as np


def gpu_slug(name: str = "") -> str:
    """The results-file stem of a GPU (``benchmarks/results/<gpu>.md``): "h200", "h100",
    "a100", ... for the cards this project benchmarks on, else the device name in lower case
    with non-alphanumerics as "_".  ``name``: the device name (default: the current device's)."""
    import re

    if not name:
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
        name = name.decode() if isinstance(name, bytes) else name
    for card in ("H200", "H100", "A100", "L40S", "L4", "B200"):
        if re.search(rf"\b{card}\b", name):
            return card.lower()
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "gpu"


_READ_ALL_SRC = r"""
extern "C" __global__ void fa_read_all(const uint4* __restrict__ a, long long n, unsigned* sink) {
  unsigned acc = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const uint4 v = __ldcg(a + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads alive; (almost) never taken
}
"""


class L2Flush:
    """Evicts a timed call's data from the (50-60 MB) L2 before it runs, on the current stream.

    ``mode="clean"`` (the default): a 1 GiB memset, then a read-only kernel over 256 MB, so the
    L2 holds clean lines of other data and the timed call reads its inputs from DRAM with
    nothing of the flush left to write back.  ``mode="memset"``: the memset alone (the method
    before stop 36), which leaves the L2 full of the memset's dirty lines: the timed call then
    also pays their write-back, ~50 MB of DRAM writes (an H100, stop 36: a bf16 decode step of
    B = 64, context 4096 took 374 us after a memset, 365 us after the clean flush; B = 1
    context 32768 75 vs 65 us)."""

    def __init__(self, mode: str = "clean"):
        import cupy

        if mode not in ("clean", "memset"):
            raise ValueError(f"flush mode must be 'clean' or 'memset', got {mode!r}")
        self.mode = mode
        self.buf = cupy.empty(1 << 30, dtype=np.uint8)
        if mode == "clean":
            self.clean_buf = cupy.ones(256 << 20, dtype=np.uint8)
            self.sink = cupy.zeros(1, dtype=np.uint32)
            self.read = cupy.RawKernel(_READ_ALL_SRC, "fa_read_all")

    def __call__(self) -> None:
        import cupy

        stream = cupy.cuda.get_current_stream().ptr
        cupy.cuda.runtime.memsetAsync(self.buf.data.ptr, 0, self.buf.nbytes, stream)
        if self.mode == "clean":
            n = self.clean_buf.nbytes // 16
            self.read((1024,), (256,), (self.clean_buf, np.int64(n), self.sink))


def synchronize() -> None:
    """Wait for all work on the device (ours and torch's, whatever stream it used)."""
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


def one_call(fn, before=None) -> float:
    """Seconds from the start to the end of one call of ``fn``, host work included.

    ``before`` (for example an L2 flush) runs first and is waited for, so the GPU is idle when
    the start event is recorded: the start event then marks the moment the host begins the
    call, and the end event the moment its last kernel is done."""
    import cupy

    if before is not None:
        before()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()  # created outside the timed window
    synchronize()
    start.record()
    result = fn()
    end.record()
    end.synchronize()
    del result  # freeing the output is not part of the call a user makes
    return cupy.cuda.get_elapsed_time(start, end) * 1e-3


def median_one_call(fn, reps: int, before=None) -> float:
    """Median of ``reps`` :func:`one_call` timings (a synchronisation between repetitions)."""
    return float(np.median([one_call(fn, before) for _ in range(reps)]))


def back_to_back(fn, n: int) -> float:
    """Wall seconds per call of ``n`` calls with a single device synchronisation at the end.

    No L2 flush between calls (it would put a kernel between them): inputs that fit in the
    60 MB L2 are read from it here, unlike in :func:`one_call` rows that flush."""
    synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    synchronize()
    return (time.perf_counter() - t0) / n


def calls_for(seconds_estimate: float, budget: float = 0.03, lo: int = 10, hi: int = 300) -> int:
    """How many back-to-back calls to time: about ``budget`` seconds' worth, at least ``lo``
    (so the final synchronisation is amortised) and at most ``hi`` (issue 15 measured 300)."""
    return int(min(hi, max(lo, budget / max(seconds_estimate, 1e-7))))


def cupy_graph(fn):
    """Capture one call of ``fn`` with CuPy's stream capture; returns ``(replay, output)``.

    ``replay()`` launches the graph on the current stream (the one the other timings use);
    ``output`` is the array the captured call returned, which every replay rewrites.  The call
    runs once on the capture stream first: it warms our per-signature call cache and that
    stream's memory pool, so the capture itself allocates nothing new.  Raises (with the
    call's own error) where the call cannot be captured, e.g. if it synchronises.

    Memory the captured call freed (a split-KV workspace) goes back to the capture stream's
    pool; nothing else runs on that stream afterwards, so no later allocation can reuse it
    while replays still write to it."""
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)  # capture needs a stream other than legacy
    with stream:
        fn()
        stream.synchronize()
        stream.begin_capture()
        try:
            output = fn()
        except Exception:
            try:
                stream.end_capture()
            except Exception:  # the capture is already invalid: report the call's own error
                pass
            raise
        graph = stream.end_capture()

    def replay():
        graph.launch(cupy.cuda.get_current_stream())

    replay.keep_alive = (graph, stream, output)  # the graph's buffers live as long as replay
    return replay, output


def torch_graph(fn):
    """Capture one call of ``fn`` (torch work) in a ``torch.cuda.CUDAGraph``, torch's recipe:
    warm up on a side stream, then capture; returns ``(replay, output)``.  ``replay()``
    replays on torch's current stream (the legacy default stream, as for every other timing).
    Raises where torch cannot capture the call."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = fn()

    def replay():
        graph.replay()

    replay.keep_alive = (graph, output)
    return replay, output
