"""Tuned weight-only dispatch: the (strategy, kernel variant) measured fastest on one GPU for a weight shape and
M, read from the ``"weight_only"`` section of that GPU's tuning file. Pure Python: no GPU needed.

Why: the rules of ``dispatch.py`` (and ``variants.default_*_config``) are thresholds measured on a few shapes;
on the shapes a model actually serves another variant is often faster (a wide N wants other tiles than a long
K). ``scripts/tune_weight_only.py`` times the candidates per (N, K, bits, block_size, M) on the GPU and writes
the winners here; those override the rules for exactly those problems, everything else keeps the rules.

File: ``cutlass_ops/tuning/<gpu name>.json`` (``tuning_files.gpu_file_name`` of
``torch.cuda.get_device_name()``, e.g. ``NVIDIA_H100_80GB_HBM3.json``: the file of the int8 GEMM tiles, whose
other sections this one leaves alone)::

    "weight_only": {
      "_source": "scripts/tune_weight_only.py --write-json on NVIDIA H100 80GB HBM3, 2026-11-30 ...",
      "compute_capability": 90,
      "entries": [
        {"N": 4096, "K": 14336, "bits": 4, "block_size": 128, "M": [1, 4], "strategy": "gemv_mma",
         "config": {"row_tiles": 1, "unroll": 8, "min_blocks": 1, "warps": 8}},
        {"N": 4096, "K": 14336, "bits": 4, "block_size": 128, "M": [5, 64], "strategy": "gemm_small_m",
         "config": {"row_tiles": 2, "warps": 8, "stages": 2}}
      ]
    }

- An entry applies to weights of exactly ``N`` x ``K`` with ``bits``-bit values in blocks of ``block_size``
  (per-channel weights: ``block_size`` = K), and to M rows with lo <= M <= hi (``"M": [lo, hi]``, inclusive).
  Ranges of one weight shape may not overlap; an M outside all of them keeps the rule-based dispatch.
- ``"strategy"``: ``"gemv_mma"`` or ``"gemm_small_m"``; ``"config"``: the keyword arguments of
  :class:`~.variants.GemvMmaConfig` / :class:`~.variants.GemmSmallMConfig` (the ones left out take the class
  defaults, which are not always the variant the rules would pick: ``{}`` means ``GemvMmaConfig()``).
- ``"dtype"`` (optional): ``"fp16"`` or ``"bf16"``, the activation type the entry was tuned for. An entry without
  it applies to float16 and bfloat16 alike (the same kernels; ``tune_weight_only.py`` times float16 by default);
  one with it applies to that type only and wins over a type-less entry covering the same M (``--dtype bf16`` runs
  write such entries where bf16 prefers another variant). float32 and GPUs below sm_80 never use entries
  (:func:`tuned_for`).
- ``"compute_capability"`` (optional, written by the tuner): the GPU's, so that the set of prebuilt cubins of
  an architecture can include the tuned variants (:func:`shipped_entries`). Keys starting with ``"_"`` are
  comments, in the section and in entries.

A file is read and checked once per GPU name (:func:`table`): a malformed section, an unknown strategy or
config key, a bad value, an M range outside 1..the variant's largest M, overlapping ranges, or an entry its
strategy cannot run (``dispatch.strategy_problem``) raise ValueError naming the file and the entry. A GPU
without a file, or a file without the section, has no tuned entries.

``CUTLASS_OPS_TUNED=0`` turns the lookup off. It is read when a plan is built: plans already cached for a
weight and M keep the choice they were built with.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import torch

from custom_kernels.launch import switch_on
from cutlass_ops.tuning_files import TUNING_DIR, gpu_file_name

from .dispatch import strategy_problem
from .variants import GemmSmallMConfig, GemmWgmmaConfig, GemvMmaConfig

log = logging.getLogger(__name__)

__all__ = ["SECTION", "ENV_SWITCH", "CONFIG_TYPES", "DTYPE_NAMES", "TUNING_DIR", "TunedEntry", "TunedTable",
           "enabled", "parse_section", "load_file", "tuning_file", "table", "tuned_choice", "device_gpu_name",
           "tuned_for", "config_json", "shipped_entries"]

SECTION = "weight_only"
ENV_SWITCH = "CUTLASS_OPS_TUNED"
# strategy -> its kernel variant class: the strategies a tuned entry may name
CONFIG_TYPES: dict[str, type] = {"gemv_mma": GemvMmaConfig, "gemm_small_m": GemmSmallMConfig,
                                  "gemm_wgmma": GemmWgmmaConfig}
# TUNING_DIR (imported above, shared with the int8 GEMM tiles) is where the per-GPU files live; tests point
# this module's name elsewhere.
_ENTRY_KEYS = ("N", "K", "bits", "block_size", "M", "strategy", "config")
_OPTIONAL_KEYS = ("dtype",)
DTYPE_NAMES = {"fp16": torch.float16, "bf16": torch.bfloat16}  # an entry's "dtype" -> the activation type
_DTYPE_KEYS = {v: k for k, v in DTYPE_NAMES.items()}
_MAX_M = 64  # entries cover M <= 64 (gemv_mma / gemm_small_m: 8 tiles of 8 rows; a row_tiles=4 gemm_small_m 32)


@dataclasses.dataclass(frozen=True)
class TunedEntry:
    """One tuned choice: ``strategy`` with ``config`` for M_lo <= M <= M_hi rows on an N x K weight; ``dtype``
    ("fp16" / "bf16") the activation type it is for, None for both."""

    N: int
    K: int
    bits: int
    block_size: int
    M_lo: int
    M_hi: int
    strategy: str
    config: Any
    dtype: str | None = None

    @property
    def dtypes(self) -> tuple[torch.dtype, ...]:
        """The activation types the entry applies to."""
        return (DTYPE_NAMES[self.dtype],) if self.dtype else tuple(DTYPE_NAMES.values())

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The weight this entry applies to: (N, K, bits, block_size)."""
        return self.N, self.K, self.bits, self.block_size


