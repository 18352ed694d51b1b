"""The command line: ``python -m cupy_flashattn <command>``.

Commands::

    info        versions (CuPy, CUDA runtime, driver, NVRTC), the GPU, the kernel cache directory
                (CUPY_CACHE_DIR or ~/.cupy/kernel_cache) and which of our kernels it holds; without
                a GPU it says so and that NumPy arrays run on the CPU backend (Numba)
    precompile  compile chosen CUDA kernels ahead of first use (needs a GPU), with a progress bar
    bench       a quick side-by-side timing: ours vs the NumPy reference (CPU) or torch SDPA (GPU)
    check       a short self-test against the float64 reference on the backend present:
                dense, varlen, paged, kvcache...; prints PASS/FAIL per case

Exit status: 0 success, 1 failure (a check failed, a kernel did not compile, no GPU for
``precompile``), 2 usage error.

The same functions are callable from Python, e.g. in a notebook after some attention calls
``cupy_flashattn.cli.main(["info"])`` also lists the kernels compiled in *that* process.
"""

from __future__ import annotations

import argparse
import sys

from ._common import (  # noqa: F401
    _FALLBACK_FEATURES,
    _FALLBACK_HEAD_DIMS,
    _FALLBACK_KERNEL_DTYPES,
    DTYPE_CHOICES,
    _err,
    kernel_cache_dir,
    scan_kernel_cache,
)
from .bench import (
    POOL_PAGES,
    cmd_bench,
    numpy_attention_f32,  # noqa: F401  (re-exported)
)
from .check import CHECKS, CheckResult, cmd_check, run_checks  # noqa: F401
from .info import cmd_info
from .precompile import ProgressBar, _kernel_vocabulary, _parse_feature_sets, cmd_precompile  # noqa: F401

__all__ = ["CheckResult", "build_parser", "kernel_cache_dir", "main", "run_checks"]


# -- argument parsing -------------------------------------------------------------------------


_DTYPE_HELP = "default: bfloat16 on GPU, float32 on CPU"


def _int_in(low: int, high: int | None, what: str):
    """An argparse ``type=`` for an int in [low, high] (high None: no upper bound), so that a
    bad value is a usage error (exit 2, the valid range in the message), never a traceback or a
    silently substituted default."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an int ({what})") from None
        if value < low or (high is not None and value > high):
            allowed = f">= {low}" if high is None else f"in {low}..{high}"
            raise argparse.ArgumentTypeError(f"{value} is out of range: {what} must be {allowed}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cupy_flashattn",
        description="cupy_flashattn: environment info, kernel precompilation, a quick "
                    "benchmark and a self-test.",
        epilog="Exit status: 0 success, 1 failure, 2 usage error.",
    )
    sub = p.add_subparsers(dest="command", metavar="command")

    s = sub.add_parser("info", help="versions, GPU, kernel cache and compiled kernels")
    s.add_argument("-v", "--verbose", action="store_true", help="list every kernel name")
    s.set_defaults(func=cmd_info)

    # The kernel vocabulary is not imported here (that would load the CUDA backend for every
    # command); cmd_precompile checks the values.
    s = sub.add_parser(
        "precompile", help="compile CUDA kernels ahead of first use (needs a GPU)",
        description="Compile kernels for the current GPU into CuPy's cache (CUPY_CACHE_DIR). "
                    "Feature flags are the boolean fields of cupy_flashattn._cuda.KernelKey "
                    f"(currently {', '.join(_FALLBACK_FEATURES)}: 'transform' serves softcap "
                    "and ALiBi, 'paged' a block table; causal and sliding windows are run-time "
                    "arguments of every kernel).",
    )
    s.add_argument("--dtype", nargs="+", metavar="DTYPE",
                   help=f"kernel dtypes (default: all: {' '.join(_FALLBACK_KERNEL_DTYPES)}; "
                        "float16/bfloat16 are accepted too)")
    s.add_argument("--head-dim", nargs="+", type=int, metavar="D",
                   help=f"head dims, mapped to their bucket (default: all buckets "
                        f"{' '.join(map(str, _FALLBACK_HEAD_DIMS))})")
    s.add_argument("--features", nargs="+", metavar="SET",
                   help="feature sets, each 'none' or flags joined by '+', e.g. "
                        "none paged transform+paged (default: none paged)")
    s.add_argument("--all", action="store_true", help="every shipped instantiation")
    s.set_defaults(func=cmd_precompile)

    s = sub.add_parser("bench",
                       help="quick timing: ours vs the reference (CPU) or torch SDPA (GPU)")
    s.add_argument("--cpu", action="store_true", help="use the CPU backend even with a GPU")
    s.add_argument("--dtype", choices=DTYPE_CHOICES, help=_DTYPE_HELP)
    s.add_argument("--seqlen", type=_int_in(1, 1 << 20, "the sequence length"), metavar="S",
                   help="prefill sequence length, >= 1 (default: 2048 on GPU, 512 on CPU)")
    s.add_argument("--head-dim", type=_int_in(1, 512, "the head dim"), metavar="D",
                   help="head dim, 1..512 (default: 128 on GPU, 64 on CPU)")
    s.add_argument("--repeats", type=_int_in(1, None, "the number of timed runs"), default=5,
                   metavar="N", help="timed runs per provider, >= 1 (default 5)")
    s.add_argument("--pool-pages", type=_int_in(1, 1 << 24, "a pool size in pages"), nargs="+",
                   default=list(POOL_PAGES), metavar="N",
                   help="CPU only: pool sizes of the PagedKVCache decode rows, whose time must "
                        "not depend on the pool (default: 64 1024 16384)")
    s.set_defaults(func=cmd_bench)

    s = sub.add_parser("check", help="self-test against the float64 reference; PASS/FAIL per case")
    s.add_argument("--cpu", action="store_true", help="use the CPU backend even with a GPU")
    s.add_argument("--dtype", choices=DTYPE_CHOICES, help=_DTYPE_HELP)
    s.add_argument("--cases", nargs="+", choices=list(CHECKS), metavar="CASE",
                   help=f"cases to run (default: all: {' '.join(CHECKS)})")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=cmd_check)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a usage error (argparse printed it) or --help
        return int(e.code) if isinstance(e.code, int) else 2
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except SystemExit as e:  # usage errors raised inside a command
        return int(e.code) if isinstance(e.code, int) else 2
    except KeyboardInterrupt:
        _err("interrupted")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
