"""The README's two commands leave nothing behind: scripts/setup.sh (which both run first) writes
nothing into the caller's directory or the checkout, however often it runs, and scripts/test.sh
writes nothing into the caller's directory (it runs pytest from the checkout).

It runs the scripts of a copy of the working tree, committed in a scratch git repository, from an
empty scratch directory, reusing this test's own virtual environment (CUTLASS_OPS_VENV), so nothing
is installed: the copy's pyproject.toml is dated back so that setup.sh's "pyproject changed" rule
does not reinstall (which would point the shared editable install at the copy).
"""
from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _worktree import copy_worktree

VENV = Path(sys.prefix)
# Ignored paths a run may leave in the checkout: byte code and pytest's cache (both gitignored).
EXPECTED_IGNORED = ("__pycache__/", ".pytest_cache/", ".venv/")


def _installed() -> bool:
    try:
        importlib.metadata.version("cutlass-ops")
        importlib.metadata.version("nvidia-cutlass")
        importlib.metadata.version("pytest")
    except importlib.metadata.PackageNotFoundError:
        return False
    return (VENV / ".cutlass_ops_installed").exists()


pytestmark = pytest.mark.skipif(
    sys.prefix == sys.base_prefix or not (VENV / "bin" / "python").exists() or not _installed(),
    reason="needs to run inside the project's set-up virtual environment (scripts/setup.sh)")


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUTLASS_OPS_VENV=str(VENV))
    env.pop("PYTHONPATH", None)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _leftovers(clone: Path) -> list[str]:
    status = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=clone, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    return [line for line in status if not (line.startswith("!! ") and line[3:].endswith(EXPECTED_IGNORED))]


@pytest.fixture
def clone(tmp_path) -> Path:
    clone = copy_worktree(tmp_path / "clone", commit=True)
    os.utime(clone / "pyproject.toml", (0, 0))  # not newer than the venv's install marker: no reinstall
    return clone


def test_setup_twice_writes_nothing(clone, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    for run in (1, 2):
        proc = _run(["bash", str(clone / "scripts" / "setup.sh")], scratch)
        assert proc.returncode == 0, f"setup.sh run {run} failed:\n{proc.stdout}{proc.stderr}"
        assert "[setup]" not in proc.stderr, f"setup.sh run {run} (re)installed into the shared venv:\n{proc.stderr}"
        assert sorted(os.listdir(scratch)) == [], f"setup.sh run {run} wrote into the caller's directory"
    assert _leftovers(clone) == [], "setup.sh wrote into the checkout"


def test_test_sh_writes_nothing_into_cwd(clone, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = _run(["bash", str(clone / "scripts" / "test.sh"), "--collect-only", "-q", "tests/test_formats.py"],
                scratch)
    assert proc.returncode == 0, f"test.sh failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    assert sorted(os.listdir(scratch)) == [], "test.sh wrote into the caller's directory"
    assert _leftovers(clone) == [], "test.sh left unexpected files in the checkout"
