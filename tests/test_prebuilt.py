"""Shipped kernels: a read-only prebuilt tree consulted before the user cache (CPU only).

An NVRTC cubin placed in ``$CUTLASS_OPS_PREBUILT_DIR`` (same relative path and key as in the user
cache) is returned without compiling (no ``built`` record on the ``custom_kernels.cache`` logger)
and without writing the user cache; a shipped cubin with a flipped byte, or without its sha256
sidecar, is ignored with a warning and the kernel compiled into the user cache; nothing in the
prebuilt tree is ever created, changed or removed; finding a shipped cubin searches no toolkit
(its include directories matter only to compile). A shipped CUTLASS kernel directory is found by
``lookup`` in a process where ``cutlass_cppgen`` cannot be imported, and a kernel that must be
emitted there fails with an error naming the ``cutlass`` extra.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from custom_kernels import cache, nvrtc

REPO = Path(__file__).resolve().parent.parent
SOURCE = 'extern "C" __global__ void shipped(float* y) { y[threadIdx.x] *= 2.0f; }'


def snapshot(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``root``: (size, mtime_ns, sha256); a change of any shows up."""
    return {p.relative_to(root).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns,
                                             hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(root.rglob("*")) if p.is_file()}


def compiled_messages(records) -> list[str]:
    return [r.getMessage() for r in records if r.getMessage().startswith("built ")]


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """(prebuilt root, relative path of the shipped cubin, its bytes); the user cache starts empty."""
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "build-cache"))
    monkeypatch.setenv(cache.PREBUILT_ENV_VAR, str(tmp_path / "empty-prebuilt"))
    built = nvrtc.compile_source(SOURCE, 80, name="shipped.cu")
    rel = built.path.relative_to(cache.cache_root())
    prebuilt = tmp_path / "prebuilt"
    (prebuilt / rel).parent.mkdir(parents=True)
    shutil.copy2(built.path, prebuilt / rel)
    shutil.copy2(cache.sidecar_path(built.path), cache.sidecar_path(prebuilt / rel))
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "user-cache"))
    monkeypatch.setenv(cache.PREBUILT_ENV_VAR, str(prebuilt))
    cache._verified.clear()  # what a new process sees
    return prebuilt, rel, built.data


def test_shipped_cubin_is_loaded_without_compiling(shipped, caplog):
    prebuilt, rel, good = shipped
    before = snapshot(prebuilt)
    with caplog.at_level(logging.INFO, logger="custom_kernels.cache"):
        cubin = nvrtc.compile_source(SOURCE, 80, name="shipped.cu")
    assert cubin.from_cache and cubin.data == good
    assert not compiled_messages(caplog.records)
    assert not any("not in the shipped kernels" in r.getMessage() for r in caplog.records)
    assert not list((cache.cache_root() / "nvrtc").glob("*.cubin"))  # the user cache was not filled
    assert snapshot(prebuilt) == before


SHIPPED_IN_A_BARE_PROCESS = r"""
import json, sys
import torch
spawned = []
sys.addaudithook(lambda event, args: spawned.append(" ".join(map(str, args[1]))) if event == "subprocess.Popen" else None)
from custom_kernels import cuda_paths, nvrtc
cubin = nvrtc.compile_source(sys.argv[1], 80, name="shipped.cu")
print(json.dumps({"hit": cubin.from_cache, "toolkit_searched": cuda_paths.cuda_include_dirs.cache_info().misses,
                  "spawned": spawned}))
"""


