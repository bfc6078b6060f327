"""Batch loaders over memory-mapped uint16 token shards.

BatchLoader serves training batches. The global batch of optimizer step ``step`` -- its
``global_batch_size`` windows of ``block_size + 1`` tokens -- is a pure function of (seed, step):

  * random mode (the reference sampling): each window starts at a uniformly drawn position of the
    training tokens (windows never cross a shard boundary), drawn from a generator seeded with
    (seed, step);
  * sequential mode: the shards are cut into disjoint windows and every epoch visits each of them
    exactly once, in an order shuffled per (seed, epoch) by a keyed permutation that needs no memory.

Rank r of W takes the r-th contiguous slice of the global batch and micro-step m the m-th piece of
that slice, so 1 process with gradient accumulation and W processes see the same tokens in the same
steps. ValLoader serves a fixed set of validation windows: the same tokens at every evaluation.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch

from mars.data.split import mix64
from mars.errors import DataError


def _name(array: np.ndarray, index: int, split: str) -> str:
    return str(getattr(array, "filename", None) or f"{split} array {index}")


def _check_lengths(arrays: list[np.ndarray], block_size: int, split: str) -> None:
    if not arrays:
        fix = (
            "prepare the dataset with a validation split (data.val_tokens > 0, into its own data.dir), or "
            "set train.eval_steps=0 to train without validation"
            if split == "val"
            else "prepare the dataset again"
        )
        raise DataError(f"the {split} split of the dataset has no shards: {fix}")
    for i, a in enumerate(arrays):
        if len(a) < block_size + 1:
            raise DataError(
                f"{_name(a, i, split)}: {len(a)} tokens, fewer than block_size + 1 = {block_size + 1}. "
                f"Use a smaller model.block_size, or prepare the data with more tokens per shard "
                f"(data.shard_tokens / data.val_tokens)."
            )


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


# ----------------------------------------------------------------------------- keyed permutation


def permute(index: np.ndarray, n: int, key: tuple[int, ...]) -> np.ndarray:
    """Apply a pseudo-random bijection of [0, n), chosen by ``key``, to ``index``.

    A 4-round Feistel network permutes [0, 2**bits) (bits even, 2**bits >= n); values that land
    outside [0, n) are mapped again until they land inside ("cycle walking"), which restricts the
    bijection to [0, n). O(1) memory, so an epoch over billions of windows costs nothing to set up.
    """
    bits = max(2, (n - 1).bit_length())
    bits += bits % 2
    half = np.uint64(bits // 2)
    mask = np.uint64((1 << (bits // 2)) - 1)
    round_keys = np.random.SeedSequence(list(key)).generate_state(4, dtype=np.uint64)

    def feistel(v: np.ndarray) -> np.ndarray:
        left, right = v >> half, v & mask
        for k in round_keys:
            left, right = right, left ^ (mix64(right ^ k) & mask)
        return (left << half) | right

    out = feistel(np.asarray(index, dtype=np.uint64))
    outside = out >= np.uint64(n)
    while outside.any():
        out[outside] = feistel(out[outside])
        outside = out >= np.uint64(n)
    return out.astype(np.int64)


# ----------------------------------------------------------------------------- training batches


class BatchLoader:
    """Training batches: ``get(step)`` -> ``grad_accum_steps`` pairs (x, y) of int64 tensors.

    Each tensor has shape (micro_batch_size, block_size); y is x shifted by one token.
    """

    def __init__(
        self,
        train_arrays,
        block_size: int,
        global_batch_size: int,
        micro_batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        sequential: bool = False,
        device: str | torch.device = "cpu",
        dataset: tuple[str, str] | None = None,
    ):
        """dataset: (its directory, TokenDataset.train_digest): the digest is kept in the state so that a
        resume on a dataset prepared again since (re-split, rebuilt) is refused instead of silently
        reading other documents."""
        self.dataset_dir, self.dataset = dataset or (None, None)
        if block_size < 1 or micro_batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise DataError(
                f"invalid loader shape: block_size={block_size}, micro_batch_size={micro_batch_size}, "
                f"rank={rank}, world_size={world_size}"
            )
        if global_batch_size < 1 or global_batch_size % (world_size * micro_batch_size):
            raise DataError(
                f"global_batch_size={global_batch_size} sequences must be a positive multiple of "
                f"world_size x batch_size = {world_size} x {micro_batch_size}; "
                f"set train.global_batch_size or train.batch_size"
            )
        self.arrays = list(train_arrays)
        _check_lengths(self.arrays, block_size, "train")
        self.block_size = block_size
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.rank, self.world_size = rank, world_size
        self.seed = seed
        self.sequential = sequential
        self.device = torch.device(device)
        self.grad_accum_steps = global_batch_size // (world_size * micro_batch_size)
        lengths = np.array([len(a) for a in self.arrays], dtype=np.int64)
        # windows per shard: every start position (random), or disjoint windows k*block_size (sequential)
        self._counts = (lengths - 1) // block_size if sequential else lengths - block_size
        self._offsets = np.cumsum(self._counts) - self._counts
        self.num_windows = int(self._counts.sum())
        self.step = 0  # one past the highest step served: where a plain resume continues

    def global_windows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard index, start token) of each window of step ``step``'s global batch, in batch order."""
        n, g = self.num_windows, self.global_batch_size
        if self.sequential:
            position = step * g + np.arange(g, dtype=np.int64)
            epochs, within = position // n, position % n
            index = np.empty(g, dtype=np.int64)
            for epoch in np.unique(epochs):
                sel = epochs == epoch
                index[sel] = permute(within[sel], n, (self.seed, int(epoch)))
        else:
            index = np.random.default_rng([self.seed, step]).integers(0, n, size=g, dtype=np.int64)
        shard = np.searchsorted(self._offsets, index, side="right") - 1
        start = index - self._offsets[shard]
        return shard, start * self.block_size if self.sequential else start

    def get(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's micro-batches of optimizer step ``step``."""
        if step < 0:
            raise DataError(f"step must be >= 0, got {step}")
        shard, start = self.global_windows(step)
        per_rank = self.global_batch_size // self.world_size
        lo = self.rank * per_rank
        shard, start = shard[lo : lo + per_rank], start[lo : lo + per_rank]
        mb, b = self.micro_batch_size, self.block_size
        out = []
        for m in range(self.grad_accum_steps):
            x = np.empty((mb, b), dtype=np.int64)
            y = np.empty((mb, b), dtype=np.int64)
            for i in range(mb):
                s, p = int(shard[m * mb + i]), int(start[m * mb + i])
                window = self.arrays[s][p : p + b + 1]
                x[i], y[i] = window[:-1], window[1:]
            out.append(
                (_to_device(torch.from_numpy(x), self.device), _to_device(torch.from_numpy(y), self.device))
            )
        self.step = max(self.step, step + 1)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "step": self.step,
            "block_size": self.block_size,
            "global_batch_size": self.global_batch_size,
            "sequential": self.sequential,
            "num_windows": self.num_windows,
            "dataset": self.dataset,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the seed and step; refuse a state whose batches this loader could not reproduce."""
        if state.get("dataset") and self.dataset and state["dataset"] != self.dataset:  # older: none saved
            raise DataError(
                f"cannot resume the data loader: {self.dataset_dir} was prepared again since the checkpoint "
                "(re-split with resplit=true, or rebuilt), so the resumed run would train on other "
                "documents; restore the dataset as it was, or start a new run from the checkpoint's weights "
                "(train.init_from)"
            )
        for key in ("block_size", "global_batch_size", "sequential", "num_windows"):
            if state.get(key) != getattr(self, key):
                raise DataError(
                    f"cannot resume the data loader: the checkpoint has {key}={state.get(key)!r}, this run "
                    f"{getattr(self, key)!r}, so the resumed run would see other batches. "
                    f"Use the checkpoint's "
                    f"settings and dataset."
                )
        self.seed = int(state["seed"])
        self.step = int(state["step"])


# ----------------------------------------------------------------------------- validation batches


class ValLoader:
    """A fixed validation set: up to ``num_sequences`` disjoint windows spread evenly over the val split.

    Iterating yields (x, y) micro-batches of at most ``micro_batch_size`` rows; ranks take disjoint,
    equally sized contiguous slices; every iteration yields the same tokens.
    """

    def __init__(
        self,
        val_arrays,
        block_size: int,
        micro_batch_size: int,
        num_sequences: int,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
    ):
        if block_size < 1 or micro_batch_size < 1 or num_sequences < 1 or not 0 <= rank < world_size:
            raise DataError(
                f"invalid val loader shape: block_size={block_size}, micro_batch_size={micro_batch_size}, "
                f"num_sequences={num_sequences}, rank={rank}, world_size={world_size}"
            )
        arrays = list(val_arrays)
        _check_lengths(arrays, block_size, "val")
        counts = np.array([(len(a) - 1) // block_size for a in arrays], dtype=np.int64)
        offsets = np.cumsum(counts) - counts
        available = int(counts.sum())
        if num_sequences > available:
            warnings.warn(
                f"the val split holds {available} windows of {block_size + 1} tokens, fewer than the "
                f"{num_sequences} asked for: evaluating on all {available}",
                stacklevel=2,
            )
        total = min(num_sequences, available) // world_size * world_size
        if total == 0 and num_sequences < world_size:
            raise DataError(
                f"validation asks for {num_sequences} sequence(s) (train.eval_steps x train.batch_size), "
                f"fewer than the {world_size} ranks: raise train.eval_steps to at least "
                f"{math.ceil(world_size / micro_batch_size)}, or set it to 0 for no validation"
            )
        if total == 0:
            raise DataError(
                f"the val split holds {available} windows of {block_size + 1} tokens, too few for "
                f"{world_size} ranks; prepare a larger val split (data.val_tokens)"
            )
        chosen = np.arange(total, dtype=np.int64) * available // total  # evenly spaced, all distinct
        per_rank = total // world_size
        mine = chosen[rank * per_rank : (rank + 1) * per_rank]
        shard = np.searchsorted(offsets, mine, side="right") - 1
        start = (mine - offsets[shard]) * block_size
        tokens = np.stack(
            [arrays[s][p : p + block_size + 1] for s, p in zip(shard, start, strict=True)]
        ).astype(np.int64)
        self.device = torch.device(device)
        self.x = torch.from_numpy(np.ascontiguousarray(tokens[:, :-1]))
        self.y = torch.from_numpy(np.ascontiguousarray(tokens[:, 1:]))
        if self.device.type == "cuda":
            self.x, self.y = self.x.pin_memory(), self.y.pin_memory()
        self.micro_batch_size = micro_batch_size
        self.num_sequences = total  # over all ranks

    def __len__(self) -> int:
        return math.ceil(len(self.x) / self.micro_batch_size)

    def __iter__(self):
        non_blocking = self.device.type == "cuda"
        for i in range(0, len(self.x), self.micro_batch_size):
            sl = slice(i, i + self.micro_batch_size)
            yield (
                self.x[sl].to(self.device, non_blocking=non_blocking),
                self.y[sl].to(self.device, non_blocking=non_blocking),
            )
