"""Every NVRTC kernel module the default dispatch of the public ops can load on one GPU architecture.

A wheel ships these cubins (``scripts/build_wheel.py`` through ``scripts/wheel_manifest.py``), so that no
first call of ``linear``, ``conv2d``, ``linear_w8a8``, ``quantize_activation``, ``quantize_weight`` /
``quantize_conv_weight`` of a CUDA weight, the per-token quantization of ``linear_w8a8_channel`` (or of the ``dequantize`` op of the backward formulas) compiles
on a GPU of that architecture, whatever its M, shapes, dtypes, bits and block size. No GPU is needed:
everything is derived from the families' own pure functions,

- what each plan loads: its class's ``kernels(...)`` (source, kernel, defines), whose defines are the
  ones the plan itself loads with (``weight_only.shared.wo_defines``, ``conv.geometry.conv_defines``,
  ``w8a8.tiles.TileConfig.defines``);
- which plan the dispatch can pick: ``weight_only.candidate_strategies`` over every M (it is constant
  from ``candidates_constant_from()`` on) and ``weight_only.plan_class`` (the act-order plan on sm_90+),
  ``conv.igemm.igemm_problem`` and ``conv.auto_strategy``, ``w8a8.tiles.default_configs`` and
  ``w8a8.fused.config_problem``;
- the variant a plan builds by default: ``weight_only.default_gemv_mma_config`` (and the other
  ``default_*`` of ``weight_only.variants``), read by the plans' ``kernels`` as by their constructors.

:func:`default_variants` is the set (with the kernel families of ``scripts/sanitize_kernels.py`` each
belongs to); the ``*_kernels`` functions give what one problem's default dispatch loads, and
``tests/test_default_variants.py`` checks over a grid of problems that it is in the set, that the grid
reaches every module of the set, and, with the driver faked, that the plans load nothing their
``kernels`` does not name.
"""
from __future__ import annotations

from typing import Iterable, NamedTuple

import torch

__all__ = ["KernelUse", "BITS", "FAMILY_OF_STRATEGY", "nvrtc_target", "target_cc", "linear_kernels",
           "dequantize_kernels", "conv2d_kernels", "linear_w8a8_kernels", "linear_w8a8_block_scaled_kernels",
           "quantize_activation_kernels",
           "quantize_weight_kernels", "quantize_per_token_kernels", "int8_gemm_kernels", "default_variants",
           "default_modules"]

BITS = (4, 8)  # weight widths (formats.check_bits)
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
WEIGHT_DTYPES = FLOAT_DTYPES + (torch.float64,)  # what formats.quantize_weight takes
# weight-only strategy -> its kernel family (scripts/sanitize_kernels.py FAMILIES)
FAMILY_OF_STRATEGY = {"dequant_cublas": "dequant_weight"}


class KernelUse(NamedTuple):
    """One kernel a plan loads: its source file, NVRTC defines (sorted pairs: the module's key) and name."""

    file: str
    defines: tuple[tuple[str, int], ...]
    name: str

    @classmethod
    def of(cls, file: str, name: str, defines: dict | None = None) -> "KernelUse":
        """From a plan's ``(source, kernel, defines)`` (``load_kernel``'s arguments)."""
        return cls(file, tuple(sorted((defines or {}).items())), name)

    @property
    def module(self) -> tuple[str, tuple[tuple[str, int], ...]]:
        """(source file, defines): one NVRTC compile, one cubin."""
        return self.file, self.defines


def _uses(kernels: Iterable[tuple[str, str, dict]]) -> set[KernelUse]:
    return {KernelUse.of(file, name, defines) for file, name, defines in kernels}


def nvrtc_target(arch: str | int) -> str:
    """The NVRTC target the runtime compiles for on a GPU of compute capability ``arch`` ("90" and "90a"
    -> "90a", "sm_80" -> "80"), as ``custom_kernels.device.target_arch``."""
    text = str(arch).lower().removeprefix("sm_")
    return "90a" if text == "90" else text