class TunedTable:
    """The checked entries of one file's section, indexed by weight shape (a lookup scans that shape's ranges)."""

    def __init__(self, source: str, entries: tuple[TunedEntry, ...], compute_capability: int | None = None):
        self.source, self.entries, self.compute_capability = source, entries, compute_capability
        self._by_shape: dict[tuple[int, int, int, int], list[TunedEntry]] = {}
        for entry in entries:
            self._by_shape.setdefault(entry.shape, []).append(entry)

    def lookup(self, M: int, N: int, K: int, bits: int, block_size: int,
               dtype: str | None = None) -> TunedEntry | None:
        """The entry covering M rows on this weight for activations ``dtype`` ("fp16" / "bf16"): one tuned for that
        type first, else one for both; None without either."""
        found = None
        for entry in self._by_shape.get((N, K, bits, block_size), ()):
            if entry.M_lo <= M <= entry.M_hi:
                if entry.dtype is None:
                    found = entry
                elif entry.dtype == dtype:
                    return entry
        return found

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"TunedTable({self.source!r}, {len(self.entries)} entries)"


def enabled() -> bool:
    """Whether tuned entries are used (``CUTLASS_OPS_TUNED``, default on)."""
    return switch_on(ENV_SWITCH)


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _entry(raw, where: str, cc: int | None = None) -> TunedEntry:
    """One entry of the section, checked (``where`` names it in errors)."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: must be an object, got {raw!r}")
    missing = [k for k in _ENTRY_KEYS if k not in raw]
    unknown = sorted(k for k in raw if k not in _ENTRY_KEYS + _OPTIONAL_KEYS and not str(k).startswith("_"))
    if missing or unknown:
        raise ValueError(f"{where}: " + "; ".join(
            ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unknown key(s) {', '.join(unknown)}"]
                                                                       if unknown else [])))
    for key in ("N", "K", "block_size"):
        if not _positive_int(raw[key]):
            raise ValueError(f"{where}: {key} must be a positive integer, got {raw[key]!r}")
    N, K, bits, block_size = raw["N"], raw["K"], raw["bits"], raw["block_size"]
    if not isinstance(bits, int) or isinstance(bits, bool) or bits not in (4, 8):
        raise ValueError(f"{where}: bits must be 4 or 8, got {bits!r}")
    if K % block_size:
        raise ValueError(f"{where}: block_size must divide K, got K={K}, block_size={block_size}")
    strategy = raw["strategy"]
    if strategy not in CONFIG_TYPES:
        raise ValueError(f"{where}: strategy must be one of {list(CONFIG_TYPES)}, got {strategy!r}")
    config_type, fields = CONFIG_TYPES[strategy], raw["config"]
    if not isinstance(fields, dict):
        raise ValueError(f"{where}: config must be an object of {config_type.__name__} fields, got {fields!r}")
    known = [f.name for f in dataclasses.fields(config_type)]
    unknown = sorted(k for k in fields if k not in known)
    if unknown:
        raise ValueError(f"{where}: config key(s) {', '.join(map(repr, unknown))} are not {config_type.__name__} "
                         f"fields ({', '.join(known)})")
    try:
        config = config_type(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: config: {exc}") from None
    M = raw["M"]
    limit = getattr(config, "max_m", _MAX_M)
    if not (isinstance(M, list) and len(M) == 2 and all(_positive_int(m) for m in M) and M[0] <= M[1] <= limit):
        raise ValueError(f"{where}: M must be [lo, hi] with 1 <= lo <= hi <= {limit} ({strategy} {config}), "
                         f"got {M!r}")
    dtype = raw.get("dtype")
    if dtype is not None and dtype not in DTYPE_NAMES:
        raise ValueError(f"{where}: dtype must be one of {list(DTYPE_NAMES)} (or absent: both), got {dtype!r}")
    weight = SimpleNamespace(N=N, K=K, bits=bits, block_size=block_size)
    # M[1]: the strictest M of the range; the file's GPU generation (sm_80 where it names none): gemm_wgmma needs sm_90
    problem = strategy_problem(strategy, M[1], DTYPE_NAMES[dtype or "fp16"], weight, cc or 80)
    if problem is not None:
        raise ValueError(f"{where}: {problem}")
    return TunedEntry(N, K, bits, block_size, M[0], M[1], strategy, config, dtype)


def parse_section(section, source: str) -> TunedTable:
    """The checked table of a ``"weight_only"`` section (a parsed JSON object); ``source`` (a file name) heads
    every error. Raises ValueError on anything :mod:`this module's docstring <.tuned>` does not allow."""
    if not isinstance(section, dict):
        raise ValueError(f"{source}: {SECTION!r} must be an object, got {type(section).__name__}")
    unknown = sorted(k for k in section if k not in ("entries", "compute_capability") and not str(k).startswith("_"))
    if unknown:
        raise ValueError(f"{source}: {SECTION!r} has unknown key(s) {', '.join(unknown)} (entries, "
                         "compute_capability, or '_' comments)")
    cc = section.get("compute_capability")
    if cc is not None and not _positive_int(cc):
        raise ValueError(f"{source}: {SECTION}.compute_capability must be a positive integer (e.g. 90), got {cc!r}")
    raw_entries = section.get("entries", [])
    if not isinstance(raw_entries, list):
        raise ValueError(f"{source}: {SECTION}.entries must be a list, got {type(raw_entries).__name__}")
    entries = []
    for i, raw in enumerate(raw_entries):
        where = f"{source}: {SECTION}.entries[{i}]"
        if isinstance(raw, dict) and all(k in raw for k in ("N", "K", "bits", "block_size")):
            where += f" (N={raw['N']}, K={raw['K']}, bits={raw['bits']}, block_size={raw['block_size']})"
        entries.append(_entry(raw, where, cc))
    by_shape: dict[tuple, list[tuple[int, TunedEntry]]] = {}
    for i, entry in enumerate(entries):
        by_shape.setdefault((*entry.shape, entry.dtype), []).append((i, entry))
    for (N, K, bits, block_size, dtype), found in by_shape.items():
        found.sort(key=lambda ie: ie[1].M_lo)
        for (i, a), (j, b) in zip(found, found[1:]):
            if b.M_lo <= a.M_hi:
                raise ValueError(f"{source}: {SECTION}.entries[{i}] and [{j}] (N={N}, K={K}, bits={bits}, "
                                 f"block_size={block_size}{', dtype=' + dtype if dtype else ''}) overlap: "
                                 f"M {[a.M_lo, a.M_hi]} and {[b.M_lo, b.M_hi]}")
    return TunedTable(source, tuple(entries), cc)


def load_file(path: str | Path) -> TunedTable | None:
    """The checked ``"weight_only"`` table of a tuning file, or None where the file has no such section."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must hold a JSON object, got {type(data).__name__}")
    if SECTION not in data:
        return None
    return parse_section(data[SECTION], str(path))


