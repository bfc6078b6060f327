#!/usr/bin/env bash
# One command for a CUDA machine: the CUDA tests, the benchmarks and the environment, in one report.
#
#   bash scripts/gpu_check.sh [OUT_DIR] [--dry-run] [--budget S] [--only PARTS] ...   (make gpu-check)
#
# OUT_DIR: the first argument, else $OUT, else ./gpu_check (gpu_check.json, gpu_check.md, logs/).
# Without CUDA it prints one line and exits 0; --dry-run (or GPU_CHECK_DRY_RUN=1) runs every part on
# the CPU with tiny sizes. Installs nothing. The logic, the parts and the JSON schema are in
# scripts/gpu_check.py (its docstring); PYTHON picks the interpreter (default python3).
set -euo pipefail

PYTHON="${PYTHON:-python3}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "gpu_check: no Python interpreter '$PYTHON' on PATH (set PYTHON=/path/to/python)" >&2
    exit 2
fi
exec "$PYTHON" "$(dirname "${BASH_SOURCE[0]}")/gpu_check.py" "$@"
