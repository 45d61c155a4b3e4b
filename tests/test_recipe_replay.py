"""The C++ replay of recorded launches (host/recipe_launch.cpp) against the stub driver (tests/host_emu/
libcuda_stub.c, not a driver: its cuLaunchKernelEx writes what it was handed - function, grid, block, shared
memory, stream, launch attributes, the second parameter - into the 16 words its first parameter points at).
So a step whose first parameter is a per-call address shows, in host memory, that it was patched with that
address and launched with its recorded shape. What the replay must refuse (and leave to Python) is checked
too. The replay of real kernels is compared with the Python path in tests/gpu/test_recipes_gpu.py."""
from __future__ import annotations

import ctypes
import gc
from types import SimpleNamespace

import pytest
import torch

from custom_kernels import host_ext, libcuda
from custom_kernels.device import check
from custom_kernels.launch import I32, KernelArgs, LaunchConfig, Module, Ptr, TensorMap
from custom_kernels.recipe import BIAS, OUT, WORKSPACE, X, MapOf, step_of

IMAGE = b"\x7fELF\x2a" + bytes(59)  # a module image the stub accepts
M, K, N = 4, 64, 64
STREAM = 0x5150


class _Args(KernelArgs):
    _fields_ = [("out", Ptr), ("n", I32), ("other", Ptr), ("map_a", TensorMap)]


