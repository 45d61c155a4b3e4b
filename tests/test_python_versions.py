"""The wheel installs and works on the lowest and the highest Python that ``requires-python`` admits,
on a CPU machine without the CUDA toolkit.

For each of the two interpreters: the session's wheel (tests/_wheel.py, the one tests/test_wheel.py
checks) is installed with its runtime dependencies into a fresh virtual environment in a temporary
directory, with no CUDA toolkit to be found (see ``NoToolkit``); then ``import cutlass_ops``, the
``cutlass-ops info`` console script, a CPU smoke (quantize / dequantize, ``QuantLinear.from_float``
and its CPU forward, an NVRTC compile of a shipped kernel source through the pip-installed NVRTC) and
the pure-Python test files below run in that environment, from an empty directory, against the
installed package. Nothing is written into the checkout or the current directory (pip's download
cache is the user's, ``~/.cache/pip``).

The range is read from pyproject.toml, so the test follows it. An interpreter that cannot be found
skips its test with the places looked in (``CUTLASS_OPS_PYTHON_3_10`` etc. name one explicitly); once
one is found, any failure fails the test (and under CI=true, so does an interpreter of the right
version that cannot make a venv). Marked ``slow``: about 1.5 minutes per interpreter on the CPU
machines, most of it pip installing torch (PyPI's Linux torch wheels are CUDA builds: 5.4 GB a venv,
removed afterwards). ``test_pip_refuses_a_python_outside_the_range`` checks the other side of the
range: pip refuses the wheel on 3.9 and on 3.14 (each skipped where that interpreter is absent).
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from _wheel import Built, session_wheel
from _worktree import ROOT

pytestmark = pytest.mark.slow

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# torch for the fresh environments. PyPI has no CPU-only Linux torch wheel (the CPU index of the
# PyTorch project is not reachable from these machines), so this is a CUDA build, which runs on the
# CPU. 2.14.1: the newest release pip's constraints allow on these machines, whose CUDA libraries
# (cuDNN, cuBLAS, ...) lie on their disk, so each interpreter downloads only torch and triton.
TORCH_SPEC = os.environ.get("CUTLASS_OPS_PYVERSIONS_TORCH", "torch==2.14.1")
# Test tools installed beside the wheel (gguf: the GGUF importer tests' reference).
TEST_TOOLS = ("pytest>=8", "gguf>=0.10")
# Pure-Python test files run under each interpreter (no nvcc, no CUDA device, a few seconds in all).
CPU_TEST_FILES = ("test_formats.py", "test_quantizers.py", "test_reference.py", "test_nn.py",
                  "test_importers.py", "test_load_quantized.py")
TEST_HELPERS = ("conftest.py", "_quant_writers.py")
# Where a CUDA toolkit may live: hidden from every command run in the fresh environments.
TOOLKIT_GLOBS = ("/usr/local/cuda", "/usr/local/cuda-*", "/opt/cuda", "/opt/cuda-*", "/usr/lib/cuda",
                 "/opt/nvidia/hpc_sdk")
TOOLKIT_VARS = ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CUDA_TOOLKIT_ROOT_DIR", "CUDACXX", "CUDA_BIN_PATH")


# ------------------------------------------------------------------------------------------------
# the supported range and its interpreters
# ------------------------------------------------------------------------------------------------

def requires_python() -> str:
    match = re.search(r'^requires-python\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert match, "pyproject.toml has no requires-python"
    return match.group(1)


def supported_range(spec: str) -> tuple[str, str]:
    """('3.10', '3.13') for '>=3.10,<3.14' (also '<=3.13'); both bounds are required."""
    low = re.search(r">=\s*3\.(\d+)", spec)
    below = re.search(r"<\s*3\.(\d+)", spec)
    upto = re.search(r"<=\s*3\.(\d+)", spec)
    assert low and (below or upto), f"requires-python {spec!r} needs a lower and an upper bound"
    high = int(upto.group(1)) if upto else int(below.group(1)) - 1
    return f"3.{low.group(1)}", f"3.{high}"


LOWEST, HIGHEST = supported_range(requires_python())


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", Path(path).parent.parent.name)) or (0,)


def interpreter_candidates(version: str) -> list[str]:
    """Where a Python ``version`` may be, in order: $CUTLASS_OPS_PYTHON_3_X, pyenv's versions (the
    newest patch release first), the usual system places, PATH."""
    override = os.environ.get(f"CUTLASS_OPS_PYTHON_{version.replace('.', '_')}")
    if override:
        return [override]
    pyenv = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    pattern = f"{pyenv}/versions/{version}.*/bin/python{version}"
    found = sorted(glob.glob(pattern), key=_version_key, reverse=True) or [pattern]  # the pattern: "absent"
    found += [f"{d}/python{version}" for d in ("/usr/local/bin", "/usr/bin")]
    which = shutil.which(f"python{version}")
    return list(dict.fromkeys([*found, *([which] if which else [])]))


def find_interpreter(version: str) -> tuple[str | None, str, bool]:
    """(path of a Python ``version`` with venv and ensurepip, "", True) or (None, why not, whether a
    Python ``version`` without them was found)."""
    tried, present = [], False
    for cand in interpreter_candidates(version):
        if not os.access(cand, os.X_OK):
            tried.append(f"{cand} (absent)")
            continue
        proc = subprocess.run([cand, "-c", "import sys, venv, ensurepip; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=60)
        if proc.returncode == 0 and proc.stdout.strip() == version:
            return cand, "", True
        probe = subprocess.run([cand, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=60)
        present = present or probe.stdout.strip() == version
        last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        tried.append(f"{cand} ({proc.stdout.strip() if proc.returncode == 0 else last})")
    return None, f"no Python {version} with venv and ensurepip found; tried: {'; '.join(tried)}", present


def interpreter_or_skip(version: str) -> str:
    """The interpreter; skips where there is none, fails under CI=true where it is there but broken."""
    python, why, present = find_interpreter(version)
    if python is None:
        if present and IN_CI:
            pytest.fail(why)
        pytest.skip(why)
    return python


# ------------------------------------------------------------------------------------------------
# no CUDA toolkit
# ------------------------------------------------------------------------------------------------

def toolkit_roots() -> list[str]:
    """The real paths of the toolkit directories present on this machine."""
    roots = {os.path.realpath(p) for pattern in TOOLKIT_GLOBS for p in glob.glob(pattern)}
    return sorted(r for r in roots if os.path.isdir(r))


def _under(path: str, roots: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r + os.sep) for r in roots)


class NoToolkit:
    """Runs commands as on a machine without the CUDA toolkit.

    The environment loses CUDA_HOME / CUDA_PATH (and the like), every PATH entry that holds an
    ``nvcc`` or lies in a toolkit directory, every such LD_LIBRARY_PATH entry, and PYTHONPATH. Where
    a toolkit directory exists (``/usr/local/cuda-13.0`` on these machines; the project's
    ``cuda_home()`` falls back to ``/usr/local/cuda`` and cuda-pathfinder finds headers there), each
    command runs in a private mount namespace (``unshare --mount``, as root) in which every toolkit
    directory is an empty directory; nothing outside that namespace changes.
    """

    def __init__(self, scratch: Path, venv: Path):
        self.roots = toolkit_roots()
        self.venv = venv
        env = {k: v for k, v in os.environ.items()
               if k not in TOOLKIT_VARS and k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV",
                                                      "CUTLASS_OPS_PREBUILT_DIR", "CUTLASS_OPS_CACHE_DIR")}

        def keep(entry: str) -> bool:
            return bool(entry) and not _under(entry, self.roots) and not os.path.exists(os.path.join(entry, "nvcc"))

        env["PATH"] = os.pathsep.join([str(venv / "bin"), *filter(keep, os.environ.get("PATH", "").split(os.pathsep))])
        ld = [e for e in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if e and not _under(e, self.roots)]
        env.pop("LD_LIBRARY_PATH", None)
        if ld:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(ld)
        env.update(VIRTUAL_ENV=str(venv), PYTHONNOUSERSITE="1", PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
                   CUTLASS_OPS_CACHE_DIR=str(scratch / "kernel-cache"))
        self.env = env
        self.empty = scratch / "empty-toolkit"
        self.empty.mkdir()
        self.cwd = scratch / "cwd"
        self.cwd.mkdir()
        self.prefix: list[str] = []
        if self.roots:
            unshare, mount = shutil.which("unshare"), shutil.which("mount")
            if unshare and mount:
                script = ('empty=$1; n=$2; shift 2; while [ "$n" -gt 0 ]; do '
                          f'{mount} --bind "$empty" "$1" || exit 97; shift; n=$((n - 1)); done; exec "$@"')
                self.prefix = [unshare, "--mount", "--propagation", "private", "/bin/sh", "-c", script, "sh",
                               str(self.empty), str(len(self.roots)), *self.roots]
            probe = self.run(["/bin/sh", "-c", 'for d in "$@"; do [ -z "$(ls -A "$d")" ] || exit 1; done', "sh",
                              *self.roots], timeout=60) if self.prefix else None
            if probe is None or probe.returncode != 0:
                why = (f"cannot hide the CUDA toolkit at {', '.join(self.roots)}: unshare --mount / mount --bind "
                       f"{'not found' if probe is None else 'failed: ' + (probe.stderr or probe.stdout).strip()}")
                if IN_CI:
                    pytest.fail(why)
                pytest.skip(why)

    def run(self, cmd: list[str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([*self.prefix, *map(str, cmd)], cwd=cwd or self.cwd, env=self.env, capture_output=True,
                              text=True, timeout=timeout)


def _tail(proc: subprocess.CompletedProcess, n: int = 4000) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-n:]}\n--- stderr ---\n{proc.stderr[-n:]}"


# ------------------------------------------------------------------------------------------------
# what runs in the fresh environment
# ------------------------------------------------------------------------------------------------

SMOKE = r'''
import json, sys, sysconfig
from pathlib import Path

import torch

import cutlass_ops
from cutlass_ops import WeightOnlyConfig, quantize_weight
from cutlass_ops.nn import QuantLinear

out = {"python": "%d.%d" % sys.version_info[:2], "torch": torch.__version__, "cuda": torch.cuda.is_available(),
       "cutlass_ops": cutlass_ops.__file__, "purelib": sysconfig.get_paths()["purelib"]}

# quantize_weight + dequantize: every element within half a step of the weight
torch.manual_seed(0)
w = torch.randn(64, 256)
for bits, symmetric in ((4, True), (4, False), (8, True), (8, False)):
    qw = quantize_weight(w, bits=bits, block_size=128, symmetric=symmetric)
    err = (qw.dequantize() - w).abs()
    half_step = qw.scale.repeat_interleave(128, dim=1) / 2
    assert (qw.bits, qw.N, qw.K, tuple(qw.scale.shape)) == (bits, 64, 256, (64, 2)), (bits, symmetric)
    assert bool((err <= half_step * (1 + 1e-5) + 1e-7).all()), (bits, symmetric, float((err - half_step).max()))
out["round_trip_max_err_int4"] = float((quantize_weight(w, bits=4, block_size=128).dequantize() - w).abs().max())

# QuantLinear on the CPU (the float64 reference path): close to the float layer
lin = torch.nn.Linear(256, 64)
q = QuantLinear.from_float(lin, WeightOnlyConfig(bits=8, block_size=128))
x = torch.randn(3, 256)
with torch.no_grad():
    y, ref = q(x), lin(x)
assert y.shape == ref.shape == (3, 64) and y.dtype == torch.float32
rel = float((y - ref).norm() / ref.norm())
assert rel < 1e-2, rel
out["quantlinear_rel_err"] = rel

# NVRTC (nvidia-cuda-nvrtc, a dependency of the wheel) compiles a shipped kernel source
from cuda import pathfinder
from custom_kernels import compile_file, nvrtc_version
from custom_kernels.cuda_paths import cuda_include_dirs

lib = pathfinder.load_nvidia_dynamic_lib("nvrtc")
out["nvrtc_lib"], out["nvrtc_found_via"] = lib.abs_path, lib.found_via
out["nvrtc_version"] = list(nvrtc_version())
out["include_dirs"] = list(cuda_include_dirs())
cubin = compile_file("dequant_weight.cu", 80)
assert cubin.data[:4] == b"\x7fELF" and not cubin.from_cache, cubin.path
out["cubin_bytes"], out["cubin_path"] = len(cubin.data), str(cubin.path)
print("SMOKE " + json.dumps(out))
'''

ORIGIN_TEST = '''
import sysconfig
from pathlib import Path

import cutlass_ops
import custom_kernels


def test_the_installed_package_is_under_test():
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    for module in (cutlass_ops, custom_kernels):
        assert site in Path(module.__file__).resolve().parents, module.__file__
'''


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Built:
    return session_wheel(tmp_path_factory)


@pytest.fixture
def venv(tmp_path):
    """Where the fresh environment goes; removed afterwards (about 5 GB: torch and its CUDA libraries)."""
    path = tmp_path / "venv"
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("which", ["lowest", "highest"])
def test_wheel_on_python(which, built, venv, tmp_path):
    wheel = built.wheel
    version = LOWEST if which == "lowest" else HIGHEST
    python = interpreter_or_skip(version)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    proc = subprocess.run([python, "-m", "venv", str(venv)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"python{version} -m venv failed: {_tail(proc)}"
    times["venv"] = time.perf_counter() - t0
    box = NoToolkit(tmp_path, venv)
    vpy = venv / "bin" / "python"

    def step(name: str, cmd: list, timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
        t = time.perf_counter()
        proc = box.run(cmd, timeout=timeout, cwd=cwd)
        times[name] = time.perf_counter() - t
        assert proc.returncode == 0, f"[Python {version}] {name} failed ({' '.join(map(str, cmd))}): {_tail(proc)}"
        return proc

    # pip install the wheel: its runtime dependencies, nothing else (the toolkit hidden throughout)
    step("install", [vpy, "-m", "pip", "install", "-q", str(wheel), TORCH_SPEC], timeout=2400)
    step("install test tools", [vpy, "-m", "pip", "install", "-q", *TEST_TOOLS], timeout=600)
    step("pip check", [vpy, "-m", "pip", "check"], timeout=120)
    # the 'cutlass' extra resolves on this Python too (nvidia-cutlass and its dependencies have wheels for it)
    step("resolve [cutlass]", [vpy, "-m", "pip", "install", "--dry-run", "-q", f"{wheel}[cutlass]"], timeout=600)

    proc = step("import", [vpy, "-c", "import cutlass_ops, sys; print(sys.version_info[:2], cutlass_ops.__file__)"],
                timeout=300)
    assert str(venv) in proc.stdout, proc.stdout

    proc = step("cutlass-ops info", [venv / "bin" / "cutlass-ops", "info"], timeout=300)
    rows = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in proc.stdout.splitlines() if ":" in line)}
    assert rows.get("python", "").startswith(version + "."), proc.stdout
    assert rows.get("cutlass-ops") == wheel.name.split("-")[1], proc.stdout
    assert rows.get("nvcc", "").startswith("not found"), f"nvcc was found although hidden:\n{proc.stdout}"
    assert rows.get("nvidia-cutlass", "").startswith("not installed"), proc.stdout  # the extra is optional
    assert re.fullmatch(r"\d+\.\d+", rows.get("nvrtc", "")), f"NVRTC unavailable without the toolkit:\n{proc.stdout}"
    assert str(venv) in rows.get("prebuilt", ""), proc.stdout

    smoke_py = tmp_path / "smoke.py"
    smoke_py.write_text(SMOKE)
    proc = step("CPU smoke", [vpy, smoke_py], timeout=600)
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("SMOKE ")]
    smoke = json.loads(line[len("SMOKE "):])
    assert smoke["python"] == version, smoke
    assert str(venv) in smoke["cutlass_ops"], smoke
    assert str(venv) in smoke["nvrtc_lib"], f"NVRTC did not come from the venv's nvidia-cuda-nvrtc: {smoke}"
    assert not any(_under(d, box.roots) for d in smoke["include_dirs"]), smoke
    assert Path(smoke["cubin_path"]).is_relative_to(tmp_path / "kernel-cache"), smoke

    suite = tmp_path / "suite"
    (suite / "tests").mkdir(parents=True)
    # the tests of the snapshot the wheel was built from; pyproject.toml for pytest's markers and options only
    shutil.copy2(built.source / "pyproject.toml", suite / "pyproject.toml")
    for name in (*TEST_HELPERS, *CPU_TEST_FILES):
        shutil.copy2(built.source / "tests" / name, suite / "tests" / name)
    (suite / "tests" / "test_installed_package.py").write_text(ORIGIN_TEST)
    t = time.perf_counter()
    proc = box.run([vpy, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp", tmp_path / "suite-tmp", "tests"],
                   timeout=900, cwd=suite)
    times["pytest"] = time.perf_counter() - t
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, f"[Python {version}] pytest of {', '.join(CPU_TEST_FILES)} failed: {_tail(proc, 8000)}"
    assert re.search(r"\d+ passed", summary) and "failed" not in summary and "error" not in summary, summary
    times["total"] = time.perf_counter() - t0
    print(f"[Python {version}: {python}] {TORCH_SPEC}; smoke {json.dumps(smoke)}; pytest: {summary}; seconds: "
          + ", ".join(f"{k} {v:.0f}" for k, v in times.items()))


@pytest.mark.parametrize("which", ["below", "above"])
def test_pip_refuses_a_python_outside_the_range(which, built, tmp_path):
    """requires-python is in the wheel's metadata: pip refuses the wheel on the Python just outside it."""
    minor = int((LOWEST if which == "below" else HIGHEST).split(".")[1])
    version = f"3.{minor - 1 if which == 'below' else minor + 1}"
    python = interpreter_or_skip(version)
    venv = tmp_path / "venv"
    proc = subprocess.run([python, "-m", "venv", str(venv)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"python{version} -m venv failed: {_tail(proc)}"
    proc = subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "--dry-run", "--no-deps", built.wheel],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert proc.returncode != 0 and "requires a different Python" in proc.stdout + proc.stderr, _tail(proc)
