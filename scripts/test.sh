#!/usr/bin/env bash
# The test suite: set up .venv if needed, then pytest (GPU tests skip cleanly without a GPU).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec "${CUTLASS_OPS_VENV:-$ROOT/.venv}/bin/python" -m pytest -q "$@"
