"""Argument checks shared by the public API and the formats; every error names the argument.

Pure Python + torch: importable on a machine without a GPU.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Activation codes shared with the kernels (custom_kernels/kernels/common.cuh).
ACTIVATIONS = {"none": 0, "relu": 1, "relu6": 2}


def _dtype_names(allowed: Iterable[torch.dtype]) -> str:
    names = [str(d).replace("torch.", "") for d in allowed]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def check_tensor(t, name: str) -> torch.Tensor:
    """TypeError unless ``t`` is a torch.Tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def check_dtype(t, name: str, allowed: Sequence[torch.dtype]) -> torch.Tensor:
    """TypeError unless ``t`` is a tensor whose dtype is one of ``allowed``."""
    check_tensor(t, name)
    if t.dtype not in tuple(allowed):
        raise TypeError(f"{name} must have dtype {_dtype_names(allowed)}, got {t.dtype}")
    return t


def check_ndim(t: torch.Tensor, name: str, ndim: int, layout: str | None = None) -> torch.Tensor:
    """ValueError unless ``t`` has ``ndim`` dimensions; ``layout`` (e.g. "[M, K]") goes in the message."""
    if t.dim() != ndim:
        what = f" {layout}" if layout else ""
        raise ValueError(f"{name} must be {ndim}-D{what}, got shape {tuple(t.shape)}")
    return t


def check_shape(t: torch.Tensor, name: str, expected: Sequence[int | None],
                layout: str | None = None) -> torch.Tensor:
    """ValueError unless ``t.shape`` matches ``expected`` (None matches any size)."""
    shape = tuple(t.shape)
    ok = len(shape) == len(expected) and all(e is None or e == s for e, s in zip(expected, shape))
    if not ok:
        dims = ", ".join("*" if e is None else str(e) for e in expected)
        want = f"({dims},)" if len(expected) == 1 else f"({dims})"
        what = f" {layout}" if layout else ""
        raise ValueError(f"{name} must have shape {want}{what}, got {shape}")
    return t


def check_int(value, name: str, minimum: int | None = None) -> int:
    """TypeError unless ``value`` is an int (bools rejected); ValueError if below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_block_size(block_size, K: int, name: str = "block_size", dim_name: str = "K") -> int:
    """Resolve ``block_size`` (None => ``K``, one group) and check that it divides ``K``."""
    if block_size is None:
        return K
    check_int(block_size, name, minimum=1)
    if K % block_size != 0:
        raise ValueError(f"{name}={block_size} does not divide {dim_name}={K}")
    return block_size


def check_bits(bits, name: str = "bits") -> int:
    if isinstance(bits, bool) or bits not in (4, 8):
        raise ValueError(f"{name} must be 4 or 8, got {bits!r}")
    return bits


def check_int4_K(K: int, where: str | None = None) -> int:
    """int4 weights pack 8 consecutive K elements per 32-bit word, so K must be a multiple of 8.

    ``where`` names the argument K comes from (e.g. "w.shape[1]").
    """
    if K % 8 != 0:
        source = f" from {where}" if where else ""
        raise ValueError(f"int4 weights need K % 8 == 0 (8 nibbles per 32-bit word), got K={K}{source}")
    return K


def parse_activation(activation, name: str = "activation") -> int:
    """None/"none"/0 -> 0, "relu"/1 -> 1, "relu6"/2 -> 2 (the kernels' activation codes)."""
    if activation is None:
        return 0
    if isinstance(activation, str):
        key = activation.lower()
        if key not in ACTIVATIONS:
            raise ValueError(f"{name} must be one of None, {', '.join(repr(k) for k in ACTIVATIONS)} "
                             f"(or 0, 1, 2), got {activation!r}")
        return ACTIVATIONS[key]
    if isinstance(activation, int) and not isinstance(activation, bool):
        if activation not in ACTIVATIONS.values():
            raise ValueError(f"{name} code must be 0 (none), 1 (relu) or 2 (relu6), got {activation}")
        return activation
    raise TypeError(f"{name} must be None, a str or an int code, got {type(activation).__name__}")


def check_choice(value, name: str, choices: Sequence[str]) -> str:
    """ValueError unless ``value`` is one of the strings ``choices``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {list(choices)}, got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def parse_pair(value, name: str, minimum: int) -> tuple[int, int]:
    """An int or a pair of ints -> (h, w), each >= ``minimum`` (conv stride / padding / dilation)."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or a pair (h, w), got {value!r}")
        pair = (value[0], value[1])
    else:
        pair = (value, value)
    for v in pair:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
        if v < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return pair


def check_cuda(t: torch.Tensor, name: str) -> torch.Tensor:
    """ValueError unless ``t`` lives on a CUDA device."""
    if t.device.type != "cuda":
        raise ValueError(f"{name} must be a CUDA tensor, got a tensor on {t.device}")
    return t


def check_same_device(tensors: Mapping[str, torch.Tensor | None], device: torch.device,
                      reference_name: str) -> None:
    """ValueError naming the first tensor of ``tensors`` that is not on ``device``."""
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise ValueError(f"{name} is on {t.device} but {reference_name} is on {device}; "
                             f"all tensors must be on the same CUDA device")


def check_groups(groups, Co: int, Ci_per_group: int) -> int:
    """``groups`` of a conv whose weight is [Co, Ci_per_group, Kh, Kw] (torch.nn.functional.conv2d's
    rule: the Co output channels split into ``groups`` equal sets, input channels = groups * Ci_per_group)."""
    check_int(groups, "groups", minimum=1)
    if Co % groups:
        raise ValueError(f"groups={groups} must divide the weight's Co={Co} output channels")
    return groups


def check_conv_operands(x: torch.Tensor, qw, allowed: tuple, groups=1) -> tuple[int, int, int, int]:
    """(Co, Kh, Kw, Ci) of conv weight ``qw`` (Ci: input channels per group) after checking ``x``
    [B, groups * Ci, H, W] and ``groups`` against it."""
    if qw.conv_shape is None:
        raise ValueError("qw must be a conv weight (from quantize_conv_weight); its conv_shape is None")
    check_dtype(x, "x", allowed)
    check_ndim(x, "x", 4, "[B, Ci, H, W]")
    Co, Kh, Kw, Ci = qw.conv_shape
    if groups.__class__ is not int or groups != 1:
        check_groups(groups, Co, Ci)
    if x.shape[1] != groups * Ci:
        if groups == 1:
            raise ValueError(f"x must have Ci={Ci} channels (dim 1) to match qw, got shape {tuple(x.shape)}")
        raise ValueError(f"x must have groups * Ci = {groups} * {Ci} = {groups * Ci} channels (dim 1) to match qw "
                         f"(weight [Co={Co}, Ci/groups={Ci}, {Kh}, {Kw}]) with groups={groups}, got shape "
                         f"{tuple(x.shape)}")
    return Co, Kh, Kw, Ci


def check_int8_operands(A, B, a_name: str, b_name: str) -> None:
    """int8 A [M, K] and B [N, K] with the same K (errors name the operands)."""
    check_dtype(A, a_name, (torch.int8,))
    check_dtype(B, b_name, (torch.int8,))
    check_ndim(A, a_name, 2, "[M, K]")
    check_ndim(B, b_name, 2, "[N, K]")
    if A.shape[1] != B.shape[1]:
        raise ValueError(f"{a_name} [M, K] and {b_name} [N, K] disagree on K: "
                         f"{tuple(A.shape)} vs {tuple(B.shape)}")
