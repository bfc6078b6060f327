"""Choose the update implementation for a bucket of tensors: compiled fused kernels or multi-tensor ops."""

from __future__ import annotations

import os
from types import ModuleType

import torch

from . import _foreach, _fused


def check_fused_flag(owner: str, fused: bool | None, device: torch.device | None) -> None:
    """fused=True is a request the optimizer must be able to honour: fail at construction if it cannot."""
    if fused not in (None, True, False):
        raise ValueError(f"{owner}: invalid fused={fused!r}: must be None (auto), True or False")
    if fused and device is not None and not _fused.available(device):
        raise ValueError(
            f"{owner}: fused=True needs torch.compile with a C++ compiler (CPU) or Triton (CUDA) for "
            f"{device.type} tensors; pass fused=None (auto) or fused=False"
        )


# MARS_OPTIM_FUSED=0 makes the multi-tensor path the default (fused=None): for short runs where
# compiling or loading the kernels (seconds per process) costs more than they save. fused=True still
# compiles.
DEFAULT_ENV = "MARS_OPTIM_FUSED"


def select(fused: bool | None, *tensor_lists: list[torch.Tensor]) -> ModuleType:
    """fused None (auto): compiled kernels where available (unless MARS_OPTIM_FUSED=0), else
    multi-tensor; False: multi-tensor.
    Non-contiguous tensors (they cannot be flattened in place) always take the multi-tensor path, and
    so does everything inside an outer torch.compile (of a whole training step): the outer compiler
    traces the multi-tensor ops and fuses them itself, whatever `fused` says."""
    if fused is False or torch.compiler.is_compiling():
        return _foreach
    if fused is None and os.environ.get(DEFAULT_ENV, "auto") == "0":
        return _foreach
    first = tensor_lists[0][0]
    if not _fused.available(first.device):
        return _foreach
    if not all(t.is_contiguous() for tensors in tensor_lists for t in tensors):
        return _foreach
    return _fused


def first_device(params) -> torch.device | None:
    for group in params:
        for p in group["params"]:
            return p.device
    return None