def test_a_shipped_cubin_is_loaded_without_searching_the_toolkit(shipped, tmp_path):
    """The include directories matter only to compile: a shipped cubin is found without them (no
    cuda-pathfinder search, which starts a probe process where no toolkit is on PATH)."""
    (tmp_path / "bin").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    env.update(PATH=str(tmp_path / "bin"), PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", SHIPPED_IN_A_BARE_PROCESS, SOURCE], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["hit"] and out["toolkit_searched"] == 0 and not out["spawned"], out


@pytest.mark.parametrize("damage", ["flipped byte", "no sidecar"])
def test_damaged_shipped_cubin_is_ignored_and_compiled(shipped, caplog, damage):
    prebuilt, rel, good = shipped
    if damage == "flipped byte":
        data = bytearray(good)
        data[len(data) // 2] ^= 0xFF
        (prebuilt / rel).write_bytes(bytes(data))
    else:
        cache.sidecar_path(prebuilt / rel).unlink()
    before = snapshot(prebuilt)
    with caplog.at_level(logging.INFO, logger="custom_kernels.cache"):
        cubin = nvrtc.compile_source(SOURCE, 80, name="shipped.cu")
    assert not cubin.from_cache and cubin.data == good
    assert cubin.path.is_file() and cache.cache_root() in cubin.path.parents
    messages = [r.getMessage() for r in caplog.records]
    why = "does not match its sha256" if damage == "flipped byte" else "has no sha256 sidecar"
    assert any(r.levelno == logging.WARNING and r.getMessage().startswith("shipped kernel ") and why in r.getMessage()
               for r in caplog.records), messages
    assert any(m.startswith("not in the shipped kernels: compiling shipped-sm80-") for m in messages), messages
    assert len(compiled_messages(caplog.records)) == 1
    assert snapshot(prebuilt) == before  # no sidecar adopted, nothing repaired in the shipped tree
    cache._verified.clear()
    assert nvrtc.compile_source(SOURCE, 80, name="shipped.cu").from_cache  # the user cache serves it now


def test_prebuilt_root_defaults_to_the_package_and_must_be_absolute(monkeypatch):
    monkeypatch.delenv(cache.PREBUILT_ENV_VAR, raising=False)
    assert cache.prebuilt_root() == REPO / "custom_kernels" / "prebuilt"
    assert (cache.prebuilt_root() / "README.md").is_file()
    monkeypatch.setenv(cache.PREBUILT_ENV_VAR, "relative/prebuilt")
    with pytest.raises(ValueError, match=cache.PREBUILT_ENV_VAR):
        cache.prebuilt_root()


# A process where the CUTLASS interface cannot be imported (as without the ``cutlass`` extra).
NO_INTERFACE = r"""
import json, sys
sys.modules["cutlass_cppgen"] = None
sys.modules["cutlass_library"] = None
from cutlass_ops.cutlass.build import CutlassBuildError, build, lookup
from cutlass_ops.cutlass.tuning import configured_specs
shipped, missing = configured_specs("80", ["none"])[:2]
art = lookup(shipped)
out = {"directory": str(art.directory) if art else None, "meta": art.meta if art else None}
try:
    build(missing)
    out["error"] = None
except CutlassBuildError as exc:
    out["error"] = str(exc)
out["interface_imported"] = any(sys.modules.get(m) is not None for m in ("cutlass_cppgen", "cutlass_library"))
print(json.dumps(out))
"""


def test_shipped_cutlass_kernel_needs_no_interface(shipped, tmp_path):
    from cutlass_ops.cutlass.tuning import configured_specs

    prebuilt, _, elf = shipped
    spec = configured_specs("80", ["none"])[0]
    name = f"{spec.name}-0123456789abcdef"
    directory = prebuilt / "cutlass" / "kernels" / name
    directory.mkdir(parents=True)
    meta = {"kernel_name": "k", "spec": json.loads(json.dumps(spec.to_dict()))}
    for file, data in (("kernel.cubin", elf), ("host.so", elf), ("meta.json", json.dumps(meta).encode())):
        (directory / file).write_bytes(data)  # any whole ELF file stands for the cubin and the library
        cache.sidecar_path(directory / file).write_text(hashlib.sha256(data).hexdigest())
    (prebuilt / "cutlass" / "index").mkdir()
    (prebuilt / "cutlass" / "index" / f"{spec.index_key()}.json").write_text(json.dumps({"directory": name}))
    before = snapshot(prebuilt)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", NO_INTERFACE], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["directory"] == str(directory) and out["meta"] == meta
    assert out["error"] and "install cutlass-ops[cutlass] to build new CUTLASS kernels" in out["error"]
    assert not out["interface_imported"]
    assert snapshot(prebuilt) == before


def test_build_wheel_ships_the_runtime_cubins(tmp_path, monkeypatch):
    """scripts/build_wheel.py (one small family, one arch): the wheel carries the cubin under the name
    the runtime looks up (same key), its sidecar and the console command; the checkout is untouched."""
    import zipfile

    package_prebuilt = snapshot(REPO / "custom_kernels" / "prebuilt")
    outputs = {d: (REPO / d).exists() for d in ("build", "dist", "cutlass_ops.egg-info")}
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "build_wheel.py"), "--arch", "80", "--family",
                           "quant_a", "-j", "2", "--out", str(tmp_path / "dist")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "cache"))
    monkeypatch.setenv(cache.PREBUILT_ENV_VAR, str(tmp_path / "none"))
    expected = nvrtc.compile_file("quant_a.cu", 80).path.name  # the runtime's entry (default defines)
    shipped = f"custom_kernels/prebuilt/nvrtc/{expected}"
    assert shipped in names and shipped + ".sha256" in names, sorted(n for n in names if "prebuilt" in n)
    with zipfile.ZipFile(wheel) as zf:
        entry_points = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "cutlass-ops = cutlass_ops.cli:main" in entry_points
    assert snapshot(REPO / "custom_kernels" / "prebuilt") == package_prebuilt
    assert {d: (REPO / d).exists() for d in outputs} == outputs
