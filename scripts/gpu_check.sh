#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py, docs/gpu_check.md) with the interpreter in $PYTHON (default python3).
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/gpu_check.py" "$@"
