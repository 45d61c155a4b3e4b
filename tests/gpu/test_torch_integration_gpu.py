"""PyTorch integration on the GPU: opcheck of every custom op, torch.compile of models with every mode,
round trips of quantized models, gradients, a LoRA adapter trained in front of a W4A16 layer."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlass_ops
from _module_checks import check_linear_grads, check_round_trips
from cutlass_ops import reference
from cutlass_ops.nn import QuantConv2d, QuantLinear
from cutlass_ops.quantize_model import W8A8BlockConfig, W8A8BlockScaledConfig, W8A8ChannelConfig, WeightOnlyConfig

pytestmark = pytest.mark.gpu
ops = torch.ops.cutlass_ops

LINEAR_CONFIGS = {
    "w4": WeightOnlyConfig(bits=4, block_size=64),
    "w8": WeightOnlyConfig(bits=8, block_size=None),
    "w8a8_fused": W8A8BlockConfig(block_size=64, path="fused"),
    "w8a8_orchestrator": W8A8BlockConfig(block_size=64, path="orchestrator"),
    "w8a8_channel": W8A8ChannelConfig(),
}
CONV_CONFIGS = {"w4": WeightOnlyConfig(bits=4, block_size=32), "w8": WeightOnlyConfig(bits=8, block_size=None)}
# |compiled - eager| / max|eager|: the ops are the same kernels, only the surrounding torch code is fused
COMPILE_TOL = {torch.float16: 2e-2}


def _w(qw):
    return (qw.qweight, qw.scale, qw.offset)


def _gpu_cases(M: int):
    """(name, op, args) for every op at ragged shapes on the GPU (N = 24 / 32, K = 64 / 96)."""
    torch.manual_seed(M)
    dev, h = "cuda", torch.float16
    N, K = 24, 96
    qw4 = cutlass_ops.quantize_weight(torch.randn(N, K), bits=4, block_size=32).to(dev)
    qw8 = cutlass_ops.quantize_weight(torch.randn(N, K), bits=8, block_size=32, symmetric=False).to(dev)
    qch = cutlass_ops.quantize_weight(torch.randn(N, K), bits=8, block_size=None).to(dev)
    qconv = cutlass_ops.quantize_conv_weight(torch.randn(8, 32, 3, 3), bits=4, block_size=32).to(dev)
    x = torch.randn(M, K, device=dev, dtype=h)
    Ng = 32  # int8 GEMM: N a multiple of 16 bytes of D (int8 output: 16)
    A = torch.randint(-128, 128, (M, 64), dtype=torch.int8, device=dev)
    B = torch.randint(-128, 128, (Ng, 64), dtype=torch.int8, device=dev)
    f32 = dict(dtype=torch.float32, device=dev)
    return [
        ("dequantize", ops.dequantize, (*_w(qw4), 4, 32, N, K, h)),
        ("linear", ops.linear, (x, *_w(qw4), 4, 32, N, K, torch.randn(N, device=dev, dtype=h), 1)),
        ("linear_w8a8", ops.linear_w8a8, (x, *_w(qw8), 32, N, K, None, 2, "fused")),
        ("linear_w8a8_channel", ops.linear_w8a8_channel, (x, qch.qweight, qch.scale, None, 0)),
        ("conv2d", ops.conv2d, (torch.randn(2, 32, 7, 9, device=dev, dtype=h), *_w(qconv), 4, 32, [8, 3, 3, 32],
                                None, [2, 1], [1, 1], [1, 1], 1)),
        ("int8_gemm", ops.int8_gemm, (A, B, None)),
        ("int8_gemm_dequant", ops.int8_gemm_dequant,
         (A, B, torch.rand(M, **f32), torch.rand(Ng, **f32), torch.randn(Ng, **f32), 0, h, None)),
        ("int8_gemm_requant", ops.int8_gemm_requant, (A, B, torch.rand(Ng, **f32) / 1000, None, -128, 127, None)),
        ("int8_gemm_kblock_accumulate", ops.int8_gemm_kblock_accumulate,
         (A, B, torch.randn(M, Ng, **f32), *(torch.rand(M if i % 2 == 0 else Ng, **f32) for i in range(6)), None)),
        ("quantize_activation", ops.quantize_activation, (x, 32)),
    ]


@pytest.mark.parametrize("M", [1, 17])
@pytest.mark.parametrize("index", range(10))
def test_opcheck_gpu(M, index):
    name, op, args = _gpu_cases(M)[index]
    torch.library.opcheck(op, args)


def test_public_functions_fast_path_equals_op_path():
    name, op, args = _gpu_cases(5)[1]
    x, q, s, o, bits, bs, N, K, bias, act = args
    qw = cutlass_ops.QuantizedWeight(q, s, o, bits, bs, N, K)
    assert torch.equal(cutlass_ops.linear(x, qw, bias, act), op(*args))


# --------------------------------------------------------------------------------------------
# small models
# --------------------------------------------------------------------------------------------

class Block(nn.Module):
    """RMSNorm, causal self-attention (scaled_dot_product_attention), SwiGLU MLP."""

    def __init__(self, d=256, heads=4, mlp=512):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate, self.up, self.down = (nn.Linear(d, mlp, bias=False), nn.Linear(d, mlp, bias=False),
                                         nn.Linear(mlp, d, bias=False))

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.n1(x)).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
        x = x + self.o(a)
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def _decoder():
    torch.manual_seed(0)
    return nn.Sequential(Block(), Block()).cuda().half()


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(64, 128, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 64),
    ).cuda().half().to(memory_format=torch.channels_last)


def _rel_err(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))


@pytest.mark.parametrize("name", list(LINEAR_CONFIGS))
def test_compile_decoder_fullgraph(name):
    torch._dynamo.reset()
    model = _decoder()
    summary = cutlass_ops.quantize_(model, LINEAR_CONFIGS[name])
    assert len(summary.converted) == 10 and not summary.skipped
    x = torch.randn(2, 7, 256, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True)(x)
    assert _rel_err(compiled, eager) < COMPILE_TOL[torch.float16]


@pytest.mark.parametrize("name", list(CONV_CONFIGS))
def test_compile_cnn_fullgraph(name):
    torch._dynamo.reset()
    model = _cnn()
    summary = cutlass_ops.quantize_(model, CONV_CONFIGS[name])
    assert len(summary.converted) == 4, summary
    x = torch.randn(3, 32, 12, 12, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True)(x)
    assert _rel_err(compiled, eager) < COMPILE_TOL[torch.float16]


@pytest.mark.parametrize("name", ["w4", "w8a8_channel"])
def test_compile_reduce_overhead(name):
    torch._dynamo.reset()
    model = _decoder()
    cutlass_ops.quantize_(model, LINEAR_CONFIGS[name])
    with torch.no_grad():  # one eager call first: it builds the per-weight kernel data outside the graph pool
        model(torch.randn(1, 1, 256, device="cuda", dtype=torch.float16))
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for _ in range(4):  # warm-up, recording, replays
            x = torch.randn(1, 1, 256, device="cuda", dtype=torch.float16)
            out = compiled(x).clone()
            assert _rel_err(out, model(x)) < COMPILE_TOL[torch.float16]


@pytest.mark.parametrize("name", [*LINEAR_CONFIGS, "w8a8_block_scaled"])
def test_compile_reduce_overhead_without_an_eager_call(name):
    """The compiled model's first calls (cudagraph trees' warm-up) build each layer's per-weight data themselves
    (plans, packed scale/offset words, float32 bias copies, padded weights for K = 1000): it is made outside the
    graph's memory pool (cutlass_ops.graph_pool), so neither an eager call nor cutlass_ops.warmup is needed first,
    the graphs are recorded (no cudagraph skip) and replays match the eager model."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(1)
    model = nn.Sequential(Block(), nn.Linear(256, 1000), nn.SiLU(), nn.Linear(1000, 256)).cuda().half()
    if name == "w8a8_block_scaled" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("block-scaled W8A8 runs on Hopper only")
    config = W8A8BlockScaledConfig(block_size=128) if name == "w8a8_block_scaled" else LINEAR_CONFIGS[name]
    summary = cutlass_ops.quantize_(model, config)
    assert summary.converted, summary
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    xs = [torch.randn(1, 1, 256, device="cuda", dtype=torch.float16) for _ in range(4)]
    with torch.no_grad():
        outs = [compiled(x).clone() for x in xs]  # warm-up, recording, replays
        assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
        for x, out in zip(xs, outs):
            assert _rel_err(out, model(x)) < COMPILE_TOL[torch.float16]


