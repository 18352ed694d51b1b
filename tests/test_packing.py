"""ArgPack (``_cuda/packing.py``): the struct a kernel takes by value, filled on the host.

The bytes a launch passes must put every field at the offset the generated C struct has, and a
rebind must change only the pointer words.  CPU-only: no device pointers are dereferenced."""

import types

import numpy as np


from cupy_flashattn._cuda.compile import FWD_ARGS
from cupy_flashattn._cuda.decode import COMBINE_ARGS, DECODE_ARGS, ROPE_ARGS
from cupy_flashattn._cuda.packing import ArgPack

FIELDS = [("const void*", "q"), ("int", "n"), ("float", "scale"), ("long long", "big"),
          ("int", "flag"), ("void*", "out")]


def _fake(ptr):
    """Stands in for a CuPy array: only ``.data.ptr`` is read."""
    return types.SimpleNamespace(data=types.SimpleNamespace(ptr=ptr))


def test_struct_layout_matches_numpy_offsets():
    pack = ArgPack("demo_args", FIELDS)
    src = pack.c_struct()
    # int n at 8, float scale at 12, long long at 16, int flag at 24, pad 4, pointer at 32.
    assert pack.dtype.itemsize == 40
    assert "char _pad28[4];" in src
    assert "static_assert(sizeof(demo_args) == 40" in src


def test_new_is_a_void_scalar_array_with_the_values():
    pack = ArgPack("demo_args", FIELDS)
    packed = pack.new({"q": _fake(0x1000), "n": -7, "scale": 0.125, "big": 2**40 + 3, "flag": 1,
                       "out": None})
    assert packed.shape == (1,) and packed.dtype == pack.void and packed.dtype.fields is None
    got = pack.read(packed)
    assert (int(got["q"]), int(got["n"]), float(got["scale"]), int(got["big"]), int(got["flag"]),
            int(got["out"])) == (0x1000, -7, 0.125, 2**40 + 3, 1, 0)


def _bind(pack, template, pointers):
    """What a Launch does on its own copy of the template."""
    bound = template.copy()
    pack.write_pointers(bound.view(np.uint64), pointers)
    return bound


def test_rebinding_replaces_only_pointer_words_and_copies():
    pack = ArgPack("demo_args", FIELDS)
    template = pack.new({"q": None, "n": 5, "scale": 2.0, "big": -1, "flag": 0, "out": None})
    before = template.tobytes()
    bound = _bind(pack, template, {"q": _fake(0xABC0), "out": _fake(2**47 + 16)})
    assert template.tobytes() == before  # the template is never written
    got = pack.read(bound)
    assert (int(got["q"]), int(got["out"])) == (0xABC0, 2**47 + 16)
    assert (int(got["n"]), float(got["scale"]), int(got["big"])) == (5, 2.0, -1)
    again = _bind(pack, template, {"q": None})
    assert int(pack.read(again)["q"]) == 0


def test_shipped_packs_are_launchable_sizes():
    for pack in (FWD_ARGS, DECODE_ARGS, COMBINE_ARGS, ROPE_ARGS):
        assert pack.dtype.itemsize % 8 == 0
        assert pack.void.itemsize == pack.dtype.itemsize
        for name, word in pack.pointer_words.items():
            assert pack.dtype.fields[name][1] == 8 * word
