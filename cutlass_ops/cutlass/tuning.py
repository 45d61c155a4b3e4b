"""Tiles of the CUTLASS int8 GEMMs: the tables in ``cutlass_ops/tuning/*.json``, M buckets, specs.

Tiles come from ``tuning/default.json`` (overridden by ``tuning/<gpu name>.json``), per kernel
generation and M bucket ("small": M <= small_m_max, "medium": M <= medium_m_max, else "large").
A bucket's entry may carry ``float_out``: a complete tile (the same keys as the entry) used instead
of the entry's own when D is f16, bf16 or f32, for tiles whose int8 (and int32) outputs do not build
or are slower. :func:`kernel_spec` turns (generation, target, epilogue, D type, bucket) into the
:class:`GemmKernelSpec` of the kernel to launch; :func:`configured_specs` lists every one a GPU may use.

N not a multiple of 16 bytes of D (:func:`alignment_D`) runs on an "any-N" kernel (:func:`any_n_spec`):
a CUTLASS 2.x (Sm80) kernel whose epilogue stores D, and reads the per-column inputs, one element at a
time, so N needs no padding. Per (epilogue, D type) and GPU, one kernel per tile of the tables'
``"80"`` entry (:data:`ANY_N_TILES`): ``"any_n"``, ``"any_n_narrow"`` (grids that leave SMs idle) and
``"any_n_large"`` (the large M bucket's, where it fills the GPU); the plan picks one per call. At M = 1 outside
CUDA-graph capture the plan pads N instead (one row of D_pad is already contiguous: no copy). Sm90 has none (its TMA epilogue needs 16-byte row strides), so
Hopper runs the Sm80 ones; Sm75 pads N (padding.py).
"""
from __future__ import annotations

import functools
import json
import logging
from typing import Any

import epilogues

from cutlass_ops.tuning_files import TUNING_DIR, gpu_file_name

from .spec import KERNEL_CCS, GemmKernelSpec

log = logging.getLogger(__name__)

__all__ = ["TUNING_DIR", "BUCKETS", "FLOAT_OUTPUTS", "ALIGNMENT_K", "table", "bucket_limits", "bucket_for",
           "gpu_file_name", "alignment_D", "target_arch_for", "resolve_arch", "kernel_spec", "configured_specs",
           "ANY_N_KERNEL_CC", "ANY_N_ALIGNMENT_D", "ANY_N_TILE", "ANY_N_NARROW_TILE", "ANY_N_LARGE_TILE", "ANY_N_TILES",
           "any_n_spec"]

# M buckets, smallest first: "small" M <= small_m_max < "medium" M <= medium_m_max < "large".
BUCKETS = ("small", "medium", "large")
# Output types a bucket's "float_out" tile applies to.
FLOAT_OUTPUTS = frozenset({"f16", "bf16", "f32"})
# A and B rows must be 16-byte aligned: every kernel here loads int8 operands 16 elements at a time
# (cp.async / TMA), the only alignment the generator offers for int8 TensorOp GEMMs. Other K run on
# zero-padded operands (padding.py); other N on the any-N kernels below (Sm75: padded too).
ALIGNMENT_K = 16
_ELEMENT_BYTES = {"s8": 1, "f16": 2, "bf16": 2, "s32": 4, "f32": 4}
# The any-N kernels: CUTLASS 2.x (mma.sync, cp.async loads of A and B, a plain-store EVT epilogue) storing
# one element of D per access, with the tile of the tables' "80" -> ANY_N_TILE entry for every M.
ANY_N_KERNEL_CC = 80
ANY_N_ALIGNMENT_D = 1
ANY_N_TILE = "any_n"
# ... a narrower tile where the any-N tile's grid leaves SMs idle (fewer CTAs than SMs: the time is one CTA's
# pass over K, and the narrower tile's CTAs each stream half the rows of B). H200, K = 4096, us, 64 x 32 x 128
# against 64 x 64 x 128: M = 64, N = 257 11.8 -> 9.9 (int32 D) / 10.9 -> 9.8 (int8), N = 1000 13.2 -> 12.1 /
# 12.9 -> 12.0; M = 1024, N = 257 13.2 -> 12.2; but M = 1024, N = 1000 (256 CTAs) 18.9 -> 19.9;
ANY_N_NARROW_TILE = "any_n_narrow"
# ... and for the large M bucket, a tile that fills the GPU at large M x N (with the 64 x 64 tile, M = 1024,
# N = 4097 ran at 2.48x the aligned Sm90 time per element on an H200)
ANY_N_LARGE_TILE = "any_n_large"
ANY_N_TILES = (ANY_N_TILE, ANY_N_NARROW_TILE, ANY_N_LARGE_TILE)


