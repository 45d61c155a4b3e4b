"""A wheel of the project carries every non-Python file the runtime reads.

The expected list is the source tree's own .cu / .cuh / .cpp / .h / .json files under the three
packages, globbed at test time, so the test stays true when files are added, split or moved (a
wheel without custom_kernels/host/*.cpp silently loses the C++ launch path). The wheel is built once per
session (tests/_wheel.py, shared with tests/test_python_versions.py) from a copy of the working tree,
so the build writes nothing (build/, *.egg-info) into the checkout.
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from _wheel import Built, session_wheel

PACKAGES = ("custom_kernels", "cutlass_ops", "epilogues")
SUFFIXES = (".cu", ".cuh", ".cpp", ".h", ".json")


def runtime_files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for pkg in PACKAGES for p in (root / pkg).rglob("*")
            if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts}


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Built:
    return session_wheel(tmp_path_factory)


def test_wheel_contains_every_runtime_file(built):
    wheel = built.wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = runtime_files(built.source)
    assert any(f.endswith(".cpp") for f in expected), "the source tree has no .cpp file: the glob is wrong"
    missing = sorted(expected - names)
    assert not missing, f"{len(missing)} runtime files missing from {wheel.name}: {missing}"


def _metadata(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        (path,) = [n for n in z.namelist() if n.endswith(f".dist-info/{name}") and n.count("/") == 1]
        return z.read(path).decode()


def test_wheel_metadata_and_layout(built):
    """The wheel's metadata says what pyproject.toml says (Requires-Python, dependencies, extras, the
    console script), it is pure Python for any platform, and it holds the three packages' modules
    and nothing else: no tests, scripts, byte code or compiled kernels (a plain build ships none)."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    project = tomllib.loads((built.source / "pyproject.toml").read_text())["project"]
    wheel = built.wheel
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    assert {n.split("/")[0] for n in names} == {*PACKAGES, dist_info}, sorted({n.split("/")[0] for n in names})

    modules = {p.relative_to(built.source).as_posix() for pkg in PACKAGES for p in (built.source / pkg).rglob("*.py")
               if "__pycache__" not in p.parts}
    shipped = {n for n in names if n.endswith(".py")}
    assert modules == shipped, (f"missing: {sorted(modules - shipped)}; not in the source tree: "
                                f"{sorted(shipped - modules)}")
    stray = [n for n in names if "__pycache__/" in n or n.endswith((".pyc", ".so", ".cubin", ".o"))]
    assert not stray, stray
    assert [n for n in names if "/prebuilt/" in n] == ["custom_kernels/prebuilt/README.md"]

    wheel_meta = _metadata(wheel, "WHEEL")
    assert "Root-Is-Purelib: true" in wheel_meta and "Tag: py3-none-any" in wheel_meta, wheel_meta
    meta = _metadata(wheel, "METADATA")
    fields = [line.split(": ", 1) for line in meta.split("\n\n", 1)[0].splitlines() if ": " in line]
    requires_python = [v for k, v in fields if k == "Requires-Python"]
    assert [SpecifierSet(v) for v in requires_python] == [SpecifierSet(project["requires-python"])], requires_python

    def key(req: Requirement) -> tuple:
        return req.name.lower(), str(req.specifier), sorted(req.extras), str(req.marker or "")

    runtime = sorted(key(Requirement(v)) for k, v in fields if k == "Requires-Dist" and "extra ==" not in v)
    assert runtime == sorted(key(Requirement(r)) for r in project["dependencies"]), runtime
    extras = {v for k, v in fields if k == "Provides-Extra"}
    assert extras == set(project["optional-dependencies"]), extras
    scripts = _metadata(wheel, "entry_points.txt")
    for name, target in project["scripts"].items():
        assert f"{name} = {target}" in scripts, scripts