@pytest.mark.parametrize("name", list(CONV_CONFIGS))
def test_compile_reduce_overhead_cnn_without_an_eager_call(name):
    """The same for QuantConv2d layers (and a quantized classifier head): compiled first, graphs recorded."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _cnn()
    cutlass_ops.quantize_(model, CONV_CONFIGS[name])
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    xs = [torch.randn(3, 32, 12, 12, device="cuda", dtype=torch.float16).to(memory_format=torch.channels_last)
          for _ in range(4)]
    with torch.no_grad():
        outs = [compiled(x).clone() for x in xs]
        assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
        for x, out in zip(xs, outs):
            assert _rel_err(out, model(x)) < COMPILE_TOL[torch.float16]


# --------------------------------------------------------------------------------------------
# round trips
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(LINEAR_CONFIGS))
def test_round_trips_gpu(tmp_path, name):
    model = _decoder()
    cutlass_ops.quantize_(model, LINEAR_CONFIGS[name])
    x = torch.randn(2, 5, 256, device="cuda", dtype=torch.float16)
    check_round_trips(model, nn.Sequential(Block(), Block()).cuda().half(), x, tmp_path / "m.safetensors")


def test_cpu_built_module_moves_to_gpu():
    lin = nn.Linear(128, 48)
    q = QuantLinear.from_float(lin, LINEAR_CONFIGS["w4"]).half()
    x = torch.randn(3, 128, dtype=torch.float16)
    cpu_out = q(x)
    gpu_out = q.cuda()(x.cuda())
    torch.testing.assert_close(gpu_out.cpu(), cpu_out, atol=2e-2, rtol=2e-2)


# --------------------------------------------------------------------------------------------
# gradients
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["w4", "w8a8_fused", "w8a8_channel"])
def test_linear_grad_matches_float64_reference(mode):
    torch.manual_seed(0)
    check_linear_grads(QuantLinear.from_float(nn.Linear(128, 48), LINEAR_CONFIGS[mode]).cuda())


def test_conv_grad_matches_float64_reference():
    torch.manual_seed(0)
    conv = nn.Conv2d(32, 16, 3, stride=2, padding=1)
    q = QuantConv2d.from_float(conv, WeightOnlyConfig(bits=4, block_size=32, symmetric=False)).cuda()
    q.act = 1  # relu: the mask comes from the output
    x = torch.randn(2, 32, 9, 9, device="cuda", requires_grad=True)
    torch.backends.cudnn.allow_tf32 = False  # the input gradient runs through cuDNN: no TF32 rounding
    try:
        y = q(x)
        g = torch.randn_like(y)
        y.backward(g)
    finally:
        torch.backends.cudnn.allow_tf32 = True
    x64 = x.detach().double().requires_grad_(True)
    y64 = reference.conv2d_reference(x64, q.weight(), q.bias, 2, 1, activation="relu")
    y64.backward(g.double())
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-4, atol=1e-4)


def test_non_differentiable_paths_raise():
    A = torch.randint(-128, 128, (4, 64), dtype=torch.int8, device="cuda")
    B = torch.randint(-128, 128, (32, 64), dtype=torch.int8, device="cuda")
    s_row = torch.rand(4, device="cuda", requires_grad=True)
    with pytest.raises(RuntimeError, match=r"int8_gemm\(\) is not differentiable but scale_row requires grad"):
        cutlass_ops.int8_gemm(A, B, "dequant", scale_row=s_row, scale_col=torch.rand(32, device="cuda"))
    with pytest.raises(RuntimeError, match="is not differentiable"):
        cutlass_ops.quantize_activation(torch.randn(4, 64, device="cuda", requires_grad=True))
    q = QuantLinear.from_float(nn.Linear(64, 32), LINEAR_CONFIGS["w4"]).cuda()
    q.offset.requires_grad_(True)
    with pytest.raises(RuntimeError, match="offset requires grad"):
        q(torch.randn(2, 64, device="cuda"))


def test_lora_in_front_of_w4a16_learns():
    """A LoRA adapter (x + B(A x)) before a frozen W4A16 layer: the loss falls in a few steps."""
    torch.manual_seed(0)
    d, r = 256, 8
    base = QuantLinear.from_float(nn.Linear(d, d), LINEAR_CONFIGS["w4"]).cuda().half()
    lora_a = nn.Linear(d, r, bias=False).cuda().half()
    lora_b = nn.Linear(r, d, bias=False).cuda().half()
    nn.init.zeros_(lora_b.weight)
    target = torch.randn(64, d, device="cuda", dtype=torch.float16)
    x = torch.randn(64, d, device="cuda", dtype=torch.float16)
    opt = torch.optim.Adam(list(lora_a.parameters()) + list(lora_b.parameters()), lr=1e-2, eps=1e-4)
    losses = []
    for _ in range(20):
        y = base(x + lora_b(lora_a(x)))
        loss = F.mse_loss(y.float(), target.float())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.9 * losses[0], losses
    assert base.qweight.grad is None and base.scale.grad is None


def test_warmup_then_graph_capture_without_an_eager_call():
    """After cutlass_ops.warmup the first real use can be a CUDA-graph capture (no plan left to build)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.SiLU(), torch.nn.Linear(512, 128)).half().cuda()
    cutlass_ops.quantize_(model, cutlass_ops.WeightOnlyConfig(bits=4, block_size=128))
    assert cutlass_ops.warmup(model, batch_sizes=(1, 16)) == 4
    for M in (1, 16):
        x = torch.randn(M, 256, dtype=torch.float16, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            y = model(x)
        x.copy_(torch.randn(M, 256, dtype=torch.float16, device="cuda"))
        graph.replay()
        with torch.no_grad():
            expected = model(x)
        torch.cuda.synchronize()
        assert torch.equal(y, expected)
