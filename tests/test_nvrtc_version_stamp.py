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
