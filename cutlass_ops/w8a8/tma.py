"""TMA tensor maps (CUtensorMap) for kernels that take them by value (``__grid_constant__``).

``tensor_map_2d`` describes a row-major int8 matrix [rows, cols] to the Hopper copy engine: boxes of
``box_rows`` x ``box_cols`` bytes written to shared memory in the 128-byte swizzle that wgmma
descriptors read, out-of-bounds elements filled with zeros. The map is 128 opaque bytes, made by the
driver (``cuTensorMapEncodeTiled``) and cached per (device, address, shape, box) as the launcher's
``TensorMap`` field value: an activation whose buffer the caching allocator hands out again costs a
dictionary lookup.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from custom_kernels import libcuda
from custom_kernels.device import check
from custom_kernels.launch import TensorMap
from custom_kernels.recipe import MapOf

__all__ = ["tensor_map_2d", "encode_maps"]

_KEPT = 256  # maps kept (least recently used dropped first)
_maps: OrderedDict[tuple, TensorMap] = OrderedDict()
_lock = threading.Lock()


def tensor_map_2d(address: int, rows: int, cols: int, box_rows: int, box_cols: int, device: int) -> TensorMap:
    """The 128-byte CUtensorMap of an int8 [rows, cols] row-major matrix at ``address`` (16-byte
    aligned, ``cols`` a multiple of 16) read in [box_rows, box_cols] boxes, 128-byte swizzled, as a
    ``TensorMap`` to assign to a KernelArgs field."""
    key = (device, address, rows, cols, box_rows, box_cols)
    with _lock:
        found = _maps.get(key)
        if found is not None:
            _maps.move_to_end(key)
            return found
    if address % 16 or cols % 16:
        raise ValueError(f"a TMA matrix needs a 16-byte aligned start and rows of a multiple of 16 bytes, "
                         f"got address % 16 = {address % 16}, cols = {cols}")
    if box_cols != 128:
        raise ValueError(f"the 128-byte swizzle needs 128-byte box rows, got box_cols={box_cols}")
    tensor_map = check(libcuda.cuTensorMapEncodeTiled(
        libcuda.CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, address,
        (cols, rows),          # dimensions, innermost first
        (cols,),               # byte stride of each dimension but the innermost
        (box_cols, box_rows),  # box, innermost first
        (1, 1),                # element strides
        libcuda.CU_TENSOR_MAP_INTERLEAVE_NONE,
        libcuda.CU_TENSOR_MAP_SWIZZLE_128B,
        libcuda.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        libcuda.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,  # zeros
    ), f"cuTensorMapEncodeTiled(rows={rows}, cols={cols}, box={box_rows}x{box_cols})")
    data = TensorMap.from_buffer_copy(tensor_map)  # the map's 128 bytes
    with _lock:
        _maps[key] = data
        if len(_maps) > _KEPT:
            _maps.popitem(last=False)
    return data


def encode_maps(fields: dict, device: int) -> dict:
    """``fields`` (a launch's, as the families describe it for both their direct call and the recipes) with each
    ``custom_kernels.recipe.MapOf`` whose address is an int replaced by its TensorMap (:func:`tensor_map_2d`)."""
    for name, value in fields.items():
        if isinstance(value, MapOf):
            fields[name] = tensor_map_2d(value.address, value.rows, value.cols, value.box_rows, value.box_cols, device)
    return fields