def tuning_file(gpu_name: str) -> Path:
    """The tuning file of a GPU (shared with the int8 GEMM tiles: :mod:`cutlass_ops.tuning_files`)."""
    return TUNING_DIR / gpu_file_name(gpu_name)


@functools.lru_cache(maxsize=None)
def table(gpu_name: str) -> TunedTable | None:
    """The tuned table of ``gpu_name`` (a ``torch.cuda.get_device_name()``), read once; None without one."""
    path = tuning_file(gpu_name)
    if not path.is_file():
        return None
    tuned = load_file(path)
    if tuned is not None:
        log.info("weight-only dispatch: %d tuned entries from %s", len(tuned), path)
    return tuned


def tuned_choice(gpu_name: str, M: int, N: int, K: int, bits: int, block_size: int,
                 dtype: str | None = None) -> tuple[str, Any] | None:
    """(strategy, config instance) tuned on ``gpu_name`` for M rows of ``dtype`` ("fp16" / "bf16"; None: entries
    for both types only) on an N x K ``bits``-bit weight in blocks of ``block_size``, or None (no entry, or
    ``CUTLASS_OPS_TUNED=0``). fp16 and bf16 activations on sm_80+ only: :func:`tuned_for` checks that."""
    if not enabled():
        return None
    tuned = table(gpu_name)
    entry = tuned.lookup(M, N, K, bits, block_size, dtype) if tuned is not None else None
    return (entry.strategy, entry.config) if entry is not None else None