def alignment_D(kernel_cc: int, element_D: str) -> int:
    """Elements per access of D: 16 bytes, except the 2.x int32 epilogue, built with 8 (generator's)."""
    if kernel_cc != 90 and element_D == "s32":
        return 8
    return 16 // _ELEMENT_BYTES[element_D]


def target_arch_for(kernel_cc: int, device_cc: int) -> str:
    """nvcc target for a kernel generation on a GPU of ``device_cc``: sm_90a for Sm90 kernels."""
    if kernel_cc == 90:
        if device_cc != 90:
            raise ValueError(f"Sm90 kernels need a Hopper GPU (compute capability 9.0), not {device_cc / 10:.1f}")
        return "90a"
    if device_cc < kernel_cc:
        raise ValueError(f"Sm{kernel_cc} kernels cannot run on compute capability {device_cc / 10:.1f}")
    return str(device_cc)


def resolve_arch(arch: int | None, device_cc: int) -> int:
    """The kernel generation for ``arch`` (None: the device's own) on a GPU of ``device_cc``."""
    if arch is None:
        if device_cc == 90:
            return 90
        if 80 <= device_cc < 90:
            return 80
        if device_cc == 75:
            return 75
        raise ValueError(f"no int8 CUTLASS kernels for compute capability {device_cc / 10:.1f}; pass arch=80 or 75")
    if arch not in KERNEL_CCS:
        raise ValueError(f"arch must be None, 75, 80 or 90, got {arch!r}")
    target_arch_for(arch, device_cc)  # raises if the GPU cannot run it
    return arch


@functools.lru_cache(maxsize=None)
def table(gpu_name: str | None = None) -> dict[str, Any]:
    """Tile table: default.json updated (per kernel cc and bucket) by ``<gpu_name>.json`` if present.

    A bucket entry of the GPU file replaces default.json's entry whole (its ``float_out`` too)."""
    tiles = json.loads((TUNING_DIR / "default.json").read_text())
    source = TUNING_DIR / "default.json"
    if gpu_name:
        path = TUNING_DIR / gpu_file_name(gpu_name)
        if path.is_file():
            # the file's "weight_only" section is weight_only/tuned.py's (a GPU may have only that one)
            override = {k: v for k, v in json.loads(path.read_text()).items() if k != "weight_only"}
            for key, value in override.items():
                if isinstance(value, dict) and isinstance(tiles.get(key), dict):
                    tiles[key] = {**tiles[key], **value}
                else:
                    tiles[key] = value
            if any(not k.startswith("_") for k in override):
                source = path
                log.info("int8 GEMM tiles from %s", path)
    small, medium = tiles.get("small_m_max"), tiles.get("medium_m_max")
    if not (isinstance(small, int) and isinstance(medium, int) and 0 < small <= medium):
        raise ValueError(f"{source}: need integers 0 < small_m_max <= medium_m_max, got "
                         f"small_m_max={small!r}, medium_m_max={medium!r}")
    return tiles


def bucket_limits(gpu_name: str | None = None) -> tuple[int, int]:
    """(small_m_max, medium_m_max) of ``gpu_name``'s tiles."""
    tiles = table(gpu_name)
    return tiles["small_m_max"], tiles["medium_m_max"]


def bucket_for(M: int, gpu_name: str | None = None) -> str:
    """The M bucket ("small", "medium" or "large") of a GEMM with M rows under ``gpu_name``'s tiles."""
    small, medium = bucket_limits(gpu_name)
    return "small" if M <= small else "medium" if M <= medium else "large"


