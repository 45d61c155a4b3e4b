"""Every op launches on the device of its tensors, not on the current device.

Single GPU: each op under ``torch.cuda.device(0)`` with tensors on cuda:0. With two or more GPUs:
tensors on cuda:1 while cuda:0 is current, and on cuda:0 while cuda:1 is current, give the results of
tensors on the current device (and leave the caller's device current)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def _ops():
    import copy

    from torch import nn

    import cutlass_ops as co
    from cutlass_ops.nn import QuantLinear

    g = torch.Generator().manual_seed(0)
    W = torch.randn(128, 256, generator=g)
    Wc = torch.randn(64, 32, 3, 3, generator=g)
    host = {
        "qw4": co.quantize_weight(W, bits=4, block_size=64), "qw8": co.quantize_weight(W, bits=8, block_size=64),
        "qwc": co.quantize_conv_weight(Wc, bits=8),
        "qwd": co.quantize_conv_weight(torch.randn(32, 1, 3, 3, generator=g), bits=4, block_size=9),  # depthwise
        "qws": co.quantize_conv_weight(torch.randn(16, 3, 7, 7, generator=g), bits=8),  # a stem: small_ci
        "qwb": co.quantize_weight_block_scaled(W, 128),
        "xs": torch.randn(2, 3, 20, 19, generator=g).half(),
        "x": torch.randn(5, 256, generator=g).half(), "x1": torch.randn(1, 256, generator=g).half(),
        "xc": torch.randn(2, 32, 9, 9, generator=g).half(),
        "A": torch.randint(-8, 8, (33, 256), generator=g, dtype=torch.int8),
        "B": torch.randint(-8, 8, (128, 256), generator=g, dtype=torch.int8),
        "sr": torch.rand(33, generator=g), "sc": torch.rand(128, generator=g),
        "ms": torch.rand(128, generator=g) / 256, "fb": torch.zeros(128),
    }

    linear = nn.Linear(256, 128).half()
    w8a8_channel = QuantLinear.from_float(linear, co.W8A8ChannelConfig())

    def on(device):
        v = {k: (t.to(device) if hasattr(t, "to") else t) for k, t in host.items()}
        channel = copy.deepcopy(w8a8_channel).to(device)
        return {
            "linear-int4-gemv": lambda: co.linear(v["x1"], v["qw4"]),
            "linear-int4": lambda: co.linear(v["x"], v["qw4"]),
            "linear-int8": lambda: co.linear(v["x"], v["qw8"]),
            "conv2d": lambda: co.conv2d(v["xc"], v["qwc"], padding=1),
            "conv2d-depthwise": lambda: co.conv2d(v["xc"], v["qwd"], padding=1, groups=32),
            "conv2d-stem": lambda: co.conv2d(v["xs"], v["qws"], stride=2, padding=3),
            "QuantLinear-w8a8_channel": lambda: channel(v["x"]),
            "linear_w8a8_block_scaled": lambda: co.linear_w8a8_block_scaled(v["x"], v["qwb"]),
            "linear_w8a8-fused": lambda: co.linear_w8a8(v["x"], v["qw8"]),
            "linear_w8a8-orchestrator": lambda: co.linear_w8a8(v["x"], v["qw8"], path="orchestrator"),
            "linear_w8a8-literal": lambda: co.linear_w8a8(v["x"], v["qw8"], path="literal"),
            "int8_gemm": lambda: co.int8_gemm(v["A"], v["B"]),
            "int8_gemm-dequant": lambda: co.int8_gemm(v["A"], v["B"], "dequant", scale_row=v["sr"], scale_col=v["sc"],
                                                      out_dtype=torch.float16),
            "int8_gemm_requant": lambda: co.int8_gemm_requant(v["A"], v["B"], v["ms"], v["fb"]),
            "quantize_activation": lambda: co.quantize_activation(v["x"], 64)[0],
        }
    return on


NAMES = ["linear-int4-gemv", "linear-int4", "linear-int8", "conv2d", "conv2d-depthwise", "conv2d-stem",
         "QuantLinear-w8a8_channel", "linear_w8a8-fused", "linear_w8a8-orchestrator", "linear_w8a8-literal",
         "int8_gemm", "int8_gemm-dequant", "int8_gemm_requant", "quantize_activation"]
if torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0):
    NAMES.append("linear_w8a8_block_scaled")  # the kernel is Hopper's (wgmma)


@pytest.fixture(scope="module")
def on():
    return _ops()


@pytest.mark.parametrize("name", NAMES)
def test_under_device_0_with_tensors_on_cuda0(on, name):
    with torch.cuda.device(0):
        out = on("cuda:0")[name]()
        torch.cuda.synchronize(0)
    assert out.device == torch.device("cuda:0")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("name", NAMES)
def test_tensors_on_cuda1_while_cuda0_is_current(on, name):
    with torch.cuda.device(0):
        ref = on("cuda:0")[name]().cpu()
        out = on("cuda:1")[name]()
        assert torch.cuda.current_device() == 0  # the op restored the caller's device
        torch.cuda.synchronize(1)
    assert out.device == torch.device("cuda:1")
    assert torch.equal(out.cpu(), ref)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("name", NAMES)
def test_tensors_on_cuda0_while_cuda1_is_current(on, name):
    with torch.cuda.device(0):
        ref = on("cuda:0")[name]().cpu()
    with torch.cuda.device(1):
        out = on("cuda:0")[name]()
        assert torch.cuda.current_device() == 1  # the op restored the caller's device
        torch.cuda.synchronize(0)
    assert out.device == torch.device("cuda:0")
    assert torch.equal(out.cpu(), ref)
