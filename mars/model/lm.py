"""What every architecture's model class shares (GPT, Llama): building on the meta device, the seeded
initialisation of one tensor, the length check and the token loss; and the model inside DDP and
torch.compile wrappers, and whole tensors copied into DTensor shards.

An architecture's nn.Module subclasses CausalLM, defines __init__(config), tie_weights() and
init_weights(generator), and gets `empty` (allocation without initialisation, with a hook for FSDP2
sharding on the meta device); `materialised` is where a model recomputes what is not a parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalLM(nn.Module):
    config: Any

    @classmethod
    def empty(
        cls,
        config: Any,
        device: str | torch.device,
        dtype: torch.dtype | None = None,
        on_meta: Callable[[nn.Module], Any] | None = None,
    ):
        """The model with its weights allocated on ``device`` (in ``dtype``) but not set: built on the
        meta device, so nothing is initialised only to be overwritten by loaded weights or
        ``init_weights``. ``on_meta(model)`` runs before the allocation (e.g. FSDP2 sharding)."""
        with torch.device("meta"):
            model = cls(config)
        if on_meta is not None:
            on_meta(model)
        if dtype is not None:
            model.to(dtype=dtype)
        model.to_empty(device=device)
        model.materialised()
        return model

    def materialised(self) -> None:
        """After ``to_empty``: tie the weights again (and recompute anything that is not a parameter)."""
        self.tie_weights()

    def check_length(self, idx: torch.Tensor) -> None:
        T = idx.shape[1]
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size={self.config.block_size}")


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the tokens, targets of -1 ignored; computed in float32 (float64 for a
    float64 model)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)


def normal_(param: torch.Tensor, std: float, generator: torch.Generator | None) -> None:
    """param <- N(0, std), drawn for the whole tensor even when param is a shard of it."""
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        local = param.to_local()
        full = torch.empty(param.shape, dtype=local.dtype, device=local.device)
        copy_full_(param, full.normal_(0.0, std, generator=generator))
    else:
        param.normal_(0.0, std, generator=generator)


def copy_full_(dest: torch.Tensor, full: torch.Tensor) -> None:
    """dest <- full, where dest may be a DTensor (then only this rank's shard is copied)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(dest, DTensor):
        piece = distribute_tensor(
            full.to(dest.dtype), dest.device_mesh, dest.placements, src_data_rank=None
        ).to_local()
        dest.to_local().copy_(piece)
    else:
        dest.data.copy_(full)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside DistributedDataParallel and/or torch.compile wrappers (FSDP2 wraps in place)."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model