def kernel_spec(kernel_cc: int, target_arch: str, epilogue: str, element_D: str, bucket: str,
                gpu_name: str | None = None) -> GemmKernelSpec:
    """The spec of the kernel used for (kernel generation, target, epilogue, output type, M bucket).

    A float D (f16, bf16, f32) takes the bucket's ``float_out`` tile where the entry has one."""
    if bucket not in BUCKETS:
        raise ValueError(f"bucket must be one of {BUCKETS}, got {bucket!r}")
    generation = table(gpu_name).get(str(kernel_cc), {})
    if bucket not in generation:
        raise ValueError(f"no {bucket!r} tile for Sm{kernel_cc} in the tuning tables (default.json"
                         f"{' + ' + gpu_file_name(gpu_name) if gpu_name else ''})")
    tile = generation[bucket]
    if element_D in FLOAT_OUTPUTS and "float_out" in tile:
        tile = tile["float_out"]
    return _spec_of_tile(kernel_cc, target_arch, epilogue, element_D, tile, alignment_D(kernel_cc, element_D))


def _spec_of_tile(kernel_cc: int, target_arch: str, epilogue: str, element_D: str, tile: dict[str, Any],
                  align_D: int) -> GemmKernelSpec:
    return GemmKernelSpec(
        kernel_cc=kernel_cc, target_arch=target_arch, epilogue=epilogue, element_D=element_D,
        threadblock_shape=tuple(tile["threadblock_shape"]), stages=tile.get("stages"),
        warp_count=tuple(tile["warp_count"]) if tile.get("warp_count") else None,
        cluster_shape=tuple(tile.get("cluster_shape", (1, 1, 1))),
        kernel_schedule=tile.get("kernel_schedule"), epilogue_schedule=tile.get("epilogue_schedule"),
        tile_scheduler=tile.get("tile_scheduler"), alignment_D=align_D)


def any_n_spec(kernel_cc: int, device_cc: int, epilogue: str, element_D: str,
               gpu_name: str | None = None, tile: str = ANY_N_TILE) -> GemmKernelSpec | None:
    """The kernel that runs an N that is not a multiple of ``alignment_D(kernel_cc, element_D)`` without
    padding N, for plans of generation ``kernel_cc`` on a GPU of ``device_cc``: Sm80 with the tables'
    ``"80": {tile: ...}`` entry (``tile``: one of :data:`ANY_N_TILES`), alignment_D = 1 (Sm90 plans use it
    too). None for Sm75 plans: they pad N."""
    if tile not in ANY_N_TILES:
        raise ValueError(f"tile must be one of {ANY_N_TILES}, got {tile!r}")
    if kernel_cc < ANY_N_KERNEL_CC:
        return None
    entry = table(gpu_name).get(str(ANY_N_KERNEL_CC), {}).get(tile)
    if entry is None:
        raise ValueError(f"no {tile!r} tile for Sm{ANY_N_KERNEL_CC} in the tuning tables (default.json"
                         f"{' + ' + gpu_file_name(gpu_name) if gpu_name else ''})")
    return _spec_of_tile(ANY_N_KERNEL_CC, target_arch_for(ANY_N_KERNEL_CC, device_cc), epilogue, element_D, entry,
                         ANY_N_ALIGNMENT_D)


def configured_specs(target: int | str, epilogue_names: list[str] | None = None,
                     buckets: tuple[str, ...] = BUCKETS, gpu_name: str | None = None,
                     any_n: bool = True) -> list[GemmKernelSpec]:
    """Every kernel ``int8_gemm`` may launch on a GPU of compute capability ``target``, each once
    (buckets sharing a tile share a kernel); last, with ``any_n``, the any-N kernels (:func:`any_n_spec`:
    per epilogue and D type the any-N and narrow tiles, which serve every bucket, and with the large bucket
    its own)."""
    device_cc = int(str(target).rstrip("a"))
    specs: dict[GemmKernelSpec, None] = {}
    for kernel_cc in (90, 80, 75):
        if kernel_cc > device_cc or (kernel_cc == 90 and device_cc != 90):
            continue
        for name in epilogue_names or epilogues.names():
            epi = epilogues.get(name)
            for element_D in epi.output_dtypes:
                for bucket in buckets:
                    specs.setdefault(kernel_spec(kernel_cc, target_arch_for(kernel_cc, device_cc), name, element_D,
                                                 bucket, gpu_name))
    if any_n and device_cc >= ANY_N_KERNEL_CC:
        for name in epilogue_names or epilogues.names():
            for element_D in epilogues.get(name).output_dtypes:
                for tile in ANY_N_TILES if BUCKETS[-1] in buckets else ANY_N_TILES[:2]:
                    specs.setdefault(any_n_spec(ANY_N_KERNEL_CC, device_cc, name, element_D, gpu_name, tile))
    return list(specs)
