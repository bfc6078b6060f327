"""Shared by the CUDA tests (tests/cuda): the device they run on, where the corpus is prepared, and
two public-API checks of the optimizers' compiled kernels. Imports only the standard library, pytest
and torch.

The tests run on MARS_TEST_DEVICE (default "cuda"; conftest.py skips every `cuda` test when that is a
CUDA device and none is visible). MARS_TEST_DEVICE=cpu runs them on the CPU, which checks the tests
themselves (slowly; the CUDA-only assertions are left out) on a machine without a GPU. Measured values
go to pytest's `record_property` (the JUnit XML that scripts/gpu_check.py reads).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

REPO = Path(__file__).resolve().parents[2]
DEVICE = os.environ.get("MARS_TEST_DEVICE", "cuda")
ON_CUDA = DEVICE.startswith("cuda")


def data_root() -> Path:
    """Where the embedded corpus is prepared: $GPU_CHECK_DATA_ROOT, else the repository's data/."""
    return Path(os.environ.get("GPU_CHECK_DATA_ROOT") or REPO / "data")


def sync() -> None:
    if ON_CUDA:
        torch.cuda.synchronize()


def profiled(fn):
    """fn() under torch.profiler: (its result, compiled regions entered, Triton kernels launched).
    Compiled code shows up as "Torch-Compiled Region" events on every device, Triton kernels (named
    triton_*) on CUDA: what the fused optimizers run, whatever their modules are called."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ON_CUDA else [])
    with profile(activities=activities) as prof:
        result = fn()
    names = [e.name for e in prof.events()]
    regions = sum(n.startswith("Torch-Compiled Region") for n in names)
    return result, regions, sum(n.startswith("triton_") for n in names)


def fused_fallbacks(recwarn) -> list[str]:
    """The warnings an optimizer gives when its compiled kernels fail and it falls back to the
    multi-tensor path (a RuntimeWarning naming the fused kernels), from pytest's `recwarn`."""
    return [
        str(w.message)
        for w in recwarn
        if issubclass(w.category, RuntimeWarning) and "fused" in str(w.message).lower()
    ]