def target_cc(arch: str | int) -> int:
    """The compute capability of NVRTC target ``arch`` ("90a" -> 90)."""
    return int(nvrtc_target(arch).rstrip("a"))


# ---------------------------------------------------------------------------------------------
# what one problem's default dispatch loads
# ---------------------------------------------------------------------------------------------

def linear_kernels(M: int, dtype: torch.dtype, qw, cc: int, *, gather: bool = False,
                   pdl: bool = True) -> set[KernelUse]:
    """What ``cutlass_ops.linear`` loads for M rows of ``dtype`` against ``qw`` (any object with ``bits``,
    ``K``, ``N``, ``block_size``) on sm_``cc`` by default; gather: with an act-order ``perm``; pdl:
    programmatic dependent launch on (``CUTLASS_OPS_PDL``, default on). The split-K reduction is
    included wherever the plan may split (it depends on the GPU's SM count)."""
    from cutlass_ops.weight_only import choose_strategy, plan_class

    tuned = _shipped_choices(M, dtype, qw, cc)  # the GPUs of this architecture whose tuning files name the problem
    if tuned:
        return set().union(*(_uses(plan_class(t.strategy, cc, gather, pdl).kernels(M, dtype, qw.bits, t.config))
                             for t in tuned))
    strategy = choose_strategy(M, dtype, qw, cc)
    return _uses(plan_class(strategy, cc, gather, pdl).kernels(M, dtype, qw.bits))


def _shipped_choices(M: int, dtype: torch.dtype, qw, cc: int) -> list:
    """The shipped tuned entries (``weight_only.tuned``) of sm_``cc`` for this problem (fp16 / bf16): one per GPU
    file that names it (an H100 and an H200 may choose differently; each loads its own)."""
    from cutlass_ops.weight_only.tuned import shipped_entries

    if dtype not in (torch.float16, torch.bfloat16):
        return []
    return [entry for entry_cc, entry in shipped_entries()
            if entry_cc == cc and entry.shape == (qw.N, qw.K, qw.bits, qw.block_size) and entry.M_lo <= M <= entry.M_hi
            and dtype in entry.dtypes]


def dequantize_kernels(dtype: torch.dtype, bits: int) -> set[KernelUse]:
    """What ``weight_only.dequantize_weight`` (the ``cutlass_ops::dequantize`` op of the backward
    formulas, and strategy dequant_cublas) loads."""
    from cutlass_ops.weight_only.dequant_cublas import Dequantizer

    return _uses([Dequantizer.kernel(dtype, bits)])


