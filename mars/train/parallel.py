"""Data parallelism, in one place: DDP (replicated model) or FSDP2 (sharded model), chosen by train.parallel.

    ddp   every rank holds the whole model, gradients and optimizer state; gradients are all-reduced.
    fsdp  torch.distributed.fsdp.fully_shard on a device mesh: each transformer block, then the root
          (embeddings, final norm, the head), is sharded along dim 0 over the ranks; a block's
          weights are all-gathered for its forward/backward and its gradients reduce-scattered, so
          each rank keeps 1/W of the weights, gradients and optimizer state. train.fsdp_replicate=R
          makes the mesh 2-D (HSDP: R replicas x W/R shards; shards within a node, replicas across).
          On CUDA, MixedPrecisionPolicy computes in bfloat16 while the master weights and the
          gradient reduction stay float32.

The model is built on the meta device, parallelised, materialised and initialised from a seeded
generator (the model's init_weights), so the weights are the same whatever the layout.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn


def device_mesh(world_size: int, replicate: int, device_type: str):
    """A 1-D mesh ("shard",) or, with replicate > 1, a 2-D mesh ("replicate", "shard")."""
    from torch.distributed.device_mesh import init_device_mesh

    if replicate == 1:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))
    return init_device_mesh(
        device_type, (replicate, world_size // replicate), mesh_dim_names=("replicate", "shard")
    )


def parallelize(model: nn.Module, mesh, *, mixed_precision: bool, compile_blocks: bool = False) -> nn.Module:
    """Shard `model` (still on the meta device) with FSDP2: each of its architecture's blocks
    (mars.model.spec), then the root, in place."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if mixed_precision
        else MixedPrecisionPolicy()
    )
    from mars.model.spec import spec_of

    blocks = spec_of(model).blocks(model)
    for i, block in enumerate(blocks):
        if compile_blocks:
            block.compile()
        # the last block's weights are needed again at the start of backward: keep them gathered
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=i < len(blocks) - 1)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def fsdp_sharder(
    mesh, *, mixed_precision: bool, compile_blocks: bool = False
) -> Callable[[nn.Module], nn.Module]:
    """`parallelize` on `mesh` with these settings, as the function build_model applies to the model on
    the meta device."""
    return partial(parallelize, mesh=mesh, mixed_precision=mixed_precision, compile_blocks=compile_blocks)


def replicate(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` under DDP over the process group's ranks (each holds all of it; gradients all-reduced)."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
