#!/usr/bin/env bash
# Create (once) a virtual environment in .venv and install cutlass_ops with its test extras.
# Reuses packages already installed system-wide (e.g. a CUDA build of torch on a GPU machine).
# Writes nothing outside the venv: the readiness check below asks for the installed distributions
# (importlib.metadata) instead of importing cutlass_cppgen, whose import creates its sqlite cache
# (compiled_cache.db) in the current directory.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CUTLASS_OPS_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV" >&2
  "$PY" -m venv --system-site-packages "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  # No torch anywhere: take the pinned release (a CPU build where the platform offers one).
  echo "[setup] installing ${TORCH_SPEC:-torch==2.13.0}" >&2
  "$VENV/bin/python" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
fi
ready() {
  # -I: isolated mode, so the caller's cwd is not on sys.path (a stray cutlass_ops/ there must not count).
  "$VENV/bin/python" -I -c "
import importlib.metadata as md, sys
try:
    for dist in ('cutlass-ops', 'nvidia-cutlass', 'pytest'):
        md.version(dist)
except md.PackageNotFoundError:
    sys.exit(1)
" >/dev/null 2>&1
}
if ! ready || [ "$ROOT/pyproject.toml" -nt "$VENV/.cutlass_ops_installed" ]; then
  echo "[setup] installing cutlass_ops and its dependencies" >&2
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test]"
  touch "$VENV/.cutlass_ops_installed"
fi