def conv2d_kernels(dtype: torch.dtype, bits: int, channels_last: bool, Ci: int, Co: int, groups: int,
                   block_size: int, cc: int) -> set[KernelUse]:
    """What ``cutlass_ops.conv2d`` loads by default (strategy "auto") for a weight [Co, Ci / groups, Kh, Kw]
    of ``bits`` in blocks of ``block_size`` and ``dtype`` activations on sm_``cc`` (16-byte aligned
    operands: a misaligned one makes igemm fall back to direct)."""
    from cutlass_ops.conv import _DEQUANT_CUDNN_DTYPES, AUTO_SMALL_CI_MAX
    from cutlass_ops.conv.depthwise import DepthwisePlan
    from cutlass_ops.conv.dequant_cudnn import DequantCudnnPlan
    from cutlass_ops.conv.direct import DirectPlan
    from cutlass_ops.conv.igemm import IgemmPlan, igemm_problem
    from cutlass_ops.conv.small_ci import SmallCiPlan

    # convs of >= DEQUANT_CUDNN_MIN_MACS multiply-adds (large batches) run dequant_cudnn (fp16 / bf16)
    half = dtype in _DEQUANT_CUDNN_DTYPES
    at_batch = _uses(DequantCudnnPlan.kernels(dtype, bits, channels_last)) if half else set()
    if igemm_problem(dtype, Ci // groups, Co, groups, block_size, cc) is None:
        return _uses(IgemmPlan.kernels(dtype, bits, channels_last)) | at_batch
    uses = set(at_batch)
    if groups == Ci > 1 and Co % Ci == 0:
        uses |= _uses(DepthwisePlan.kernels(dtype, bits, channels_last))
    if half:  # whatever igemm and depthwise leave: dequant_cudnn
        return uses
    uses |= _uses(DirectPlan.kernels(dtype, bits, channels_last))  # what a kernel size the others refuse gets
    if groups == 1 and Ci <= AUTO_SMALL_CI_MAX:
        uses |= _uses(SmallCiPlan.kernels(dtype, bits, channels_last))
    return uses


def quantize_activation_kernels(dtype: torch.dtype, block_size: int) -> set[KernelUse]:
    """What ``cutlass_ops.quantize_activation`` (QuantA over all K blocks) loads."""
    from cutlass_ops.w8a8.launches import TAGS
    from cutlass_ops.w8a8.quant_a import SOURCE, WARP_ITEM_MAX

    name = f"quant_a_warp_{TAGS[dtype]}" if block_size <= WARP_ITEM_MAX else f"quant_a_{TAGS[dtype]}"
    return {KernelUse.of(SOURCE, name)}


def quantize_weight_kernels(dtype: torch.dtype, bits: int) -> set[KernelUse]:
    """What ``formats.quantize_weight`` / ``quantize_conv_weight`` load for a CUDA weight of ``dtype`` quantized
    to ``bits`` bits by the default method ("minmax"; the other methods run torch ops)."""
    from cutlass_ops.quantizers.minmax_cuda import kernel

    return _uses([kernel(dtype, bits)])


def quantize_per_token_kernels(dtype: torch.dtype) -> set[KernelUse]:
    """What ``torch_ops.quantize_per_token`` loads for CUDA ``dtype`` activations (``linear_w8a8_channel``,
    QuantLinear mode "w8a8_channel"; the GEMM after it is CUTLASS's): one kernel for every M and K."""
    from cutlass_ops.w8a8.quant_token import quant_token_kernels

    return _uses(quant_token_kernels(dtype))


def linear_w8a8_kernels(M: int, N: int, dtype: torch.dtype, block_size: int, arch: str,
                        path: str = "fused") -> set[KernelUse]:
    """What ``cutlass_ops.linear_w8a8`` loads from NVRTC for M rows on NVRTC target ``arch`` (the
    orchestrator and literal paths also run CUTLASS GEMMs, which are not NVRTC modules)."""
    from cutlass_ops.w8a8.epilogue import SOURCE as EPILOGUE
    from cutlass_ops.w8a8.fused import FusedPlan, config_problem
    from cutlass_ops.w8a8.launches import TAGS
    from cutlass_ops.w8a8.quant_a import SOURCE as QUANT_A
    from cutlass_ops.w8a8.tiles import TILE_CONFIGS, choose_config

    arch = nvrtc_target(arch)
    tag = TAGS[dtype]
    if path == "fused":
        cfg = TILE_CONFIGS[choose_config(M, N, target_cc(arch))]
        problem = config_problem(cfg, block_size, arch)
        if problem is not None:
            raise ValueError(problem)
        return _uses(FusedPlan.kernels(cfg, block_size)) | quantize_activation_kernels(dtype, block_size)
    bias_act = KernelUse.of(EPILOGUE, f"bias_act_f32_{tag}")  # the fp32 accumulator -> dtype, bias, act
    sum_bq = KernelUse.of(QUANT_A, "precompute_sum_bq")
    if path == "orchestrator":
        return quantize_activation_kernels(dtype, block_size) | {sum_bq, bias_act}
    if path == "literal":  # QuantA one block at a time, DequantAndAcc into an fp32 accumulator
        return {KernelUse.of(QUANT_A, f"quant_a_{tag}"), sum_bq, KernelUse.of(EPILOGUE, "dequant_and_acc_f32"),
                bias_act}
    raise ValueError(f"path must be 'fused', 'orchestrator' or 'literal', got {path!r}")


def linear_w8a8_block_scaled_kernels(M: int, N: int, dtype: torch.dtype, block_size: int,
                                     arch: str) -> set[KernelUse]:
    """What ``cutlass_ops.linear_w8a8_block_scaled`` loads for M rows on NVRTC target ``arch`` (sm_90a
    only: other targets raise in the API; empty here)."""
    from cutlass_ops.w8a8.block_scaled_plan import BlockScaledPlan
    from cutlass_ops.w8a8.tiles import BLOCK_SCALED_CONFIGS, choose_block_scaled_config

    if nvrtc_target(arch) != "90a":
        return set()
    cfg = BLOCK_SCALED_CONFIGS[choose_block_scaled_config(M, N)]
    return _uses(BlockScaledPlan.kernels(cfg, block_size, dtype))


# ---------------------------------------------------------------------------------------------
# every one of them, for an architecture
# ---------------------------------------------------------------------------------------------

def _weight_only(cc: int, pdl: bool):
    from cutlass_ops.weight_only import ELEMENT, candidate_strategies, plan_class
    from cutlass_ops.weight_only.dispatch import candidates_constant_from

    for dtype in ELEMENT:
        for bits in BITS:
            for M in range(1, candidates_constant_from() + 1):  # the same candidates for every larger M
                for strategy in candidate_strategies(M, dtype, cc):
                    family = FAMILY_OF_STRATEGY.get(strategy, strategy)
                    for gather in (False, True):  # act-order: its own plan on sm_90+ (gemv_mma)
                        yield family, _uses(plan_class(strategy, cc, gather, pdl).kernels(M, dtype, bits))
            yield "dequant_weight", dequantize_kernels(dtype, bits)
    from cutlass_ops.weight_only.tuned import shipped_entries

    for entry_cc, entry in shipped_entries():  # the variants the tuning files choose on this architecture
        if entry_cc == cc:
            family = FAMILY_OF_STRATEGY.get(entry.strategy, entry.strategy)
            for dtype in entry.dtypes:  # an entry for one activation type loads only that type's modules
                for M in range(entry.M_lo, entry.M_hi + 1):
                    for gather in (False, True):
                        yield family, _uses(plan_class(entry.strategy, cc, gather, pdl).kernels(
                            M, dtype, entry.bits, entry.config))


def _conv(cc: int):
    from cutlass_ops.conv import _DEQUANT_CUDNN_DTYPES
    from cutlass_ops.conv.depthwise import DepthwisePlan
    from cutlass_ops.conv.dequant_cudnn import DequantCudnnPlan
    from cutlass_ops.conv.direct import DirectPlan
    from cutlass_ops.conv.geometry import DTYPE_CODES
    from cutlass_ops.conv.igemm import BK, BN, IgemmPlan, igemm_problem
    from cutlass_ops.conv.small_ci import SmallCiPlan

    for dtype in DTYPE_CODES:
        igemm = igemm_problem(dtype, BK, BN, 1, BK, cc) is None  # igemm runs some conv of dtype on this arch
        for bits in BITS:
            for channels_last in (False, True):
                yield "conv", _uses(DepthwisePlan.kernels(dtype, bits, channels_last))  # groups = Ci, any arch
                if dtype in _DEQUANT_CUDNN_DTYPES:  # at batch, and what igemm and depthwise leave
                    yield "conv", _uses(DequantCudnnPlan.kernels(dtype, bits, channels_last))
                else:
                    yield "conv", _uses(DirectPlan.kernels(dtype, bits, channels_last))  # the fallback, any conv
                    yield "conv", _uses(SmallCiPlan.kernels(dtype, bits, channels_last))  # stems, any arch
                if igemm:
                    yield "conv", _uses(IgemmPlan.kernels(dtype, bits, channels_last))


def _w8a8(arch: str):
    from cutlass_ops.w8a8.fused import FusedPlan, config_problem
    from cutlass_ops.w8a8.quant_a import SOURCE as QUANT_A
    from cutlass_ops.w8a8.quant_a import WARP_ITEM_MAX
    from cutlass_ops.w8a8.tiles import BLOCK_SIZES, TILE_CONFIGS, default_configs

    for name in default_configs(target_cc(arch)):
        cfg = TILE_CONFIGS[name]
        family = "w8a8_kblock_wgmma" if cfg.wgmma else "w8a8_kblock_fused"
        for bs in BLOCK_SIZES:
            if config_problem(cfg, bs, arch) is None:
                yield family, _uses(FusedPlan.kernels(cfg, bs))
                for dtype in FLOAT_DTYPES:
                    yield family, quantize_activation_kernels(dtype, bs)
    for dtype in FLOAT_DTYPES:
        for bs in (WARP_ITEM_MAX, WARP_ITEM_MAX + 1):  # both QuantA kernels (a warp per block, or a block)
            yield "quant_a", quantize_activation_kernels(dtype, bs)
        for path in ("orchestrator", "literal"):  # their NVRTC helpers (the GEMMs are CUTLASS's)
            for use in linear_w8a8_kernels(1, 1, dtype, 128, arch, path):
                yield ("quant_a" if use.file == QUANT_A else "scheme2_epilogue"), {use}
    from cutlass_ops.w8a8.tiles import BLOCK_SCALED_SIZES, block_scaled_default_Ms

    for M in block_scaled_default_Ms():  # the first M of each block-scaled default variant
        for bs in BLOCK_SCALED_SIZES:
            for dtype in FLOAT_DTYPES:
                yield "w8a8_kblock_wgmma", linear_w8a8_block_scaled_kernels(M, 8192, dtype, bs, arch)


def _quantize_weight():
    for dtype in WEIGHT_DTYPES:
        for bits in BITS:
            yield "quantize_weight", quantize_weight_kernels(dtype, bits)


def _quant_token():
    for dtype in FLOAT_DTYPES:
        yield "quant_token", quantize_per_token_kernels(dtype)


def int8_gemm_kernels(K: int) -> set[KernelUse]:
    """The NVRTC kernels ``int8_gemm`` / ``int8_gemm_requant`` (and the W8A8 per-channel GEMM) load besides their
    CUTLASS kernel: A's zero-padding where K % 16 != 0."""
    from cutlass_ops.cutlass.padding import PAD_ROWS_KERNEL, padded_K

    return _uses([PAD_ROWS_KERNEL]) if padded_K(K) != K else set()


def _pad_rows():
    yield "pad_rows", int8_gemm_kernels(4097)


def default_variants(arch: str | int, *, pdl: bool = True) -> dict[KernelUse, frozenset[str]]:
    """Every kernel the default dispatch of the public ops can load on a GPU whose NVRTC target is
    ``arch`` ("90a", "80", "75", "86", "89"; "90" means "90a"), each with the kernel families
    (``scripts/sanitize_kernels.py --family`` names) it serves. pdl: programmatic dependent launch on
    (the act-order GEMV variant on sm_90+)."""
    arch = nvrtc_target(arch)
    cc = target_cc(arch)
    out: dict[KernelUse, set[str]] = {}
    for family, uses in (*_weight_only(cc, pdl), *_conv(cc), *_w8a8(arch), *_quantize_weight(), *_quant_token(),
                          *_pad_rows()):
        for use in uses:
            out.setdefault(use, set()).add(family)
    return {use: frozenset(families) for use, families in sorted(out.items())}


def default_modules(arch: str | int, families: Iterable[str] | None = None, *,
                    pdl: bool = True) -> dict[tuple[str, tuple], set[str]]:
    """{(source file, defines): kernel names} of :func:`default_variants`, only the modules serving one of
    ``families`` when given (family names, not aliases)."""
    wanted = None if families is None else set(families)
    modules: dict[tuple[str, tuple], set[str]] = {}
    for use, served in default_variants(arch, pdl=pdl).items():
        if wanted is None or served & wanted:
            modules.setdefault(use.module, set()).add(use.name)
    return modules