@pytest.fixture
def ext(stub):
    """The extension with the stub's cuLaunchKernelEx / cuTensorMapEncodeTiled and a stub context current."""
    try:
        module, _ = host_ext._load_or_build()
    except host_ext._Unavailable as exc:
        pytest.skip(str(exc))
    address = lambda name: ctypes.cast(libcuda.function(name), ctypes.c_void_p).value
    module.set_launch_function(address("cuLaunchKernelEx"))
    module.set_tensor_map_function(address("cuTensorMapEncodeTiled"))
    context = check(libcuda.cuDevicePrimaryCtxRetain(check(libcuda.cuDeviceGet(0), "cuDeviceGet")), "retain")
    check(libcuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
    yield SimpleNamespace(module=module, context=context, function=Module(IMAGE, "m").kernel("kern").function(0))
    module.set_launch_function(0)  # no later test may reach the stub through the extension
    module.set_tensor_map_function(0)
    check(libcuda.cuCtxSetCurrent(0), "cuCtxSetCurrent")


def _step(function: int, grid=(3, 1, 1), cluster=(1, 1, 1), pdl=False, **fields):
    config = LaunchConfig.of(grid, 64, 256, cluster=cluster, pdl=pdl)
    shape = SimpleNamespace(function=function, grid=config.grid, block=config.block, smem=config.smem,
                            cluster=config.cluster, pdl=config.pdl)
    return step_of(SimpleNamespace(args=_Args(), shape=shape), **fields).as_tuple()


def _weight():
    """(qweight, scale, offset, a prepared tensor the steps would point at) on the CPU."""
    return (torch.randint(-8, 8, (N, K), dtype=torch.int8), torch.rand(N, 1), torch.rand(N, 1), torch.rand(N, 4))


def _register(ext, weight, steps, bias=True, act=1, workspace=512, bias_dtype=torch.float32, m=M):
    qweight, scale, offset, prepared = weight
    ext.module.register_recipe(qweight, scale, offset, -1, torch.empty(0), m, K, act, bias, N, workspace,
                               torch.empty(0, dtype=bias_dtype), [prepared], steps)


def _run(ext, x, weight, bias, act=1, scale=None):
    qweight, s, offset, _ = weight
    return ext.module.run_recipe(x, qweight, s if scale is None else scale, offset, bias, act, -1, STREAM)


def _words(t: torch.Tensor, first: int) -> list[int]:
    """The 16 words the stub wrote at word ``first`` of ``t``, those of attributes it did not have left out
    (the stub writes only numAttrs of the two (id, value) pairs; the rest is whatever the memory held)."""
    w = t.contiguous().view(torch.int64).flatten()[first:first + 16].tolist()
    return w[:10 + 2 * w[9]] + w[14:]


def test_each_step_is_patched_and_launched_as_recorded(ext):
    weight = _weight()
    steps = [_step(ext.function, pdl=True, out=OUT, n=7, other=WORKSPACE + 64),
             _step(ext.function, grid=(2, 2, 1), cluster=(2, 1, 1), out=X + 128, n=9),
             _step(ext.function, out=BIAS, n=11, map_a=MapOf(X, M, K, 4, 128)),
             _step(ext.function, grid=(1, 1, 1), out=OUT + 128, n=13, other=WORKSPACE)]
    _register(ext, weight, steps)
    x, bias = torch.zeros(M, K), torch.zeros(N)
    out = _run(ext, x, weight, bias)
    assert out.shape == (M, N) and out.dtype == x.dtype
    pdl, cluster = libcuda.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, \
        libcuda.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    f, ctx = ext.function, ext.context
    assert _words(out, 0) == [f, 3, 1, 1, 64, 1, 1, 256, STREAM, 1, pdl, 1, 7, ctx]  # into the output
    assert _words(x, 16) == [f, 2, 2, 1, 64, 1, 1, 256, STREAM, 1, cluster, 2, 9, ctx]  # x + 128 bytes
    assert _words(bias, 0) == [f, 3, 1, 1, 64, 1, 1, 256, STREAM, 0, 11, ctx]  # the bias (and a map encoded)
    assert _words(out, 16) == [f, 1, 1, 1, 64, 1, 1, 256, STREAM, 0, 13, ctx]  # output + 128 bytes
    x3 = torch.zeros(2, 2, K)  # leading dimensions: M = 4 rows all the same
    assert _run(ext, x3, weight, bias).shape == (2, 2, N)


def test_what_was_not_recorded_is_left_to_python(ext):
    weight = _weight()
    _register(ext, weight, [_step(ext.function, out=OUT, n=1)])
    x, bias = torch.zeros(M, K), torch.zeros(N)
    assert _run(ext, x, weight, bias) is not None
    assert _run(ext, torch.zeros(M + 1, K), weight, bias) is None          # another M
    assert _run(ext, x.half(), weight, bias) is None                       # another x dtype
    assert _run(ext, x, weight, None) is None                              # no bias
    assert _run(ext, x, weight, bias, act=2) is None                       # another activation
    assert _run(ext, x, weight, bias.half()) is None                       # the bias in another dtype
    assert _run(ext, x, weight, torch.zeros(N + 1)) is None                # the bias of another size
    assert _run(ext, torch.zeros(K, M).t(), weight, bias) is None          # x not contiguous
    assert _run(ext, torch.zeros(M * K + 1)[1:].view(M, K), weight, bias) is None  # x not 16-byte aligned
    assert _run(ext, x, weight, bias, scale=weight[1].clone()) is None     # another scale tensor
    assert _run(ext, x.clone().requires_grad_(), weight, bias) is None     # a gradient of x is wanted
    weight[1].requires_grad_(True)
    assert _run(ext, x, weight, bias) is None                              # ... of the weight's scale
    weight[1].requires_grad_(False)
    with torch.no_grad():
        assert _run(ext, x.clone().requires_grad_(), weight, bias) is not None  # no gradient under no_grad
    assert _run(ext, x, weight, bias) is not None


@pytest.mark.parametrize("change", ["qweight", "scale", "prepared"])
def test_a_tensor_changed_in_place_invalidates_the_recipe(ext, change):
    weight = _weight()
    _register(ext, weight, [_step(ext.function, out=OUT, n=1)])
    x, bias = torch.zeros(M, K), torch.zeros(N)
    args = (weight[0], weight[1], weight[2], -1, torch.empty(0), M, K, 1, True)
    assert _run(ext, x, weight, bias) is not None and ext.module.has_recipe(*args)
    {"qweight": weight[0], "scale": weight[1], "prepared": weight[3]}[change].add_(1)
    assert _run(ext, x, weight, bias) is None and not ext.module.has_recipe(*args)


def test_a_prepared_tensor_that_is_gone_invalidates_the_recipe(ext):
    qweight, scale, offset, prepared = _weight()
    weight = (qweight, scale, offset, prepared)
    _register(ext, weight, [_step(ext.function, out=OUT, n=1)])
    x, bias = torch.zeros(M, K), torch.zeros(N)
    assert _run(ext, x, weight, bias) is not None
    weight = (qweight, scale, offset, None)
    del prepared
    gc.collect()
    assert _run(ext, x, weight, bias) is None


def test_a_problem_without_steps_is_remembered_and_left_to_python(ext):
    weight = _weight()
    _register(ext, weight, [], bias=False)
    assert ext.module.has_recipe(weight[0], weight[1], weight[2], -1, torch.empty(0), M, K, 1, False)
    assert _run(ext, torch.zeros(M, K), weight, None) is None


def test_a_failed_launch_names_its_step(ext):
    weight = _weight()
    _register(ext, weight, [_step(ext.function, out=OUT, n=1), _step(ext.function, grid=(0, 1, 1), out=OUT, n=2)])
    assert _run(ext, torch.zeros(M, K), weight, torch.zeros(N)) == (1, 1)  # step 1, CUDA_ERROR_INVALID_VALUE


def test_recipes_of_freed_weights_are_dropped_at_the_next_registration(ext):
    gc.collect()
    alive = _weight()
    _register(ext, alive, [_step(ext.function, out=OUT, n=1)])  # drops what earlier tests' weights left
    before = ext.module.recipe_count()
    weight = _weight()
    _register(ext, weight, [_step(ext.function, out=OUT, n=1)])
    assert ext.module.recipe_count() == before + 1
    del weight
    gc.collect()
    _register(ext, _weight(), [_step(ext.function, out=OUT, n=1)])  # one dropped, one added
    assert ext.module.recipe_count() == before + 1
