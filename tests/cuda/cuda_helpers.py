"""Shared by the CUDA tests (tests/cuda): the `cuda` marker and its skip, and measured values for the
report of scripts/gpu_check.py. Imports only the standard library, pytest and torch.

The tests run on MARS_TEST_DEVICE (default "cuda"); they skip when that is a CUDA device and none is
visible. MARS_TEST_DEVICE=cpu runs them on the CPU, which checks the tests themselves (slowly, and the
CUDA-only assertions are left out) on a machine without a GPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
DEVICE = os.environ.get("MARS_TEST_DEVICE", "cuda")
ON_CUDA = DEVICE.startswith("cuda")

requires_cuda = [
    pytest.mark.cuda,
    pytest.mark.skipif(ON_CUDA and not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def record(section: str, **values) -> None:
    """Append one row of measured values to $GPU_CHECK_FACTS (JSON lines); a no-op when it is unset."""
    path = os.environ.get("GPU_CHECK_FACTS")
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0].split("::")[-1]
    row = {"section": section, "test": test, **values}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, default=str) + "\n")


def data_root() -> Path:
    """Where the embedded corpus is prepared: $GPU_CHECK_DATA_ROOT, else the repository's data/."""
    return Path(os.environ.get("GPU_CHECK_DATA_ROOT") or REPO / "data")


def sync() -> None:
    if ON_CUDA:
        torch.cuda.synchronize()
