"""Making the optimizers exact when the parameters are sharded (FSDP2) or replicated over ranks (DDP).

Elementwise work (moments, the AdamW and Lion updates) runs on each rank's local shard of a DTensor
parameter (`local`). Two parts of the algorithms need more than the local piece:

* the per-tensor clip of c_t (and the diagnostics) needs norms of whole tensors. Each rank computes
  the squared norms of its local pieces of *all* tensors, stacks them into one vector and sums it
  over the ranks that hold the shards in ONE all-reduce per step (`sum_over_shards_`): no collective
  per tensor, and no read back to the host;
* Newton-Schulz orthogonalises whole matrices. Each matrix is given to one owner rank, the owners
  balanced by the matrices' Newton-Schulz cost (rows x cols x min(rows, cols), largest first onto the
  least loaded rank). Under FSDP2 (`orthogonalize_sharded`) every rank sends its row-shard of each
  matrix to the matrix's owner in one all-to-all (bf16), owners orthogonalise their matrices
  (batched over equal shapes) and a second all-to-all returns each rank its rows of the result.
  Bytes moved per step: 2 x (W - 1)/W x (sum of the matrices' entries) x 2 bytes, spread evenly over
  the ranks (the same as one FSDP all-gather plus one reduce-scatter of those matrices in bf16).
  Under DDP (`orthogonalize_replicated`) every rank holds every matrix: each orthogonalises only the
  ones it owns and one all-gather (bf16) gives every rank all results: each rank receives
  (W - 1)/W of the matrices' entries x 2 bytes. The matrix work per rank falls to about 1/W.

With one rank (or no process group) every function here is the plain single-process computation.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

NSFunction = Callable[[Tensor], Tensor]  # (n, rows, cols) bf16 batch -> orthogonalised batch


def _dtensor_type():
    from torch.distributed.tensor import DTensor

    return DTensor


def is_dtensor(t: Tensor) -> bool:
    return isinstance(t, _dtensor_type())


def local(t: Tensor | None) -> Tensor | None:
    """A DTensor's local shard (a view: writes go to the DTensor), anything else itself."""
    return t.to_local() if t is not None and is_dtensor(t) else t


def state_bytes(optimizer) -> int:
    """Bytes of optimizer state this process holds (of a DTensor, its local shard only)."""
    return sum(
        local(v).numel() * v.element_size()
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, Tensor)
    )


@dataclass(frozen=True)
class Sharding:
    """How a set of DTensor parameters is split: the process group of the one mesh dim their dim-0
    shards lie over (under HSDP the other, replicate dim needs no optimizer communication)."""

    shard_group: object

    @property
    def world(self) -> int:
        return dist.get_world_size(self.shard_group)

    @property
    def rank(self) -> int:
        return dist.get_rank(self.shard_group)


def sharding_of(params: Sequence[Tensor]) -> Sharding | None:
    """The Sharding of sharded DTensor parameters (None when none is sharded). All sharded parameters
    must share one mesh and placement pattern: Shard(0) on at most one mesh dim (FSDP2, HSDP)."""
    from torch.distributed.tensor import Shard

    found = None
    for p in params:
        if not is_dtensor(p):
            continue
        dims = tuple(i for i, pl in enumerate(p.placements) if pl.is_shard())
        if not dims:
            continue
        bad = [pl for pl in p.placements if pl.is_shard() and pl != Shard(0)]
        if bad or len(dims) != 1:
            raise ValueError(
                f"mars.optim: parameter of shape {tuple(p.shape)} is sharded as {p.placements}; only dim-0 "
                "sharding on one mesh dim (FSDP2 fully_shard, HSDP) is supported"
            )
        key = (id(p.device_mesh), dims)
        if found is None:
            found = (key, p.device_mesh, dims[0])
        elif found[0] != key:
            raise ValueError("mars.optim: parameters sharded over different device meshes in one optimizer")
    if found is None:
        return None
    _, mesh, dim = found
    return Sharding(shard_group=mesh.get_group(dim))


