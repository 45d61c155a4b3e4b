"""A wheel of the project carries every non-Python file the runtime reads.

The expected list is the source tree's own .cu / .cuh / .cpp / .h / .json files under the three
packages, globbed at test time, so the test stays true when files are added, split or moved (a
wheel without custom_kernels/host/*.cpp silently loses the C++ launch path). The wheel is built from
a copy of the working tree, so the build writes nothing (build/, *.egg-info) into the checkout.
"""
from __future__ import annotations

import subprocess
import sys
import zipfile

from _worktree import ROOT, copy_worktree

PACKAGES = ("custom_kernels", "cutlass_ops", "epilogues")
SUFFIXES = (".cu", ".cuh", ".cpp", ".h", ".json")


def runtime_files() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for pkg in PACKAGES for p in (ROOT / pkg).rglob("*")
            if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts}


def test_wheel_contains_every_runtime_file(tmp_path):
    src = copy_worktree(tmp_path / "src")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp_path / "wheel")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = runtime_files()
    assert any(f.endswith(".cpp") for f in expected), "the source tree has no .cpp file: the glob is wrong"
    missing = sorted(expected - names)
    assert not missing, f"{len(missing)} runtime files missing from {wheel.name}: {missing}"
