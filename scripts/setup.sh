#!/usr/bin/env bash
# Create (once) a virtual environment in .venv and install cutlass_ops with its test extras.
# Reuses packages already installed system-wide (e.g. a CUDA build of torch on a GPU machine).
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
if ! "$VENV/bin/python" -c "import cutlass_ops, cutlass_cppgen, pytest" >/dev/null 2>&1 \
   || [ "$ROOT/pyproject.toml" -nt "$VENV/.cutlass_ops_installed" ]; then
  echo "[setup] installing cutlass_ops and its dependencies" >&2
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test]"
  touch "$VENV/.cutlass_ops_installed"
fi
