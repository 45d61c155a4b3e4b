"""CPU tests of the minmax weight quantization kernel (``quantize_weight.cu``, ``quantizers.minmax_cuda``).

Every variant builds with NVRTC for sm_75 / sm_80 / sm_90a, the source defines exactly the kernels the host
names with the parameter list of the host's argument struct, the dispatch of ``formats.quantize_weight`` /
``quantize_conv_weight`` sends exactly the CUDA weights of the default method there, and the kernel's flags
turn into the torch path's own errors. The kernel's values are checked on a GPU
(``tests/gpu/test_quantize_weight_gpu.py``).
"""
from __future__ import annotations

import ctypes
import dataclasses
import re
from types import SimpleNamespace

import pytest
import torch

from custom_kernels import nvrtc
from cutlass_ops import formats
from cutlass_ops.default_variants import BITS, quantize_weight_kernels
from cutlass_ops.formats import QuantizedWeight, quantize_conv_weight, quantize_weight
from cutlass_ops.quantizers import minmax_cuda
from cutlass_ops.quantizers.minmax_cuda import SOURCE, TAGS, QuantizeWeightArgs, kernel

VARIANTS = [(dtype, bits) for dtype in TAGS for bits in BITS]


def _source() -> str:
    return re.sub(r"\\\n", " ", nvrtc.kernel_path(SOURCE).read_text())  # macro bodies on one line


@pytest.mark.parametrize("arch", [75, 80, "90a"])
def test_every_variant_compiles(arch):
    cubin = nvrtc.compile_file(SOURCE, arch)
    assert cubin.data[:4] == b"\x7fELF"
    for dtype, bits in VARIANTS:
        source, name, defines = kernel(dtype, bits)
        assert (source, defines) == (SOURCE, {})  # one module holds every variant
        assert b"\0" + name.encode() + b"\0" in cubin.data, (arch, name)


def test_the_source_defines_exactly_the_named_kernels():
    defined = set(re.findall(r"^CUOPS_DEFINE_QUANTIZE_WEIGHT\((\w+),", _source(), re.M))
    assert defined == {kernel(dtype, bits)[1] for dtype, bits in VARIANTS}
    assert {use.name for dtype, bits in VARIANTS for use in quantize_weight_kernels(dtype, bits)} == defined


def test_the_kernel_parameters_are_the_argument_struct():
    body = re.search(r"#define CUOPS_DEFINE_QUANTIZE_WEIGHT\(NAME, T, BITS\)(.*?)\{", _source(), re.S).group(1)
    params = re.search(r"NAME\((.*)\)", body, re.S).group(1)
    kinds = {"long long": ctypes.c_int64, "int": ctypes.c_int32}
    parsed = []
    for param in params.split(","):
        ctype, name = param.strip().rsplit(" ", 1)
        parsed.append((name, ctypes.c_uint64 if ctype.endswith("*") else kinds[ctype]))
    assert parsed == [(name, kind) for name, kind in QuantizeWeightArgs._fields_]


def test_threads_per_row():
    assert [minmax_cuda.threads(K) for K in (1, 147, 256, 257, 1024, 4096, 14336)] == [32, 32, 32, 64, 128, 256, 256]


# ------------------------------------------------------------------------------------------------
# the dispatch (no GPU: a stand-in for the weight's device and size)
# ------------------------------------------------------------------------------------------------

def _on_cuda(numel: int = 64):
    return SimpleNamespace(is_cuda=True, numel=lambda: numel)


def _block(w, K=128, block_size=32, default_block=128, conv=False, bits=8, method="minmax", calibration=None,
           options=None):
    return formats._kernel_block_size(w, K, block_size, default_block, conv, bits, method, calibration, options)


def test_a_cuda_weight_with_the_default_method_takes_the_kernel():
    w = _on_cuda()
    assert _block(w) == 32
    assert _block(w, options={}) == 32
    assert _block(w, block_size=None) == 128  # None: the caller's default (K, or Ci for a conv)
    assert _block(w, block_size=None, default_block=3, K=147, conv=True, bits=4) == 3  # int4 stem: rows padded
    assert _block(w, K=147, block_size=21, conv=True, bits=4) == 21
    assert _block(w, K=128, block_size=4, bits=4) == 4  # blocks smaller than a packed word


