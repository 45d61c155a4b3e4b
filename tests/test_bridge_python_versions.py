"""The bridge survives an NVRTC compile made before it is imported (seen on Python 3.12 only).

``b" " * 1`` is CPython's one shared ``b" "``; a C call that fills it as an output buffer (an empty
NVRTC log is one byte, "\\0") zeroes every ``b" "`` in the process. Python >= 3.12 compiles
f-string literal parts through that object, so a ``cutlass_cppgen`` compiled afterwards built its
alignment keys as "16168" instead of "16 16 8" and every emission failed with an IndexError.
Each test runs in a fresh interpreter that compiles the interface from source (an empty
``sys.pycache_prefix``), as a ``pip install --no-compile`` or a bytecode-less run does.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PRELUDE = """
import sys
import torch  # imported first, as in every real run (and not recompiled below)
sys.pycache_prefix = {prefix!r}  # nothing cached there: later imports compile from source
from custom_kernels.nvrtc import compile_source
SHARED_SPACE = bytes(range(256))[32:33]  # a 1-byte slice is CPython's shared b" "
compile_source('extern "C" __global__ void k() {{}}', 80, use_cache=False)  # empty log
"""


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    code = PRELUDE.format(prefix=str(tmp_path / "pycache")) + body
    env = {**os.environ, "CUTLASS_OPS_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)


def test_bridge_import_restores_the_shared_space_bytes(tmp_path):
    result = _run(tmp_path, (
        "import cutlass_ops.cutlass.bridge\n"
        "assert SHARED_SPACE[0] == 32, SHARED_SPACE\n"
        "ns = {}\n"
        "exec(compile('key = f\"{16} {16} {8}\"', 'probe', 'exec'), ns)\n"
        "assert ns['key'] == '16 16 8', ns['key']\n"
    ))
    assert result.returncode == 0, result.stderr


def test_emission_after_an_nvrtc_compile(tmp_path):
    result = _run(tmp_path, (
        "from cutlass_ops.cutlass.emit import emit\n"
        "from cutlass_ops.cutlass.spec import GemmKernelSpec\n"
        "for kernel_cc, target in ((80, '90'), (90, '90a')):\n"
        "    emitted = emit(GemmKernelSpec(kernel_cc=kernel_cc, target_arch=target, epilogue='dequant',\n"
        "                                  element_D='f16'))\n"
        "    assert emitted.kernel_name.startswith('cutlass'), emitted.kernel_name\n"
        "    assert emitted.spec.alignment_A == emitted.operation.A.alignment == 16\n"
    ))
    assert result.returncode == 0, result.stderr
