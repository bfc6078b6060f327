"""Newton-Schulz divided over ranks and whole-tensor norms of sharded tensors (mars/optim/_dist.py),
against the single-process computation. `check_on_ranks` runs inside the ranks that
tests/optim/test_sharded.py spawns (2 and 4 gloo processes), so no extra spawn is paid for it."""

from __future__ import annotations

import torch

from mars.optim import _dist
from mars.optim.newton_schulz import orthogonalize_

SHAPES = [(5, 3), (3, 7), (8, 8), (1, 4), (50, 16), (8, 8), (2, 9)]


def ns(batch):
    return orthogonalize_(batch.clone(), steps=5, eps=1e-7, form="moonlight")


def matrices():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(r, c, generator=g).to(torch.bfloat16) for r, c in SHAPES]


def test_shard_rows_follow_dtensor_chunking():
    assert _dist.shard_rows(3, 4) == [1, 1, 1, 0]
    assert _dist.shard_rows(5, 4) == [2, 2, 1, 0]
    assert _dist.shard_rows(7, 4) == [2, 2, 2, 1]
    assert _dist.shard_rows(50304, 4) == [12576] * 4
    assert _dist.shard_rows(1, 2) == [1, 0]


def test_owners_balance_the_newton_schulz_work():
    shapes = [(2304, 768), (768, 768), (3072, 768), (768, 3072)] * 12  # GPT-2 small's blocks
    owners = _dist.assign_owners(shapes, 4)
    load = [sum(_dist.ns_cost(*s) for s, o in zip(shapes, owners, strict=True) if o == r) for r in range(4)]
    assert max(load) / min(load) < 1.05
    assert owners == _dist.assign_owners(shapes, 4)  # deterministic: every rank agrees


def check_on_ranks(rank, world):
    """Sharded and replicated Newton-Schulz and whole-tensor norms equal one process, bit for bit."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mats = matrices()
    want = _dist._orthogonalize_batched(mats, ns)
    mesh = init_device_mesh("cpu", (world,))
    pieces = [distribute_tensor(m, mesh, [Shard(0)], src_data_rank=None) for m in mats]
    sharding = _dist.sharding_of(pieces)
    got = _dist.orthogonalize_sharded([p.to_local() for p in pieces], list(SHAPES), sharding, ns)
    for g, w, p in zip(got, want, pieces, strict=True):
        rows = _dist.shard_rows(w.shape[0], world)
        start = sum(rows[:rank])
        assert g.shape == p.to_local().shape
        assert torch.equal(g, w[start : start + rows[rank]])
    replicated = _dist.orthogonalize_replicated(mats, mesh.get_group(0), ns)
    assert all(torch.equal(a, b) for a, b in zip(replicated, want, strict=True))
    # whole-tensor squared norms from local pieces, one all-reduce
    local_sq = torch.stack([p.to_local().float().pow(2).sum() for p in pieces])
    total = _dist.sum_over_shards_(local_sq, sharding)
    assert torch.allclose(total, torch.stack([m.float().pow(2).sum() for m in mats]), rtol=1e-6)
    return True