@pytest.mark.parametrize("change", [
    dict(method="mse"), dict(method="gptq"), dict(method="MINMAX"), dict(method=None),
    dict(calibration=torch.ones(2, 128)), dict(options={"steps": 3}), dict(options=[]),
    dict(block_size=48), dict(block_size=0), dict(block_size=True), dict(block_size=32.0),
    dict(K=132, block_size=None, default_block=132, bits=4),  # int4 linear needs K % 8 == 0: torch raises
    dict(K=minmax_cuda.MAX_K * 2, block_size=None, default_block=minmax_cuda.MAX_K * 2),
], ids=str)
def test_everything_else_takes_the_torch_path(change):
    assert _block(_on_cuda(), **change) is None


def test_cpu_and_empty_weights_take_the_torch_path():
    assert _block(torch.ones(4, 128)) is None
    assert _block(_on_cuda(numel=0)) is None


def test_a_cpu_weight_never_reaches_the_kernel(monkeypatch):
    def kernel_called(*args, **kwargs):
        raise AssertionError("the CUDA kernel ran for a CPU weight")

    monkeypatch.setattr(minmax_cuda, "quantize_minmax_cuda", kernel_called)
    w = torch.randn(4, 3, 7, 7)
    for bits in BITS:
        assert quantize_weight(w.reshape(4, -1)[:, :144], bits=bits, block_size=48).qweight.device.type == "cpu"
        assert quantize_conv_weight(w, bits=bits).qweight.device.type == "cpu"


# ------------------------------------------------------------------------------------------------
# the kernel's flags -> the torch path's errors; the QuantizedWeight it returns
# ------------------------------------------------------------------------------------------------

def _torch_error(w: torch.Tensor) -> str:
    with pytest.raises(ValueError) as err:
        quantize_weight(w, bits=8, block_size=32)
    return str(err.value)


@pytest.mark.parametrize("bad, flags", [(float("nan"), minmax_cuda.NONFINITE_W),
                                        (float("inf"), minmax_cuda.NONFINITE_W | minmax_cuda.W_BEYOND_FLOAT32),
                                        (1e39, minmax_cuda.W_BEYOND_FLOAT32)])
def test_input_flags_raise_the_torch_error(monkeypatch, bad, flags):
    w = torch.ones(2, 64, dtype=torch.float64)
    w[1, 33] = bad
    expected = _torch_error(w)
    monkeypatch.setattr(minmax_cuda, "quantize_minmax_cuda", lambda *a: (None, None, None, flags))
    with pytest.raises(ValueError) as err:
        formats._quantize_cuda(w, 8, 32, True, 64)
    assert str(err.value) == expected


@pytest.mark.parametrize("name, flags", [("scale", minmax_cuda.NONFINITE_SCALE),
                                         ("scale", minmax_cuda.NONFINITE_SCALE | minmax_cuda.NONFINITE_OFFSET),
                                         ("offset", minmax_cuda.NONFINITE_OFFSET)])
def test_parameter_flags_raise_the_torch_error(monkeypatch, name, flags):
    w = torch.full((2, 64), -3.0)
    monkeypatch.setattr(minmax_cuda, "quantize_minmax_cuda", lambda *a: (None, None, None, flags))
    with pytest.raises(ValueError, match=re.escape(f"w: quantization gave a non-finite {name} (values too large "
                                                   f"for the float32 {name}, max |w| = 3)")):
        formats._quantize_cuda(w, 8, 32, True, 64)


def test_unconfirmed_input_flags_are_an_internal_error(monkeypatch):
    monkeypatch.setattr(minmax_cuda, "quantize_minmax_cuda", lambda *a: (None, None, None, minmax_cuda.NONFINITE_W))
    with pytest.raises(RuntimeError, match="flagged 0x1"):
        formats._quantize_cuda(torch.ones(2, 64), 8, 32, True, 64)


@pytest.mark.parametrize("bits", BITS)
def test_the_kernel_weight_is_the_validated_weight(bits):
    w = torch.randn(3, 5, 3, 3)
    ref = quantize_conv_weight(w, bits=bits, block_size=None, symmetric=False)
    qw = formats._kernel_weight(ref.qweight, ref.scale, ref.offset, bits, ref.block_size, ref.N, ref.K,
                                ref.conv_shape, False)
    qw.validate()
    for field in dataclasses.fields(QuantizedWeight):
        a, b = getattr(qw, field.name), getattr(ref, field.name)
        assert (a is b) if isinstance(a, torch.Tensor) else (a == b and type(a) is type(b)), field.name