_gpu_names: dict[int, str | None] = {}


def device_gpu_name(device: int) -> str | None:
    """``torch.cuda.get_device_name(device)``, asked once per device; None without a CUDA runtime (tests that
    fake the driver build plans on a CPU-only torch: no GPU, no tuned table)."""
    if device not in _gpu_names:
        _gpu_names[device] = torch.cuda.get_device_name(device) if torch.cuda.is_available() else None
    return _gpu_names[device]


def tuned_for(qw, M: int, dtype: torch.dtype, device: int, cc: int) -> tuple[str, Any] | None:
    """The tuned (strategy, config) for the default dispatch of M rows of ``dtype`` against ``qw`` on CUDA device
    ``device`` of compute capability ``cc``, or None (then the rules decide): fp16/bf16 on sm_80+, an entry for
    the device's GPU, and a strategy that can run the problem (``dispatch.strategy_problem``)."""
    if dtype not in (torch.float16, torch.bfloat16) or cc < 80 or not enabled():
        return None
    gpu_name = device_gpu_name(device)
    if gpu_name is None:
        return None
    choice = tuned_choice(gpu_name, M, qw.N, qw.K, qw.bits, qw.block_size, _DTYPE_KEYS[dtype])
    if choice is None:
        return None
    problem = strategy_problem(choice[0], M, dtype, qw, cc)
    if problem is not None:  # checked at load for its dtype on sm_80; kept as the guard the dispatch relies on
        log.warning("tuned %s for M=%d, N=%d, K=%d ignored: %s", choice[0], M, qw.N, qw.K, problem)
        return None
    return choice


def config_json(config) -> dict[str, Any]:
    """A config as an entry's ``"config"`` object: every field, those left None (``splits``: automatic) and those
    the config class writes only when set (its ``json_when_set``) at their defaults out."""
    when_set = getattr(config, "json_when_set", ())
    return {k: v for k, v in dataclasses.asdict(config).items()
            if v is not None and not (k in when_set and v == getattr(type(config), k))}


def shipped_entries(tuning_dir: str | Path | None = None) -> Iterator[tuple[int | None, TunedEntry]]:
    """(compute_capability or None, entry) of every tuned entry in the tuning files: what a prebuilt cubin set
    of an architecture must add to the rule-based dispatch's for the tuned choices to load without compiling
    (``cutlass_ops.default_variants``: the kernels of ``plan_class(entry.strategy, cc, ...).kernels(M, dtype,
    entry.bits, entry.config)`` for M in the entry's range, fp16 and bf16). The files are read once per
    directory: default_variants asks for every problem of its grids."""
    yield from _shipped(Path(tuning_dir or TUNING_DIR))


@functools.lru_cache(maxsize=None)
def _shipped(tuning_dir: Path) -> tuple[tuple[int | None, TunedEntry], ...]:
    found = []
    for path in sorted(tuning_dir.glob("*.json")):
        tuned = load_file(path)
        found += [(tuned.compute_capability, entry) for entry in (tuned.entries if tuned is not None else ())]
    return tuple(found)
