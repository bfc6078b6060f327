"""torch.compile of the model: one compilation per distinct block code, whatever the depth, in both
layouts (mars.train.parallel.compile_blocks: each block's forward compiled in place, FSDP2's and DDP's
hooks outside it). Counted with torch._dynamo's own counters; the graphs are traced with the "eager"
backend (what is counted is Dynamo's tracing, which does not depend on the backend; Inductor would only
make the test slow)."""

from __future__ import annotations

import functools

import pytest
from dist_helpers import run_ranks

# the module's counts (16 models on a gloo rank, ~18 s) are made once: its tests share one xdist worker
# (make test runs the suite with --dist loadgroup)
pytestmark = pytest.mark.xdist_group("compile_counts")
SIZES = {"n_embd": 32, "block_size": 16, "vocab_size": 128}
MODELS = {
    "gpt2": {"arch": "gpt2", "n_head": 2, **SIZES},
    "llama": {"arch": "llama", "n_head": 4, "n_kv_head": 2, **SIZES},
}


def _graphs(arch: str, n_layer: int, parallel: str) -> dict:
    """Build the model as the trainer does, compile its blocks, run forward and backward twice (train) and
    once under no_grad in eval mode (validation); Dynamo's counts."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    from mars.model.spec import model_config
    from mars.train.parallel import compile_blocks, device_mesh, fsdp_sharder
    from mars.train.trainer import build_model

    torch._dynamo.reset()
    counters.clear()
    cfg = model_config({**MODELS[arch], "n_layer": n_layer})
    shard = fsdp_sharder(device_mesh(1, 1, "cpu"), mixed_precision=False) if parallel == "fsdp" else None
    model = build_model(cfg, torch.device("cpu"), seed=0, shard=shard)
    real = torch.compile
    torch.compile = functools.partial(real, backend="eager")
    try:
        compile_blocks(model)
    finally:
        torch.compile = real
    x = torch.randint(0, 128, (2, 16))
    for _ in range(2):
        _, loss = model(x, x)
        loss.backward()
    model.eval()
    with torch.no_grad():
        model(x, x)
    return {
        "graphs": counters["stats"]["unique_graphs"],
        "frames": counters["frames"]["total"],
        "breaks": sum(counters["graph_break"].values()),
        "recompile_limit": sum(counters["frames"].get(k, 0) for k in ("recompile_limit",)),
    }


def _count_all(rank: int, world: int) -> dict:
    return {
        (arch, n, parallel): _graphs(arch, n, parallel)
        for parallel in ("ddp", "fsdp")
        for arch, n in (("gpt2", 12), ("gpt2", 48), ("llama", 12), ("llama", 48))
    }


@pytest.fixture(scope="module")
def counts():
    return run_ranks(1, _count_all)  # one gloo rank: FSDP2 needs a process group


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_one_compilation_per_block_code_at_any_depth(counts, arch, parallel):
    shallow, deep = counts[(arch, 12, parallel)], counts[(arch, 48, parallel)]
    # training and evaluation (no_grad, eval mode) are two graphs of the one block code, at any depth
    assert shallow["graphs"] == deep["graphs"] == 2, (shallow, deep)
    assert shallow["breaks"] == deep["breaks"] == 0
    assert deep["frames"] == shallow["frames"]  # nothing recompiles with depth (GPT-2's per-layer scale)
