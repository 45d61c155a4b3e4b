"""NVRTC's version is remembered in the cache: a process whose cubins are cached never loads NVRTC."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys
from custom_kernels import nvrtc
version = nvrtc.nvrtc_version()
print(json.dumps({"version": list(version), "loaded": "cuda.bindings.nvrtc" in sys.modules}))
"""


def _probe(cache: Path) -> dict:
    env = {**os.environ, "CUTLASS_OPS_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_version_is_asked_once_then_read_from_the_stamp(tmp_path):
    first = _probe(tmp_path)
    assert first["loaded"], "no stamp yet: NVRTC itself answers"
    stamp = tmp_path / "nvrtc" / "version.json"
    record = json.loads(stamp.read_text())
    assert record["version"] == first["version"] and Path(record["library"]).is_file()
    second = _probe(tmp_path)
    assert second == {"version": first["version"], "loaded": False}


def test_a_stale_stamp_is_not_trusted(tmp_path):
    _probe(tmp_path)
    stamp = tmp_path / "nvrtc" / "version.json"
    record = json.loads(stamp.read_text())
    record["stat"][0] += 1  # the library changed since (another size)
    record["version"] = [1, 0]
    stamp.write_text(json.dumps(record))
    again = _probe(tmp_path)
    assert again["loaded"] and again["version"] != [1, 0]
    assert json.loads(stamp.read_text())["version"] == again["version"]  # rewritten


PROBE_SHIPPED = """
import json, sys
from custom_kernels import nvrtc
print(json.dumps({"version": list(nvrtc.nvrtc_version()), "loaded": "cuda.bindings.nvrtc" in sys.modules}))
"""


def _probe_with(cache: Path, prebuilt: Path) -> dict:
    env = {**os.environ, "CUTLASS_OPS_CACHE_DIR": str(cache), "CUTLASS_OPS_PREBUILT_DIR": str(prebuilt),
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE_SHIPPED], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_wheels_record_keys_a_fresh_cache_without_loading_nvrtc(tmp_path):
    """build_wheel.py records the NVRTC (and its pip distribution) the shipped cubins were built with; a fresh
    user cache trusts it while that distribution is installed at the same version."""
    from custom_kernels.nvrtc import shipped_version_record

    record = shipped_version_record()
    if record["distribution"] is None:
        import pytest
        pytest.skip("NVRTC here comes from a toolkit, not a pip distribution")
    prebuilt = tmp_path / "prebuilt"
    (prebuilt / "nvrtc").mkdir(parents=True)
    (prebuilt / "nvrtc" / "version.json").write_text(json.dumps(record))
    assert _probe_with(tmp_path / "cache1", prebuilt) == {"version": record["version"], "loaded": False}
    other = {**record, "distribution": {**record["distribution"], "version": "0.0.0"}}  # not what is installed
    (prebuilt / "nvrtc" / "version.json").write_text(json.dumps(other))
    assert _probe_with(tmp_path / "cache2", prebuilt)["loaded"]