def sum_over_shards_(values: Tensor, sharding: Sharding | None) -> Tensor:
    """Sum per-tensor partial sums (e.g. squared norms of local shards) over the shard ranks, in place:
    one all-reduce for the whole vector. A no-op without sharding."""
    if sharding is not None:
        dist.all_reduce(values, op=dist.ReduceOp.SUM, group=sharding.shard_group)
    return values


def shard_rows(rows: int, world: int) -> list[int]:
    """Rows of each rank's dim-0 shard of a `rows`-row tensor (DTensor Shard(0), torch.chunk sizes)."""
    chunk = math.ceil(rows / world) if rows else 0
    return [max(0, min(chunk, rows - r * chunk)) for r in range(world)]


def ns_cost(rows: int, cols: int) -> int:
    return rows * cols * min(rows, cols)


def assign_owners(shapes: Sequence[tuple[int, int]], world: int) -> list[int]:
    """Owner rank of each matrix: largest Newton-Schulz cost first, onto the least loaded rank (ties:
    lowest rank). Deterministic, so every rank computes the same assignment without talking."""
    load = [0] * world
    owners = [0] * len(shapes)
    order = sorted(range(len(shapes)), key=lambda i: (-ns_cost(*shapes[i]), i))
    for i in order:
        owner = min(range(world), key=lambda r: (load[r], r))
        owners[i] = owner
        load[owner] += ns_cost(*shapes[i])
    return owners


def _orthogonalize_batched(mats: list[Tensor], ns: NSFunction) -> list[Tensor]:
    """ns() over same-shaped matrices as one batch each; results in input order."""
    out: list[Tensor | None] = [None] * len(mats)
    by_shape = defaultdict(list)
    for i, m in enumerate(mats):
        by_shape[tuple(m.shape)].append(i)
    for idx in by_shape.values():
        result = ns(torch.stack([mats[i] for i in idx]))
        for j, i in enumerate(idx):
            out[i] = result[j]
    return out


def orthogonalize_sharded(
    pieces: list[Tensor], shapes: list[tuple[int, int]], sharding: Sharding, ns: NSFunction
) -> list[Tensor]:
    """Orthogonalise whole matrices given as this rank's dim-0 pieces; returns this rank's rows of each
    result (same shapes as `pieces`). Two all-to-alls; see the module docstring."""
    group, world, me = sharding.shard_group, sharding.world, sharding.rank
    owners = assign_owners(shapes, world)
    rows = [shard_rows(r, world) for r, _ in shapes]
    dtype, device = pieces[0].dtype, pieces[0].device
    mine = [i for i, o in enumerate(owners) if o == me]
    # 1. each rank sends its piece of matrix i to owners[i]
    send_sizes = [
        sum(rows[i][me] * shapes[i][1] for i in range(len(shapes)) if owners[i] == q) for q in range(world)
    ]
    recv_sizes = [sum(rows[i][s] * shapes[i][1] for i in mine) for s in range(world)]
    order = sorted(range(len(shapes)), key=lambda i: (owners[i], i))
    send = (
        torch.cat([pieces[i].reshape(-1) for i in order])
        if pieces
        else torch.empty(0, dtype=dtype, device=device)
    )
    recv = torch.empty(sum(recv_sizes), dtype=dtype, device=device)
    dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=group)
    # 2. owners assemble and orthogonalise their matrices
    parts: dict[int, list[Tensor]] = {i: [] for i in mine}
    offset = 0
    for s in range(world):
        for i in mine:
            n = rows[i][s] * shapes[i][1]
            parts[i].append(recv[offset : offset + n].view(rows[i][s], shapes[i][1]))
            offset += n
    full = _orthogonalize_batched([torch.cat(parts[i]) for i in mine], ns)
    # 3. owners send each rank its rows of every result
    back = []
    for s in range(world):
        for i, o in zip(mine, full, strict=True):
            start = sum(rows[i][:s])
            back.append(o[start : start + rows[i][s]].reshape(-1))
    back_send = torch.cat(back) if back else torch.empty(0, dtype=dtype, device=device)
    back_recv = torch.empty(sum(send_sizes), dtype=dtype, device=device)
    dist.all_to_all_single(back_recv, back_send.to(dtype), send_sizes, recv_sizes, group=group)
    out: list[Tensor | None] = [None] * len(shapes)
    offset = 0
    for i in order:
        n = rows[i][me] * shapes[i][1]
        out[i] = back_recv[offset : offset + n].view(rows[i][me], shapes[i][1])
        offset += n
    return out


