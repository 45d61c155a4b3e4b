"""custom_kernels.recipe.step_of: how a launch's argument block is recorded for the C++ replay (packing
only: the replay itself runs in tests/gpu/test_recipes_gpu.py)."""
from __future__ import annotations

import ctypes
import struct
from types import SimpleNamespace

import pytest

from custom_kernels.launch import I32, KernelArgs, LaunchConfig, Ptr, TensorMap
from custom_kernels.recipe import BIAS, OUT, WORKSPACE, X, MapOf, Source, step_of


class _Args(KernelArgs):
    _fields_ = [("x", Ptr), ("M", I32), ("w", Ptr), ("ws", Ptr), ("bias", Ptr), ("map_a", TensorMap), ("act", I32)]


def _launch(**fixed):
    """What step_of reads of a Launch: its argument block and its shape (no GPU involved)."""
    config = LaunchConfig.of((3, 2), 128, 4096, pdl=True)
    shape = SimpleNamespace(function=0xABC0, grid=config.grid, block=config.block, smem=config.smem,
                            cluster=config.cluster, pdl=config.pdl)
    return SimpleNamespace(args=_Args(**fixed), shape=shape)


def test_pointers_known_per_call_become_patches_and_the_rest_is_packed():
    launch = _launch(w=0x7F0000001000)
    step = step_of(launch, x=X, M=5, ws=WORKSPACE + 256, bias=BIAS, act=2, map_a=MapOf(WORKSPACE, 5, 512, 64, 128))
    offsets = {name: getattr(_Args, name).offset for name, _ in _Args._fields_}
    assert step.offsets == [offsets[name] for name, _ in _Args._fields_]
    assert sorted(step.patches) == sorted([(offsets["x"], int(Source.X), 0), (offsets["ws"], int(Source.WORKSPACE), 256),
                                           (offsets["bias"], int(Source.BIAS), 0)])
    assert step.maps == [(offsets["map_a"], int(Source.WORKSPACE), 0, 5, 512, 64, 128)]
    assert len(step.params) == ctypes.sizeof(_Args)
    word = lambda name: struct.unpack_from("<Q", step.params, offsets[name])[0]
    assert word("w") == 0x7F0000001000  # fixed fields are kept
    assert word("x") == 0 and word("ws") == 0 and word("bias") == 0  # patched per call
    assert struct.unpack_from("<i", step.params, offsets["M"])[0] == 5
    assert struct.unpack_from("<i", step.params, offsets["act"])[0] == 2
    assert (step.function, step.grid, step.block, step.smem, step.pdl) == (0xABC0, (3, 2, 1), (128, 1, 1), 4096, True)
    assert launch.args.M == 0 and launch.args.x == 0  # the launch's own block is untouched
    t = step.as_tuple()
    assert len(t) == 10 and t[6] == step.params


def test_an_address_offset_adds_up():
    assert (OUT + 16 + 32) == OUT.__class__(Source.OUT, 48)


@pytest.mark.parametrize("fields, error", [
    (dict(M=X), TypeError),                 # a per-call address in an int field
    (dict(x=MapOf(X, 1, 16, 1, 128)), TypeError),  # a tensor map in a pointer field
    (dict(nope=1), AttributeError),
])
def test_misplaced_fields_are_refused(fields, error):
    with pytest.raises(error):
        step_of(_launch(), **fields)


def test_only_kernel_args_blocks_can_be_recorded():
    launch = SimpleNamespace(args=(ctypes.c_uint8 * 16)(), shape=_launch().shape)
    with pytest.raises(TypeError, match="KernelArgs"):
        step_of(launch)
