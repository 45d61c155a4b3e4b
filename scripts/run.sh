#!/usr/bin/env bash
# The main job, from a fresh clone: set up .venv, then run scripts/main.py
# (GPU present: GPU suite + benchmarks; no GPU: emit + compile every kernel, run the references).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
exec "${CUTLASS_OPS_VENV:-$ROOT/.venv}/bin/python" "$ROOT/scripts/main.py" "$@"