# torch 2.13 renamed all_gather_into_tensor (still there, deprecated); older torch has only the old name
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def orthogonalize_replicated(mats: list[Tensor], group, ns: NSFunction) -> list[Tensor]:
    """Orthogonalise matrices every rank holds whole: each rank does its share, one all-gather shares
    the results. Returns all results on every rank."""
    world, me = dist.get_world_size(group), dist.get_rank(group)
    shapes = [tuple(m.shape) for m in mats]
    owners = assign_owners(shapes, world)
    mine = [i for i, o in enumerate(owners) if o == me]
    done = _orthogonalize_batched([mats[i] for i in mine], ns)
    sizes = [sum(math.prod(shapes[i]) for i in range(len(mats)) if owners[i] == r) for r in range(world)]
    width = max(sizes) if sizes else 0
    dtype, device = mats[0].dtype, mats[0].device
    buf = torch.zeros(width, dtype=dtype, device=device)
    if done:
        flat = torch.cat([o.reshape(-1).to(dtype) for o in done])
        buf[: flat.numel()] = flat
    gathered = torch.empty(world * width, dtype=dtype, device=device)
    _all_gather_flat(gathered, buf, group=group)
    out: list[Tensor | None] = [None] * len(mats)
    cursor = [r * width for r in range(world)]
    for i, o in enumerate(owners):
        n = math.prod(shapes[i])
        out[i] = gathered[cursor[o] : cursor[o] + n].view(shapes[i])
        cursor[o] += n
    return out


def replicated_group(group) -> object | None:
    """The process group to divide Newton-Schulz over when parameters are replicated (DDP): `group` if
    it has more than one rank, else None (single-process work)."""
    if group is None or not (dist.is_available() and dist.is_initialized()):
        return None
    return group if dist.get_world_size(group) > 1 else None


class DistributedOptimizer:
    """Mixin of the optimizers that run Newton-Schulz or clip c_t: where their parameters live.

    `process_group`: set (constructor argument) when the parameters are replicated over ranks (DDP):
    Newton-Schulz is then divided over its ranks. Sharded (DTensor) parameters carry their own mesh.
    Neither a process group nor the cached sharding survives copy.deepcopy or pickle (a copy works on
    one process, with the same results)."""

    process_group = None
    _transient = ("process_group", "_sharding_cache")

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        for key in self._transient:
            if key in state:
                state[key] = None
        return state

    def _sharding(self) -> Sharding | None:
        """The sharding of this optimizer's parameters (None: whole tensors), cached per param-group count."""
        cache = self.__dict__.get("_sharding_cache")
        if cache is None or cache[0] != len(self.param_groups):
            params = [p for group in self.param_groups for p in group["params"]]
            cache = self._sharding_cache = (len(self.param_groups), sharding_of(params))
        return cache[1]

    def _orthogonalize(
        self, batches: list[Tensor], shapes: list[tuple[int, int]], ns: NSFunction
    ) -> list[list[Tensor]]:
        """Newton-Schulz of the step's matrices: `batches` holds, per bucket, this rank's pieces of
        same-shaped matrices (n, rows here, cols) whose whole shape is shapes[bucket]. Returns, per
        bucket, this rank's pieces of the results. One process: each batch at once, in place; sharded
        or replicated over ranks: divided over the ranks (see the module docstring)."""
        sharding = self._sharding()
        group = None if sharding is not None else replicated_group(self.process_group)
        if (sharding is None or sharding.world == 1) and group is None:
            return [list(ns(batch).unbind(0)) for batch in batches]
        pieces = [x for batch in batches for x in batch.unbind(0)]
        whole = [shape for batch, shape in zip(batches, shapes, strict=True) for _ in range(batch.shape[0])]
        if group is None:
            done = orthogonalize_sharded(pieces, whole, sharding, ns)
        else:
            done = orthogonalize_replicated(pieces, group, ns)
        out, start = [], 0
        for batch in batches:
            out.append(done[start : start + batch.shape[0]])
            start += batch.shape[0]
        return out
