"""The public API contract: argument errors name the argument; no GPU => a clear RuntimeError."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import cutlass_ops
from cutlass_ops import (
    QuantizedWeight, conv2d, int8_gemm, int8_gemm_requant, linear, linear_w8a8, quantize_activation,
    quantize_conv_weight, quantize_weight,
)
from cutlass_ops.formats import quantize_activation_reference

HAS_GPU = torch.cuda.is_available()
no_gpu_only = pytest.mark.skipif(HAS_GPU, reason="checks the GPU-less error path")

N, K = 6, 64


@pytest.fixture
def qw8():
    return quantize_weight(torch.randn(N, K), bits=8, block_size=32)


@pytest.fixture
def qw4():
    return quantize_weight(torch.randn(N, K), bits=4, block_size=32, symmetric=False)


@pytest.fixture
def qconv():
    return quantize_conv_weight(torch.randn(4, 8, 3, 3), bits=4, block_size=4)


def _int8(*shape):
    return torch.randint(-128, 128, shape, dtype=torch.int8)


# ---------------------------------------------------------------------------------------------
# quantizers
# ---------------------------------------------------------------------------------------------

def test_quantize_weight_validation():
    with pytest.raises(TypeError, match="^w must have dtype"):
        quantize_weight(torch.zeros(4, 64, dtype=torch.int32))
    with pytest.raises(TypeError, match="^w must be a torch.Tensor"):
        quantize_weight([[1.0]])
    with pytest.raises(ValueError, match=r"^w must be 2-D \[N, K\]"):
        quantize_weight(torch.zeros(64))
    with pytest.raises(ValueError, match="^block_size=48 does not divide K=4160"):
        quantize_weight(torch.zeros(2, 4160), bits=8, block_size=48)
    with pytest.raises(ValueError, match="^bits must be 4 or 8"):
        quantize_weight(torch.zeros(2, 64), bits=2)
    with pytest.raises(ValueError, match="K % 8 == 0.*K=12 from w.shape"):
        quantize_weight(torch.zeros(2, 12), bits=4, block_size=None)
    with pytest.raises(ValueError, match="K % 8 == 0.*K=9"):
        quantize_weight(torch.zeros(2, 9), bits=4, block_size=None)
    with pytest.raises(TypeError, match="^block_size must be an int"):
        quantize_weight(torch.zeros(2, 64), block_size=32.0)
    with pytest.raises(TypeError, match="^symmetric must be a bool"):
        quantize_weight(torch.zeros(2, 64), block_size=32, symmetric="yes")


def test_quantize_conv_weight_validation():
    with pytest.raises(ValueError, match=r"^w must be 4-D \[Co, Ci, Kh, Kw\]"):
        quantize_conv_weight(torch.zeros(4, 8))
    # blocks run along K = Kh*Kw*Ci = 72: 3 divides it (blocks inside each tap), 5 does not
    assert quantize_conv_weight(torch.zeros(4, 8, 3, 3), block_size=3).num_groups == 24
    with pytest.raises(ValueError, match=r"^block_size=5 does not divide Kh\*Kw\*Ci=72"):
        quantize_conv_weight(torch.zeros(4, 8, 3, 3), block_size=5)
    # int4 takes any K: K = 27 is stored padded to 32 (16 bytes per row)
    assert quantize_conv_weight(torch.zeros(4, 3, 3, 3), bits=4).qweight.shape == (4, 16)


def test_quantize_activation_validation_and_cpu_path():
    with pytest.raises(TypeError, match="^x must have dtype"):
        quantize_activation(_int8(2, 64), 32)
    with pytest.raises(ValueError, match=r"^x must be 2-D \[M, K\]"):
        quantize_activation(torch.zeros(2, 3, 64), 32)
    with pytest.raises(ValueError, match="^block_size=48 does not divide K=4160"):
        quantize_activation(torch.zeros(3, 4160), 48)
    x = torch.randn(3, 64)
    got = quantize_activation(x, 32)
    for a, b in zip(got, quantize_activation_reference(x, 32)):
        assert torch.equal(a, b)
    assert got[1].shape == (3, 2)


# ---------------------------------------------------------------------------------------------
# linear / linear_w8a8
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [linear, linear_w8a8])
def test_linear_validation(fn, qw8):
    x = torch.randn(3, K)
    with pytest.raises(TypeError, match="^x must have dtype"):
        fn(_int8(3, K), qw8)
    with pytest.raises(TypeError, match="^x must be a torch.Tensor"):
        fn(x.tolist(), qw8)
    with pytest.raises(ValueError, match=r"^x must have shape \[\.\.\., K\] with K=64"):
        fn(torch.randn(3, K + 1), qw8)
    with pytest.raises(TypeError, match="^qw must be a QuantizedWeight"):
        fn(x, torch.randn(N, K))
    with pytest.raises(ValueError, match=r"^bias must have shape \(6,\)"):
        fn(x, qw8, torch.randn(N + 1))
    with pytest.raises(TypeError, match="^bias must have dtype"):
        fn(x, qw8, torch.zeros(N, dtype=torch.int32))
    with pytest.raises(ValueError, match="^activation must be one of"):
        fn(x, qw8, None, "gelu")
    with pytest.raises(ValueError, match="^activation code"):
        fn(x, qw8, None, 3)
    with pytest.raises(TypeError, match="^activation must be"):
        fn(x, qw8, None, 1.0)


def test_linear_revalidates_a_mutated_weight(qw8, qw4):
    x = torch.randn(3, K)
    qw8.block_size = 48
    with pytest.raises(ValueError, match="block_size=48 does not divide K=64"):
        linear(x, qw8)
    qw4.K, qw4.block_size = 60, 4  # block_size divides K, but K is not a multiple of 8
    with pytest.raises(ValueError, match="K % 8 == 0"):
        linear(torch.randn(3, 60), qw4)


def test_linear_w8a8_specific_validation(qw8, qw4):
    x = torch.randn(3, K)
    with pytest.raises(ValueError, match="^path must be one of"):
        linear_w8a8(x, qw8, path="fastest")
    with pytest.raises(TypeError, match="^path must be a str"):
        linear_w8a8(x, qw8, path=1)
    with pytest.raises(ValueError, match="^qw must be an int8 weight"):
        linear_w8a8(x, qw4)


# ---------------------------------------------------------------------------------------------
# conv2d
# ---------------------------------------------------------------------------------------------

def test_conv2d_validation(qconv, qw8):
    x = torch.randn(2, 8, 9, 9)
    with pytest.raises(TypeError, match="^x must have dtype"):
        conv2d(x.double(), qconv)
    with pytest.raises(ValueError, match=r"^x must be 4-D \[B, Ci, H, W\]"):
        conv2d(torch.randn(8, 9, 9), qconv)
    with pytest.raises(ValueError, match="^x must have Ci=8 channels"):
        conv2d(torch.randn(2, 6, 9, 9), qconv)
    with pytest.raises(ValueError, match="^qw must be a conv weight"):
        conv2d(x, qw8)
    with pytest.raises(TypeError, match="^qw must be a QuantizedWeight"):
        conv2d(x, torch.randn(4, 8, 3, 3))
    with pytest.raises(ValueError, match=r"^bias must have shape \(4,\)"):
        conv2d(x, qconv, torch.randn(3))
    with pytest.raises(ValueError, match="^stride must be >= 1"):
        conv2d(x, qconv, stride=0)
    with pytest.raises(ValueError, match="^padding must be >= 0"):
        conv2d(x, qconv, padding=(1, -1))
    with pytest.raises(ValueError, match="^dilation must be an int or a pair"):
        conv2d(x, qconv, dilation=(1, 2, 3))
    with pytest.raises(TypeError, match="^stride must be an int or a pair of ints"):
        conv2d(x, qconv, stride=1.5)
    with pytest.raises(ValueError, match="^x spatial size"):
        conv2d(torch.randn(2, 8, 4, 4), qconv, dilation=2)
    with pytest.raises(ValueError, match="^activation must be one of"):
        conv2d(x, qconv, activation="sigmoid")


# ---------------------------------------------------------------------------------------------
# int8 GEMMs
# ---------------------------------------------------------------------------------------------

def test_int8_gemm_validation():
    A, B = _int8(5, 32), _int8(7, 32)
    with pytest.raises(TypeError, match="^A must have dtype int8"):
        int8_gemm(A.float(), B)
    with pytest.raises(TypeError, match="^B must have dtype int8"):
        int8_gemm(A, B.to(torch.uint8))
    with pytest.raises(ValueError, match=r"^B must be 2-D \[N, K\]"):
        int8_gemm(A, _int8(7, 32, 1))
    with pytest.raises(ValueError, match="^A .* and B .* disagree on K"):
        int8_gemm(A, _int8(7, 48))
    with pytest.raises(TypeError, match="^epilogue must be a non-empty str"):
        int8_gemm(A, B, epilogue=None)
    with pytest.raises(ValueError, match="^arch must look like"):
        int8_gemm(A, B, arch="sm_90")
    with pytest.raises(TypeError, match="^out_dtype must be None or a torch.dtype"):
        int8_gemm(A, B, out_dtype="float16")


def test_int8_gemm_requant_validation():
    A, W = _int8(5, 32), _int8(7, 32)
    M, fb = torch.ones(7), torch.zeros(7)
    with pytest.raises(TypeError, match="^A_q must have dtype int8"):
        int8_gemm_requant(A.int(), W, M, fb)
    with pytest.raises(ValueError, match="^A_q .* and W_q .* disagree on K"):
        int8_gemm_requant(A, _int8(7, 16), M, fb)
    with pytest.raises(TypeError, match="^M_scale must have dtype float32"):
        int8_gemm_requant(A, W, M.double(), fb)
    with pytest.raises(ValueError, match=r"^fused_bias must have shape \(7,\)"):
        int8_gemm_requant(A, W, M, torch.zeros(5))
    with pytest.raises(ValueError, match="^clamp must satisfy"):
        int8_gemm_requant(A, W, M, fb, clamp=(10, -10))
    with pytest.raises(TypeError, match="^clamp must be a pair"):
        int8_gemm_requant(A, W, M, fb, clamp=127)
    with pytest.raises(TypeError, match="^arch must be None, an int"):
        int8_gemm_requant(A, W, M, fb, arch=9.0)


# ---------------------------------------------------------------------------------------------
# no GPU: valid calls explain themselves
# ---------------------------------------------------------------------------------------------

def _valid_calls():
    torch.manual_seed(0)
    qw8 = quantize_weight(torch.randn(N, K), bits=8, block_size=32)
    qw4 = quantize_weight(torch.randn(N, K), bits=4, block_size=32)
    qconv = quantize_conv_weight(torch.randn(4, 8, 3, 3), bits=8, block_size=8)
    x = torch.randn(2, 3, K, dtype=torch.float16)
    A, B = _int8(5, 32), _int8(7, 32)
    return {
        "linear": lambda: linear(x, qw4, torch.zeros(N, dtype=torch.float16), "relu"),
        "conv2d": lambda: conv2d(torch.randn(2, 8, 9, 9), qconv, None, stride=2, padding=1),
        "linear_w8a8": lambda: linear_w8a8(x, qw8, None, 2, path="orchestrator"),
        "int8_gemm": lambda: int8_gemm(A, B),
        "int8_gemm_requant": lambda: int8_gemm_requant(A, B, torch.ones(7), torch.zeros(7), arch=80),
    }


@no_gpu_only
@pytest.mark.parametrize("name", ["linear", "conv2d", "linear_w8a8", "int8_gemm", "int8_gemm_requant"])
def test_valid_call_without_gpu_raises_runtime_error(name):
    message = rf"cutlass_ops\.{name}\(\) needs an NVIDIA GPU.*cutlass_ops\.reference"
    with pytest.raises(RuntimeError, match=message):
        _valid_calls()[name]()


@pytest.mark.gpu
def test_cpu_tensors_on_a_gpu_machine_are_named(qw8):
    x = torch.randn(3, K, device="cuda")
    with pytest.raises(ValueError, match="^x must be a CUDA tensor"):
        linear(x.cpu(), qw8.to("cuda"))
    with pytest.raises(ValueError, match="^qw.qweight is on cpu"):
        linear(x, qw8)
    with pytest.raises(ValueError, match="^bias is on cpu"):
        linear_w8a8(x, qw8.to("cuda"), torch.zeros(N))
    A = _int8(5, 32).cuda()
    with pytest.raises(ValueError, match="^B is on cpu"):
        int8_gemm(A, _int8(7, 32))
    with pytest.raises(ValueError, match="^M_scale is on cpu"):
        int8_gemm_requant(A, _int8(7, 32).cuda(), torch.ones(7), torch.zeros(7, device="cuda"))


# ---------------------------------------------------------------------------------------------
# import hygiene
# ---------------------------------------------------------------------------------------------

def test_public_names():
    for name in ("QuantizedWeight", "quantize_weight", "quantize_conv_weight", "quantize_activation",
                 "linear", "conv2d", "linear_w8a8", "int8_gemm", "int8_gemm_requant"):
        assert name in cutlass_ops.__all__ and callable(getattr(cutlass_ops, name))
    assert cutlass_ops.QuantizedWeight is QuantizedWeight
    assert callable(cutlass_ops.reference.linear_reference)


def test_import_loads_no_gpu_runtime():
    # torch itself may load cuda.bindings; importing cutlass_ops must add none of the GPU stack.
    code = (
        "import sys, torch\n"
        "before = set(sys.modules)\n"
        "import cutlass_ops, cutlass_ops.reference\n"
        "new = sorted(set(sys.modules) - before)\n"
        "bad = [m for m in new if m.split('.')[0] in ('cuda', 'cutlass_cppgen', 'cutlass', 'custom_kernels')"
        " or m.startswith(('cutlass_ops.ops', 'cutlass_ops.cutlass', 'cutlass_ops.weight_only', 'cutlass_ops.conv', 'cutlass_ops.w8a8.'))]\n"
        "assert 'cutlass_cppgen' not in sys.modules, 'cutlass_cppgen imported'\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert result.returncode == 0, result.stderr
