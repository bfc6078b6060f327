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


def compiles(setting: bool | None, device_type: str) -> bool:
    """train.compile: true or false as set (true where torch.compile cannot build code is refused by the
    config's check, mars.train.config); None (auto): on CUDA when Triton can build kernels, else eager
    with one warning, and off on the CPU (compiling costs more than a CPU run wins back). In auto mode
    a compilation that fails on the GPU falls back to eager (torch._dynamo's suppress_errors)."""
    import logging

    from mars.device import compiler_missing

    if setting is not None:
        return setting
    if device_type != "cuda":
        return False
    missing = compiler_missing(device_type)
    if missing:
        logging.getLogger(__name__).warning(f"train.compile: {missing}; training without torch.compile")
        return False
    import torch._dynamo

    torch._dynamo.config.suppress_errors = True
    return True


def compile_blocks(model: nn.Module) -> None:
    """Compile each transformer block's forward in place (fullgraph): the blocks of one architecture share
    one compilation whatever the depth (a block's per-layer values are buffers, inputs to the graph),
    their parameter names stay as they are, and the hooks of FSDP2 (all-gather, reduce-scatter) and DDP
    run outside the compiled code, as torchtitan compiles each block. The embedding, final norm, head
    and loss run eagerly."""
    from mars.model.spec import spec_of

    for block in spec_of(model).blocks(model):
        block.forward = torch.compile(block.forward, fullgraph=True)


def parallelize(model: nn.Module, mesh, *, mixed_precision: bool) -> nn.Module:
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
        # the last block's weights are needed again at the start of backward: keep them gathered
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=i < len(blocks) - 1)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def fsdp_sharder(mesh, *, mixed_precision: bool) -> Callable[[nn.Module], nn.Module]:
    """`parallelize` on `mesh` with these settings, as the function build_model applies to the model on
    the meta device."""
    return partial(parallelize, mesh=mesh, mixed_precision=mixed_precision)


def replicate(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` under DDP over the process group's ranks (each holds all of it; gradients all-reduced)."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
