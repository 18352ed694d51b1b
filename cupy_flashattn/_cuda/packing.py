"""Kernel arguments packed into one struct, so a launch costs one argument conversion.

A CuPy ``RawKernel`` call converts every argument on every launch; the forward kernels take ~40
scalars and pointers, and that conversion was a large part of the ~250 µs a call spent on the
host.  Instead each entry point takes ONE struct by value (``<name>_args``), generated here
from a field list, and the host fills a NumPy structured array of the same layout
(``numpy.dtype(..., align=True)``).  The layout leaves nothing to the compiler: the C struct
is generated with an explicit ``char _padN[n]`` wherever natural alignment would insert padding,
so every field sits at the offset NumPy computed, and the generated source asserts the size at
compile time (``static_assert(sizeof(...) == ...)``; NVRTC has no ``offsetof``), so a drift
fails in NVRTC -- on the CPU, in CI -- rather than as wrong values on the GPU.

A launch plan keeps a filled template (all scalars) and the byte offsets of its pointer fields;
a call writes the pointers of its own arrays into its copy of the template
(:meth:`ArgPack.write_pointers`, from ``launcher.Launch``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["ArgPack"]

_NUMPY_OF_C = {"long long": np.int64, "int": np.int32, "float": np.float32, "double": np.float64}


def _numpy_type(ctype: str):
    if ctype.endswith("*"):
        return np.uint64
    return _NUMPY_OF_C[ctype]


class ArgPack:
    """The struct ``<name>_args`` with ``fields`` ((C type, name) pairs, in order)."""

    def __init__(self, struct_name: str, fields):
        self.struct_name = struct_name
        self.fields = tuple(fields)
        self.names = tuple(n for _, n in self.fields)
        self.dtype = np.dtype([(n, _numpy_type(c)) for c, n in self.fields], align=True)
        assert self.dtype.itemsize % 8 == 0  # pointers make the struct 8-byte aligned
        #: field name -> index of its 8-byte word, for pointer fields
        self.pointer_words = {n: self.dtype.fields[n][1] // 8 for c, n in self.fields if c.endswith("*")}
        #: what a packed argument is launched as (see :meth:`new`)
        self.void = np.dtype((np.void, self.dtype.itemsize))

    def c_struct(self) -> str:
        """The C definition (explicit padding, see the module docstring) and a size check."""
        lines, end = [], 0
        for c, n in self.fields:
            off = self.dtype.fields[n][1]
            if off > end:
                lines.append(f"  char _pad{end}[{off - end}];")
            lines.append(f"  {c} {n};")
            end = off + self.dtype.fields[n][0].itemsize
        if self.dtype.itemsize > end:
            lines.append(f"  char _pad{end}[{self.dtype.itemsize - end}];")
        body = "\n".join(lines)
        return (f"struct {self.struct_name} {{\n{body}\n}};\n"
                f"static_assert(sizeof({self.struct_name}) == {self.dtype.itemsize}, "
                f"\"{self.struct_name}: size differs from the host's numpy layout\");\n")

    def assign(self, target: str, source: str = "a", names=None) -> str:
        """C statements copying the fields ``names`` (default: all) from ``source`` to ``target``."""
        return "\n".join(f"  {target}.{n} = {source}.{n};" for n in (names or self.names))

    def new(self, values: dict) -> np.ndarray:
        """A launchable (1,)-array of the struct with ``values`` (field name -> number or array;
        arrays and None become pointers).  CuPy passes a one-element NumPy array by value (its
        bytes, through ``__array_interface__``).

        The result has an unstructured ``void`` dtype of the struct's size, not the structured
        dtype used to fill it: CuPy reads ``__array_interface__`` at every launch, and for a
        structured dtype NumPy rebuilds the field description each time (35 µs for the 34-field
        decode struct, measured; 2 µs for a void dtype) -- that alone was a fifth of a call."""
        buf = np.zeros(1, dtype=self.dtype)
        for name, value in values.items():
            if name in self.pointer_words:
                buf[name] = pointer_of(value)
            else:
                buf[name] = value
        return buf.view(np.uint64).copy().view(self.void)

    def write_pointers(self, words: np.ndarray, pointers: dict) -> None:
        """Write the pointer fields in ``pointers`` (name -> CuPy array or None) into ``words``,
        a packed struct viewed as uint64 words (``packed.view(np.uint64)``).  The one place a
        rebind happens: a replayed launch (``launcher.Launch``) calls it on its buffer."""
        pw = self.pointer_words
        for name, value in pointers.items():
            words[pw[name]] = 0 if value is None else value.data.ptr

    def entry_point(self, name: str, cxx_struct: str, fn: str, threads: int) -> str:
        """A kernel ``name`` taking this struct, copying it into ``fa::<cxx_struct>`` and calling
        ``fa::<fn>`` on it (the one-function kernels: combine, rope / append, the float32
        pre-pass)."""
        return f"""
extern "C" __global__ void __launch_bounds__({threads}) {name}(const {self.struct_name} a) {{
  fa::{cxx_struct} c;
{self.assign("c")}
  fa::{fn}(c);
}}
"""

    def read(self, packed: np.ndarray) -> np.void:
        """The fields of a packed (1,)-array, by name (tests and debugging)."""
        return packed.view(self.dtype)[0]


def pointer_of(a) -> int:
    """Device address of a CuPy array (0 for None)."""
    if a is None:
        return 0
    return int(a.data.ptr)
