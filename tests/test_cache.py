"""The on-disk cache under concurrency and corruption (CPU only: NVRTC compiles without a GPU).

4 processes x 2 threads build the same 3 kernels from an empty cache at once: each is compiled
once (counted from the ``built`` records of the ``custom_kernels.cache`` logger) and every caller
gets the same bytes. A flipped byte or a truncated file is rebuilt with a warning; an entry
without a sha256 sidecar (older code) is adopted, not rebuilt, unless it is not a whole ELF file.
"""
from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from custom_kernels import cache, nvrtc

REPO = Path(__file__).resolve().parent.parent

KERNELS = {f"k{i}.cu": f'extern "C" __global__ void k{i}(float* y) {{ y[threadIdx.x] += {i}.0f; }}' for i in range(3)}

WORKER = r"""
import hashlib, json, logging, sys, threading, time
from pathlib import Path
records = []
class Count(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
logger = logging.getLogger("custom_kernels.cache")
logger.setLevel(logging.INFO)
logger.addHandler(Count())
from custom_kernels import nvrtc
kernels = json.loads(sys.argv[1])
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))  # every process starts building at the same moment
digests = {}
def work(order):
    for name in order:
        cubin = nvrtc.compile_source(kernels[name], 80, name=name)
        digests[(threading.get_ident(), name)] = hashlib.sha256(cubin.data).hexdigest()
names = sorted(kernels)
threads = [threading.Thread(target=work, args=(names if i % 2 == 0 else names[::-1],)) for i in range(2)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"built": [m for m in records if m.startswith("built ")],
                  "digests": sorted({f"{n}:{d}" for (_, n), d in digests.items()}), "calls": len(digests)}))
"""


def test_processes_and_threads_build_each_kernel_once(tmp_path):
    env = {**os.environ, cache.ENV_VAR: str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    start = time.time() + 8.0  # time for four interpreters to import cuda.bindings on a busy host
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(KERNELS), str(start)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    built = sorted(m for r in results for m in r["built"])
    assert len(built) == 3, built  # one compilation per kernel over all 8 threads
    assert {m.split()[1].split("-")[0] for m in built} == {"k0", "k1", "k2"}
    assert all(r["calls"] == 6 for r in results)
    assert len({tuple(r["digests"]) for r in results}) == 1 and len(results[0]["digests"]) == 3
    cubins = sorted((tmp_path / "cache" / "nvrtc").glob("*.cubin"))
    assert len(cubins) == 3 and all(cache.sidecar_path(c).is_file() for c in cubins)
    assert not list((tmp_path / "cache" / "nvrtc").glob(".*.tmp"))  # no temporary left behind


def test_threads_in_one_process_build_once(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path))
    calls = []

    def build():
        calls.append(1)
        time.sleep(0.2)  # long enough for every thread to find the entry missing
        return b"payload"

    path = cache.cache_dir("x") / "entry.bin"
    got = []
    threads = [threading.Thread(target=lambda: got.append(cache.get_or_build(path, build)[0])) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and got == [b"payload"] * 8


def _fresh_process():
    """Forget which files this process verified (what a new process sees)."""
    cache._verified.clear()


@pytest.fixture
def cubin(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "cache"))
    return nvrtc.compile_source(KERNELS["k0.cu"], 80, name="k0.cu")


def test_flipped_byte_is_rebuilt_with_a_warning(cubin, caplog):
    good = cubin.path.read_bytes()
    with open(cubin.path, "r+b") as f:
        f.seek(len(good) // 2)
        f.write(bytes([good[len(good) // 2] ^ 0xFF]))
    _fresh_process()
    with caplog.at_level(logging.WARNING, logger="custom_kernels.cache"):
        again = nvrtc.compile_source(KERNELS["k0.cu"], 80, name="k0.cu")
    assert not again.from_cache and again.data == good and cubin.path.read_bytes() == good
    assert any("does not match its sha256" in r.getMessage() for r in caplog.records)


def test_truncated_file_is_rebuilt_in_the_same_process(cubin):
    good = cubin.path.read_bytes()
    cubin.path.write_bytes(good[:100])
    again = nvrtc.compile_source(KERNELS["k0.cu"], 80, name="k0.cu")
    assert not again.from_cache and again.data == good


def test_entry_without_sidecar_is_adopted_not_rebuilt(cubin, caplog):
    cache.sidecar_path(cubin.path).unlink()
    _fresh_process()
    with caplog.at_level(logging.INFO, logger="custom_kernels.cache"):
        again = nvrtc.compile_source(KERNELS["k0.cu"], 80, name="k0.cu")
    assert again.from_cache and again.data == cubin.data
    assert cache.sidecar_path(cubin.path).read_text() == cache.hashlib.sha256(cubin.data).hexdigest()
    assert not any(r.getMessage().startswith("built ") for r in caplog.records)


def test_truncated_entry_without_sidecar_is_rebuilt(cubin):
    cache.sidecar_path(cubin.path).unlink()
    cubin.path.write_bytes(cubin.data[: len(cubin.data) - 64])  # the section header table is gone
    _fresh_process()
    again = nvrtc.compile_source(KERNELS["k0.cu"], 80, name="k0.cu")
    assert not again.from_cache and again.data == cubin.data


def test_directories_are_private_and_the_root_absolute(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "root"))
    sub = cache.cache_dir("a", "b")
    for p in (tmp_path / "root", tmp_path / "root" / "a", sub):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(cache.ENV_VAR, "relative/cache")
    with pytest.raises(ValueError, match=cache.ENV_VAR):
        cache.cache_root()
    monkeypatch.delenv(cache.ENV_VAR)
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert cache.cache_root() != Path.cwd() and cache.cache_root().is_absolute()


def test_cutlass_artifact_is_verified_and_legacy_directories_adopted(cubin, tmp_path):
    """A CUTLASS kernel directory: files checked against their sidecars; one built by older code
    (no sidecars) adopted when whole; a flipped byte in the cubin makes it a miss (build() rebuilds)."""
    from cutlass_ops.cutlass.build import GemmArtifact

    directory = cache.cache_dir("cutlass", "kernels", "legacy-0123456789abcdef")
    (directory / "kernel.cubin").write_bytes(cubin.data)  # any whole ELF file stands for both
    (directory / "host.so").write_bytes(cubin.data)
    (directory / "meta.json").write_text(json.dumps({"kernel_name": "k"}))
    art = GemmArtifact.load(directory)
    assert art is not None and art.meta == {"kernel_name": "k"}
    for name in ("kernel.cubin", "host.so", "meta.json"):
        assert cache.sidecar_path(directory / name).is_file()
    data = bytearray(cubin.data)
    data[200] ^= 1
    (directory / "kernel.cubin").write_bytes(bytes(data))
    _fresh_process()
    assert GemmArtifact.load(directory) is None
    (directory / "kernel.cubin").write_bytes(cubin.data)
    (directory / "meta.json").write_text("{trunc")
    _fresh_process()
    assert GemmArtifact.load(directory) is None


def test_elf_check():
    assert not cache.looks_like_elf(b"")
    assert not cache.looks_like_elf(b"not an elf file at all" * 10)
