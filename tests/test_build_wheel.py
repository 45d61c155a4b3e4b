"""scripts/build_wheel.py --from-cache / --host-ext, and the C++ launch path's loader (CPU only).

A small cache directory stands for the one a GPU machine has filled: real NVRTC cubins of one family
for sm_90a (compiled here), CUTLASS kernel directories of configured sm_90 specs (any whole ELF file
stands for the cubin and the host library; one from the default tiles, one only the H100 table
configures), one incomplete kernel, one stale index entry and one stale cubin. The wheel built from
it carries exactly the configured, whole entries at the paths the runtime looks up, and the
installed wheel's runtime finds them with an empty user cache, compiling nothing; the cache and the
checkout are left as they were. With ``--host-ext`` (slow: builds the extension once) the wheel
carries the C++ launch path for this Python and torch, and ``scripts/check_wheel_gpu.py --env-only``
sees it loaded from the wheel with no compiler on PATH and no process started.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from custom_kernels import cache, host_ext

REPO = Path(__file__).resolve().parent.parent
H100 = "NVIDIA_H100_80GB_HBM3"  # tuning/<this>.json: a table the runtime applies on that GPU


def snapshot(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _publish(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    cache.sidecar_path(path).write_text(hashlib.sha256(data).hexdigest())


def _kernel(root: Path, spec, elf: bytes, *, whole: bool = True) -> str:
    """A CUTLASS kernel directory and its index entry in cache ``root``, as cutlass/build.py writes them."""
    name = f"{spec.name}-{hashlib.sha256(spec.name.encode()).hexdigest()[:16]}"
    directory = root / "cutlass" / "kernels" / name
    meta = {"kernel_name": "k", "spec": spec.to_dict()}
    for file, data in (("kernel.cubin", elf), ("host.so", elf), ("meta.json", json.dumps(meta).encode())):
        _publish(directory / file, data)
    (directory / "build.log").write_text("not shipped")
    if not whole:
        cache.sidecar_path(directory / "host.so").unlink()
    index = root / "cutlass" / "index" / f"{spec.index_key()}.json"
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(json.dumps({"directory": name, "spec": spec.to_dict(), "kernel_name": "k"}))
    return name


def _run(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """(cache directory, {what: names}) standing for a GPU machine's filled cache."""
    from cutlass_ops.cutlass.tuning import BUCKETS, configured_specs

    root = tmp_path_factory.mktemp("filled-cache")
    proc = _run(str(REPO / "scripts" / "sanitize_kernels.py"), "--build-only", "--arch", "90a", "--family", "quant_a",
                "-j", "2", env={cache.ENV_VAR: str(root), cache.PREBUILT_ENV_VAR: str(root / "none")})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cubins = sorted(p.name for p in (root / "nvrtc").glob("*.cubin"))
    assert cubins and all(c.startswith("quant_a-sm90a-") for c in cubins), cubins
    elf = (root / "nvrtc" / cubins[0]).read_bytes()
    _publish(root / "nvrtc" / "quant_a-sm90a-000000000000000000000000.cubin", elf)  # stale: another source
    default = configured_specs("90")
    tuned = [s for s in configured_specs("90", None, BUCKETS, H100) if s not in set(default)]
    assert tuned, f"tuning/{H100}.json no longer differs from default.json: pick another table"
    shipped = {_kernel(root, default[0], elf): default[0], _kernel(root, tuned[0], elf): tuned[0]}
    incomplete = default[1]
    _kernel(root, incomplete, elf, whole=False)
    (root / "cutlass" / "index" / ("0" * 64 + ".json")).write_text(json.dumps({"directory": "gone-0123"}))
    return root, {"cubins": cubins, "kernels": shipped, "incomplete": incomplete, "first": default[0]}


