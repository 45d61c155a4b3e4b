"""The project's wheel, built once per pytest session (not a test module).

Built the way ``pip wheel`` builds it for a user (``--no-deps --no-build-isolation``: the backend is
this environment's setuptools), from a copy of the working tree, so the build writes nothing
(build/, *.egg-info) into the checkout. tests/test_wheel.py checks its contents and
tests/test_python_versions.py installs it into fresh virtual environments.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from _worktree import copy_worktree


class Built(NamedTuple):
    wheel: Path  # the .whl
    source: Path  # the copy of the working tree it was built from (tests compare against this snapshot,
    #               not the live checkout, which may change while the session runs)


_BUILT: dict[Path, Built] = {}  # session base temp -> the wheel built in this session


def build_wheel(tmp: Path) -> Built:
    """Build the wheel from a copy of the working tree under ``tmp``."""
    src = copy_worktree(tmp / "src")
    out = tmp / "wheel"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out)], cwd=tmp, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    (wheel,) = out.glob("*.whl")
    return Built(wheel, src)


def session_wheel(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The session's wheel: built on first use, shared by every test module that asks for it."""
    base = tmp_path_factory.getbasetemp()
    if base not in _BUILT:
        _BUILT[base] = build_wheel(tmp_path_factory.mktemp("wheel-build"))
    return _BUILT[base]
