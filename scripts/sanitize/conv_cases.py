"""Conv cases (conv_direct.cu, conv_igemm.cu, conv_depthwise.cu, conv_small_ci.cu, conv_dequant.cu)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from sanitize.inputs import _cuda, _vector
from sanitize.registry import _DT_NAME, _add, _ref


@dataclass(frozen=True)
class ConvShape:
    batch: int
    Ci: int
    H: int
    W: int
    Co: int
    kh: int
    kw: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    block_size: int
    groups: int = 1  # the weight is [Co, Ci / groups, kh, kw]

    def tag(self) -> str:
        s = lambda p: f"{p[0]}" if p[0] == p[1] else f"{p[0]}x{p[1]}"  # noqa: E731
        return (f"b{self.batch}-ci{self.Ci}-{self.H}x{self.W}-co{self.Co}-k{self.kh}x{self.kw}-s{s(self.stride)}"
                f"-p{s(self.padding)}-d{s(self.dilation)}-g{self.block_size}"
                + (f"-groups{self.groups}" if self.groups != 1 else ""))


@functools.lru_cache(maxsize=None)
def _conv_weight(Co: int, Ci: int, kh: int, kw: int, bits: int, block_size: int):
    """A quantized [Co, Ci, kh, kw] weight (Ci: per group) on the GPU."""
    from cutlass_ops.formats import quantize_conv_weight

    g = torch.Generator().manual_seed(Co * 7 + Ci + kh * 3 + kw + bits)
    w = torch.randn(Co, Ci, kh, kw, generator=g) * 0.2
    return quantize_conv_weight(w, bits=bits, block_size=block_size, symmetric=False).to(_cuda())


def _conv_source(kernel: str) -> str:
    """The .cu file of a conv kernel: its strategy's (conv_igemm.cu also holds the split-K reduce and the
    NCHW transpose)."""
    for strategy in ("direct", "depthwise", "small_ci"):
        if kernel.startswith(f"conv_{strategy}_"):
            return f"conv_{strategy}.cu"
    if kernel.startswith(("conv_dequant", "conv_bias_act_")):
        return "conv_dequant.cu"
    return "conv_igemm.cu"


def _conv_case(strategy: str, dtype, bits: int, channels_last: bool, shape: ConvShape, names: list[str], *,
               split_k: int | None = None, act: int = 1, bias: bool = True, public: bool = False,
               min_cc: int = 0) -> None:
    from cutlass_ops.conv.geometry import conv_defines

    layout = "nhwc" if channels_last else "nchw"
    name = (f"conv_{strategy}/{_DT_NAME[dtype]}-w{bits}-{layout}-{shape.tag()}"
            + (f"-splitk{split_k}" if split_k else "") + ("-public" if public else ""))
    defines = conv_defines(dtype, bits)
    refs = [_ref(_conv_source(n), n, defines) for n in names]

    def run():
        from cutlass_ops.conv import conv2d_weight_only

        qw = _conv_weight(shape.Co, shape.Ci // shape.groups, shape.kh, shape.kw, bits, shape.block_size)
        g = torch.Generator().manual_seed(shape.H * 31 + shape.W)
        x = torch.randn(shape.batch, shape.Ci, shape.H, shape.W, generator=g).to(dtype).to(_cuda())
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        b = _vector(shape.Co, dtype) if bias else None
        if public:
            import cutlass_ops

            return cutlass_ops.conv2d(x, qw, b, shape.stride, shape.padding, shape.dilation,
                                      (None, "relu", "relu6")[act], shape.groups)
        return conv2d_weight_only(x, qw, b, shape.stride, shape.padding, shape.dilation, act, shape.groups,
                                  strategy=strategy, split_k=split_k)

    _add(name, "conv", refs, run, min_cc)


def _build_conv_cases() -> None:
    direct_shapes = (
        ConvShape(1, 32, 9, 9, 24, 3, 3, (1, 1), (1, 1), (1, 1), 32),       # Co not a tile multiple
        ConvShape(2, 16, 13, 11, 10, 3, 3, (2, 2), (2, 2), (2, 2), 16),     # stride 2 + dilation 2, odd H/W
        ConvShape(1, 48, 8, 10, 20, 3, 5, (2, 1), (1, 2), (1, 2), 16),      # Kh != Kw, mixed stride/pad/dil
        ConvShape(3, 24, 7, 5, 33, 1, 1, (1, 1), (0, 0), (1, 1), 8),        # 1x1, odd Co, block 8
    )
    i = 0
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        tag = _DT_NAME[dtype]
        for bits in (4, 8):
            for channels_last in (False, True):
                shape = direct_shapes[i % len(direct_shapes)]
                i += 1
                layout = "nhwc" if channels_last else "nchw"
                _conv_case("direct", dtype, bits, channels_last, shape, [f"conv_direct_{tag}_w{bits}_{layout}"],
                           act=i % 3, bias=i % 4 != 0)
    igemm_shapes = (
        ConvShape(2, 64, 6, 6, 72, 3, 3, (1, 1), (1, 1), (1, 1), 32),       # Co = 72: a ragged N tile
        ConvShape(8, 128, 5, 5, 130, 3, 3, (1, 1), (1, 1), (1, 1), 64),     # two N tiles + a ragged one
        ConvShape(8, 64, 10, 10, 64, 3, 3, (2, 2), (1, 1), (1, 1), 64),     # stride 2
        ConvShape(1, 32, 12, 12, 40, 3, 3, (1, 1), (2, 2), (2, 2), 32),     # dilation 2
    )
    # (dtype, bits, channels_last, shape, split_k): every igemm name, the NCHW transpose, and all four
    # split-K reduce kernels (forced split_k > 1; split_k=1 forces no split).
    plan = ((torch.float16, 4, True, 0, 3), (torch.float16, 4, False, 1, 1), (torch.float16, 8, True, 3, 1),
            (torch.float16, 8, False, 0, 3), (torch.bfloat16, 4, True, 2, 1), (torch.bfloat16, 4, False, 3, 2),
            (torch.bfloat16, 8, True, 1, 5), (torch.bfloat16, 8, False, 2, 1))
    for j, (dtype, bits, channels_last, s, split_k) in enumerate(plan):
        tag, layout = _DT_NAME[dtype], ("nhwc" if channels_last else "nchw")
        names = [f"conv_igemm_{tag}_w{bits}_{layout}"]
        if not channels_last:
            names.append("conv_nchw_to_nhwc_b16")
        if split_k > 1:
            names.append(f"conv_splitk_reduce_{tag}_{layout}")
        _conv_case("igemm", dtype, bits, channels_last, igemm_shapes[s], names, split_k=split_k, act=j % 3,
                   bias=j != 5, min_cc=80)
    # groups: depthwise and grouped direct, the int4 stem (K = 147, rows padded to 152 nibbles), and a
    # grouped igemm (Ci/groups = 64, Co/groups = 64) with and without a K split
    grouped = (
        ("direct", torch.float16, 4, True, ConvShape(2, 24, 9, 9, 24, 3, 3, (2, 2), (1, 1), (1, 1), 9, 24), None),
        ("direct", torch.bfloat16, 8, False, ConvShape(1, 24, 8, 7, 48, 5, 5, (1, 1), (2, 2), (1, 1), 25, 24), None),
        ("direct", torch.float32, 4, False, ConvShape(2, 48, 7, 6, 20, 3, 3, (1, 1), (1, 1), (2, 2), 24, 2), None),
        ("direct", torch.float16, 4, False, ConvShape(1, 3, 21, 19, 16, 7, 7, (2, 2), (3, 3), (1, 1), 3), None),
        ("direct", torch.bfloat16, 4, True, ConvShape(2, 3, 17, 18, 8, 7, 7, (2, 2), (3, 3), (1, 1), 21), None),
        ("igemm", torch.float16, 4, True, ConvShape(2, 128, 6, 6, 128, 3, 3, (1, 1), (1, 1), (1, 1), 64, 2), 1),
        ("igemm", torch.bfloat16, 8, False, ConvShape(1, 256, 5, 5, 256, 3, 3, (1, 1), (1, 1), (1, 1), 192, 4), 3),
    )
    for j, (strategy, dtype, bits, channels_last, shape, split_k) in enumerate(grouped):
        tag, layout = _DT_NAME[dtype], ("nhwc" if channels_last else "nchw")
        names = [f"conv_{strategy}_{tag}_w{bits}_{layout}"]
        if strategy == "igemm" and not channels_last:
            names.append("conv_nchw_to_nhwc_b16")
        if split_k and split_k > 1:
            names.append(f"conv_splitk_reduce_{tag}_{layout}")
        _conv_case(strategy, dtype, bits, channels_last, shape, names, split_k=split_k, act=j % 3,
                   min_cc=80 if strategy == "igemm" else 0)
    # depthwise: each (dtype, bits) module's seven kernels, each by the geometry its plan picks it for
    # (NCHW; NHWC one channel per thread (Ci odd, or a channel multiplier), two (Ci % 4 == 2), four
    # (stride 2 along W: no register window), the register windows for Kw = 3, 5, 7)
    depthwise = (
        ("nchw", ConvShape(2, 24, 9, 9, 24, 3, 3, (2, 2), (1, 1), (1, 1), 9, 24)),
        ("nhwc_v1", ConvShape(1, 13, 8, 7, 26, 3, 3, (1, 1), (1, 1), (1, 1), 3, 13)),
        ("nhwc_v2", ConvShape(2, 18, 7, 9, 18, 5, 5, (2, 2), (2, 2), (1, 1), 25, 18)),
        ("nhwc_v4", ConvShape(1, 24, 11, 10, 24, 3, 3, (2, 2), (1, 1), (1, 1), 9, 24)),
        ("nhwc_v4_k3", ConvShape(2, 40, 9, 13, 40, 3, 3, (1, 1), (1, 1), (1, 1), 1, 40)),
        ("nhwc_v4_k5", ConvShape(1, 36, 10, 11, 36, 5, 5, (2, 1), (2, 2), (2, 1), 5, 36)),
        ("nhwc_v4_k7", ConvShape(1, 32, 12, 14, 32, 7, 7, (1, 1), (3, 3), (1, 1), 49, 32)),
    )
    j = 0
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for bits in (4, 8):
            for layout, shape in depthwise:
                _conv_case("depthwise", dtype, bits, layout != "nchw", shape,
                           [f"conv_depthwise_{_DT_NAME[dtype]}_w{bits}_{layout}"], act=j % 3, bias=j % 5 != 0)
                j += 1
    # small_ci: each module's two layouts, on the stem's geometry (Ci = 3, 7x7, stride 2) and on a grouped
    # conv whose 35 output channels per group leave a ragged 64-channel tile, with dilation 2
    small_ci = (ConvShape(2, 3, 21, 19, 16, 7, 7, (2, 2), (3, 3), (1, 1), 21),
                ConvShape(1, 8, 13, 15, 70, 3, 3, (1, 1), (1, 1), (2, 2), 9, 2))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for bits in (4, 8):
            for channels_last in (False, True):
                layout = "nhwc" if channels_last else "nchw"
                _conv_case("small_ci", dtype, bits, channels_last, small_ci[j % 2],
                           [f"conv_small_ci_{_DT_NAME[dtype]}_w{bits}_{layout}"], act=j % 3, bias=j % 4 != 0)
                j += 1
    # dequant_cudnn: each module's per-element and 8-wide dequantization in both layouts (the stem's K = 147
    # and a block of 12 take the per-element kernel; K = 576 / 288 with blocks of 64 / 32 the 8-wide one), and
    # the NHWC bias / activation epilogue (Co % 8 == 0)
    per_element = (ConvShape(2, 3, 21, 19, 16, 7, 7, (2, 2), (3, 3), (1, 1), 21),
                   ConvShape(1, 24, 9, 11, 40, 3, 3, (1, 1), (1, 1), (1, 1), 12))
    wide = (ConvShape(2, 64, 9, 9, 72, 3, 3, (1, 1), (1, 1), (1, 1), 64),
            ConvShape(1, 64, 8, 10, 48, 3, 3, (2, 1), (1, 2), (1, 2), 32, 2))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        tag = _DT_NAME[dtype]
        for bits in (4, 8):
            for channels_last in (False, True):
                layout = "nhwc" if channels_last else "nchw"
                _conv_case("dequant_cudnn", dtype, bits, channels_last, per_element[j % 2],
                           [f"conv_dequant_{tag}_w{bits}_{layout}"], act=j % 3, bias=j % 4 != 0)
                epilogue = [f"conv_bias_act_{tag}_nhwc"] if channels_last else []
                _conv_case("dequant_cudnn", dtype, bits, channels_last, wide[j % 2],
                           [f"conv_dequant8_{tag}_w{bits}_{layout}", *epilogue], act=1 + j % 2)
                j += 1
    # public API, auto strategy: deep K and few pixels (igemm, split along K by the heuristic)
    _conv_case("auto", torch.float16, 4, True, ConvShape(1, 512, 7, 7, 64, 3, 3, (1, 1), (1, 1), (1, 1), 128),
               ["conv_igemm_f16_w4_nhwc"], public=True, min_cc=80)