def _build(out: Path, filled_root: Path, *extra: str) -> tuple[Path, str]:
    before = snapshot(filled_root), snapshot(REPO / "custom_kernels" / "prebuilt")
    proc = _run(str(REPO / "scripts" / "build_wheel.py"), "--arch", "90", "--family", "quant_a", "-j", "2",
                "--from-cache", str(filled_root), "--out", str(out), *extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert (snapshot(filled_root), snapshot(REPO / "custom_kernels" / "prebuilt")) == before  # both read only
    (wheel,) = out.glob("*.whl")
    return wheel, proc.stdout + proc.stderr


# Run with the installed wheel first on PYTHONPATH: what its runtime finds with an empty user cache.
INSTALLED = r"""
import json, logging
from custom_kernels import cache, nvrtc
from cutlass_ops.cutlass.build import lookup
from cutlass_ops.cutlass.tuning import configured_specs
records = []
logging.getLogger("custom_kernels").addHandler(type("H", (logging.Handler,), {"emit": lambda s, r: records.append(r.getMessage())})())
logging.getLogger("custom_kernels").setLevel(logging.INFO)
cubin = nvrtc.compile_file("quant_a.cu", "90a")
spec = configured_specs("90")[0]
art = lookup(spec)
print(json.dumps({"prebuilt": str(cache.prebuilt_root()), "cubin_hit": cubin.from_cache, "records": records,
                   "kernel": str(art.directory) if art else None}))
"""


def test_from_cache_ships_the_configured_whole_entries(filled, tmp_path):
    root, names = filled
    wheel, output = _build(tmp_path / "dist", root, "--cutlass")
    compiled = [line for line in output.splitlines() if line.startswith("built ") and "(cache" not in line]
    assert not compiled, compiled  # every NVRTC module came from the cache
    files = {n.removeprefix("custom_kernels/prebuilt/") for n in zipfile.ZipFile(wheel).namelist()
             if n.startswith("custom_kernels/prebuilt/") and not n.endswith("README.md")}
    expected = {f"nvrtc/{c}{s}" for c in names["cubins"] for s in ("", ".sha256")}
    expected.add("nvrtc/version.json")  # the NVRTC the cubins were built with (custom_kernels.nvrtc)
    with zipfile.ZipFile(wheel) as zf:
        record = json.loads(zf.read("custom_kernels/prebuilt/nvrtc/version.json"))
    from custom_kernels.nvrtc import nvrtc_version
    assert record["version"] == list(nvrtc_version())
    for name, spec in names["kernels"].items():
        expected |= {f"cutlass/kernels/{name}/{f}{s}" for f in ("kernel.cubin", "host.so", "meta.json")
                     for s in ("", ".sha256")}
        expected.add(f"cutlass/index/{spec.index_key()}.json")
    assert files == expected, (sorted(files - expected), sorted(expected - files))
    assert names["incomplete"].name in output and "not shipped" in output  # reported, not shipped

    # the installed wheel's runtime: shipped entries found, nothing compiled, the user cache stays empty
    site, user = tmp_path / "site", tmp_path / "user-cache"
    proc = _run("-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site), str(wheel))
    assert proc.returncode == 0, proc.stderr
    code = INSTALLED
    env = {k: v for k, v in os.environ.items() if k != cache.PREBUILT_ENV_VAR}  # the package's own prebuilt/
    env.update(PYTHONPATH=str(site), **{cache.ENV_VAR: str(user)})
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["prebuilt"] == str(site / "custom_kernels" / "prebuilt")
    assert out["cubin_hit"] and not [r for r in out["records"] if r.startswith(("built", "not in the shipped"))]
    shipped_name = next(n for n, s in names["kernels"].items() if s == names["first"])
    assert out["kernel"] == str(site / "custom_kernels" / "prebuilt" / "cutlass" / "kernels" / shipped_name)
    assert not list(user.rglob("*.cubin")) and not list((user / "cutlass" / "kernels").glob("*"))


def test_all_cached_ships_every_whole_entry_of_the_archs(filled, tmp_path):
    root, names = filled
    wheel, output = _build(tmp_path / "dist", root, "--cutlass", "--all-cached")
    shipped = {n.removeprefix("custom_kernels/prebuilt/") for n in zipfile.ZipFile(wheel).namelist()}
    assert "nvrtc/quant_a-sm90a-000000000000000000000000.cubin" in shipped  # not named by the runtime's cases
    assert {f"cutlass/kernels/{n}/host.so" for n in names["kernels"]} <= shipped
    assert not any(names["incomplete"].name in n for n in shipped) and "gone-0123" not in output


def test_from_cache_must_exist(tmp_path):
    proc = _run(str(REPO / "scripts" / "build_wheel.py"), "--from-cache", str(tmp_path / "nowhere"),
                "--out", str(tmp_path))
    assert proc.returncode == 2 and "no such directory" in proc.stderr


# ------------------------------------------------------------------------------------------------
# the C++ launch path's loader
# ------------------------------------------------------------------------------------------------

@pytest.fixture
def fresh_host_ext(monkeypatch, tmp_path):
    """host_ext as a new process sees it: nothing loaded, empty user cache and prebuilt tree."""
    monkeypatch.setattr(host_ext, "_module", None)
    monkeypatch.setattr(host_ext, "_failed", None)
    monkeypatch.setattr(host_ext, "origin", None)
    monkeypatch.setenv(cache.ENV_VAR, str(tmp_path / "user-cache"))
    monkeypatch.setenv(cache.PREBUILT_ENV_VAR, str(tmp_path / "prebuilt"))
    cache._verified.clear()
    return tmp_path / "prebuilt" / "host_ext" / host_ext.prebuilt_tag()


def _ship_fake(directory: Path, meta: dict, lib: bytes) -> None:
    _publish(directory / f"{host_ext.EXT_NAME}.so", lib)
    _publish(directory / "meta.json", json.dumps(meta).encode())


def test_prebuilt_tag_names_python_and_torch():
    import torch

    tag = host_ext.prebuilt_tag()
    assert tag == f"cp{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}"


@pytest.mark.parametrize("damage", ["other source", "flipped byte"])
def test_a_shipped_build_that_does_not_fit_is_not_used(fresh_host_ext, caplog, damage):
    meta = host_ext._meta()
    if damage == "other source":
        meta["source_sha256"] = "0" * 64
    _ship_fake(fresh_host_ext, meta, b"\x7fELF stands for the library: never imported here")
    if damage == "flipped byte":
        lib = fresh_host_ext / f"{host_ext.EXT_NAME}.so"
        lib.write_bytes(lib.read_bytes()[:-1] + b"\0")
    with caplog.at_level(logging.INFO, logger="custom_kernels"):
        assert host_ext._shipped_library() is None
    why = "built from other sources" if damage == "other source" else "does not match its sha256"
    assert any(why in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert not host_ext.describe().startswith("shipped")


NO_COMPILER = r"""
import json, logging, sys
import torch
spawned = []
sys.addaudithook(lambda event, args: spawned.append(event) if event in ("subprocess.Popen", "os.posix_spawn",
                 "os.exec", "os.system", "os.fork") else None)
records = []
logging.getLogger("custom_kernels").addHandler(type("H", (logging.Handler,), {"emit": lambda s, r: records.append(
    [r.levelname, r.getMessage()])})())
logging.getLogger("custom_kernels").setLevel(logging.INFO)
from custom_kernels import host_ext
first, second = host_ext.load(), host_ext.load()
print(json.dumps({"loaded": first is not None or second is not None, "records": records, "spawned": spawned}))
"""


def test_no_compiler_and_nothing_shipped_falls_back_quietly(tmp_path):
    """No shipped build, nothing cached, no c++ on PATH: None, one INFO line, no process started."""
    (tmp_path / "bin").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CC", cache.PREBUILT_ENV_VAR, "CUTLASS_OPS_HOST_EXT")}
    env.update(PATH=str(tmp_path / "bin"), PYTHONPATH=str(REPO), **{cache.ENV_VAR: str(tmp_path / "cache"),
                                                                    cache.PREBUILT_ENV_VAR: str(tmp_path / "none")})
    proc = subprocess.run([sys.executable, "-c", NO_COMPILER], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["loaded"] and not out["spawned"], out
    ours = [r for r in out["records"] if "launch path" in r[1]]
    assert len(ours) == 1 and ours[0][0] == "INFO" and "host C++ compiler (c++)" in ours[0][1], out["records"]


@pytest.mark.slow  # builds the extension once (about 30 s)
def test_host_ext_shipped_and_loaded_without_a_compiler(filled, tmp_path):
    """--host-ext takes the build of --from-cache's directory; the installed wheel loads it with no
    compiler on PATH and starts no process (check_wheel_gpu.py --env-only)."""
    root, _ = filled
    with_ext = tmp_path / "cache-with-ext"
    shutil.copytree(root, with_ext)
    proc = _run("-c", "from custom_kernels import host_ext; print(host_ext.build())",
                env={cache.ENV_VAR: str(with_ext), "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = Path(proc.stdout.strip().splitlines()[-1]) / f"{host_ext.EXT_NAME}.so"
    wheel, _ = _build(tmp_path / "dist", with_ext, "--host-ext")
    tag = host_ext.prebuilt_tag()
    prefix = f"custom_kernels/prebuilt/host_ext/{tag}/"
    with zipfile.ZipFile(wheel) as zf:
        names = {n.removeprefix(prefix) for n in zf.namelist() if n.startswith(prefix)}
        assert names == {f"{host_ext.EXT_NAME}.so", f"{host_ext.EXT_NAME}.so.sha256", "meta.json", "meta.json.sha256"}
        assert zf.read(prefix + f"{host_ext.EXT_NAME}.so") == built.read_bytes()  # taken from the cache, not rebuilt
        meta = json.loads(zf.read(prefix + "meta.json"))
    assert meta["tag"] == tag and meta["source_sha256"] == host_ext.source_digest()

    report = tmp_path / "check.md"
    proc = _run(str(REPO / "scripts" / "check_wheel_gpu.py"), str(wheel), "--env-only", "--out", str(report))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    text = report.read_text()
    assert f"C++ launch path ({tag}): shipped for {tag}; loaded: shipped " in text, text
    assert "**PASS**" in text and "Processes started (counted)" not in text, text
