"""Batch loaders: determinism, world-size independence, rank slices, resume, sequential epochs, fixed val."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mars.data.loader import BatchLoader, ValLoader, permute
from mars.data.shards import open_dataset
from mars.errors import DataError


def shards(tmp_path, lengths=(1000, 1537, 777)) -> list[np.memmap]:
    """uint16 memmaps whose tokens encode their own position, so every window is identifiable."""
    out, base = [], 0
    for i, n in enumerate(lengths):
        path = tmp_path / f"train_{i:06d}.bin"
        (np.arange(base, base + n) % 50_000).astype(np.uint16).tofile(path)
        out.append(np.memmap(path, dtype=np.uint16, mode="r"))
        base += n
    return out


def rank_batches(arrays, step, world_size, micro, **kw) -> torch.Tensor:
    """All ranks' micro-batches of ``step`` concatenated in rank order, x and y stacked."""
    parts = []
    for rank in range(world_size):
        loader = BatchLoader(arrays, 16, 24, micro, rank=rank, world_size=world_size, **kw)
        assert loader.grad_accum_steps == 24 // (world_size * micro)
        parts.extend(torch.stack([x, y]) for x, y in loader.get(step))
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("sequential", [False, True])
def test_global_batch_is_independent_of_world_size_and_micro_batch(tmp_path, sequential):
    arrays = shards(tmp_path)
    for step in (0, 1, 7, 300):
        reference = rank_batches(arrays, step, 1, 24, seed=5, sequential=sequential)
        assert reference.shape == (2, 24, 16) and reference.dtype == torch.int64
        for world_size, micro in [(1, 1), (1, 6), (2, 3), (3, 8), (4, 2), (8, 1), (24, 1)]:
            got = rank_batches(arrays, step, world_size, micro, seed=5, sequential=sequential)
            assert torch.equal(got, reference), (step, world_size, micro)


def test_batches_are_a_pure_function_of_seed_and_step(tmp_path):
    arrays = shards(tmp_path)
    a = BatchLoader(arrays, 16, 8, 4, seed=1)
    b = BatchLoader(arrays, 16, 8, 4, seed=1)
    later = [torch.cat([x for x, _ in a.get(s)]) for s in (3, 0, 9)]  # any order of requests
    assert all(
        torch.equal(t, torch.cat([x for x, _ in b.get(s)])) for t, s in zip(later, (3, 0, 9), strict=True)
    )
    assert not torch.equal(later[1], torch.cat([x for x, _ in a.get(1)]))
    assert not torch.equal(later[1], torch.cat([x for x, _ in BatchLoader(arrays, 16, 8, 4, seed=2).get(0)]))


def test_windows_are_contiguous_and_targets_shifted(tmp_path):
    arrays = shards(tmp_path)
    loader = BatchLoader(arrays, 16, 64, 64, seed=0)
    ((x, y),) = loader.get(0)
    shard, start = loader.global_windows(0)
    for i in range(64):
        window = np.asarray(arrays[shard[i]][start[i] : start[i] + 17], dtype=np.int64)
        assert torch.equal(x[i], torch.from_numpy(window[:-1])) and torch.equal(
            y[i], torch.from_numpy(window[1:])
        )
    assert x.is_contiguous() and y.is_contiguous()
    assert set(shard.tolist()) == {0, 1, 2}  # windows come from every shard


def test_random_windows_cover_every_start_position(tmp_path):
    arrays = shards(tmp_path, lengths=(40, 25))
    loader = BatchLoader(arrays, 16, 64, 64, seed=0)
    seen = set()
    for step in range(40):
        shard, start = loader.global_windows(step)
        seen |= set(zip(shard.tolist(), start.tolist(), strict=True))
    assert seen == {(0, s) for s in range(40 - 16)} | {(1, s) for s in range(25 - 16)}


def test_ranks_take_disjoint_slices(tmp_path):
    arrays = shards(tmp_path)
    world = 4
    firsts = []
    for rank in range(world):
        loader = BatchLoader(arrays, 16, 32, 4, rank=rank, world_size=world, seed=3, sequential=True)
        firsts.append({tuple(row[:2].tolist()) for x, _ in loader.get(2) for row in x})
    assert all(len(f) == 8 for f in firsts)
    assert len(set().union(*firsts)) == 32  # no window on two ranks


def test_sequential_mode_visits_every_window_once_per_epoch(tmp_path):
    arrays = shards(tmp_path, lengths=(16 * 10 + 1, 16 * 6 + 5))  # 10 + 6 = 16 disjoint windows
    loader = BatchLoader(arrays, 16, 4, 2, seed=9, sequential=True)
    assert loader.num_windows == 16

    def epoch(e):
        return [
            tuple(row[:2].tolist())
            for step in range(4 * e, 4 * e + 4)
            for x, _ in loader.get(step)
            for row in x
        ]

    first, second = epoch(0), epoch(1)
    expected = {(s, s + 1) for s in range(0, 160, 16)} | {(s, s + 1) for s in range(161, 161 + 96, 16)}
    assert len(first) == 16 and set(first) == expected
    assert set(second) == expected and second != first  # reshuffled per epoch


@pytest.mark.parametrize("n", [1, 2, 3, 5, 17, 1000, 4097, 123_457])
def test_permute_is_a_bijection(n):
    out = permute(np.arange(n), n, (7, 0))
    assert np.array_equal(np.sort(out), np.arange(n))
    if n > 100:
        assert not np.array_equal(out, np.arange(n))
        assert not np.array_equal(out, permute(np.arange(n), n, (7, 1)))


def test_state_dict_resume_sees_the_same_batches(tmp_path):
    arrays = shards(tmp_path)
    run = BatchLoader(arrays, 16, 8, 2, seed=11, sequential=True)
    for step in range(5):
        run.get(step)
    state = run.state_dict()
    assert state["step"] == 5 and state["seed"] == 11
    resumed = BatchLoader(arrays, 16, 8, 4, seed=0, sequential=True)  # other micro batch, seed from state
    resumed.load_state_dict(state)
    assert resumed.step == 5
    want = torch.cat([x for x, _ in run.get(5)])
    assert torch.equal(torch.cat([x for x, _ in resumed.get(resumed.step)]), want)
    with pytest.raises(DataError, match="the checkpoint has block_size=16, this run 32"):
        BatchLoader(arrays, 32, 8, 2).load_state_dict(state)
    with pytest.raises(DataError, match="global_batch_size=8, this run 16"):
        BatchLoader(arrays, 16, 16, 2, sequential=True).load_state_dict(state)


def test_val_loader_is_fixed_and_split_across_ranks(tmp_path):
    arrays = shards(tmp_path, lengths=(16 * 20 + 1, 16 * 9 + 1))
    single = ValLoader(arrays, 16, 4, num_sequences=12)
    first = [torch.cat([x, y]) for x, y in single]
    assert len(single) == 3 and single.num_sequences == 12
    assert all(
        torch.equal(a, torch.cat([x, y])) for a, (x, y) in zip(first, single, strict=True)
    )  # same every pass
    rows = torch.cat([x for x, _ in single])
    assert len({tuple(r[:2].tolist()) for r in rows}) == 12  # distinct windows
    assert rows[:, 0].max() > 320  # spread over both shards
    parts = [torch.cat([x for x, _ in ValLoader(arrays, 16, 5, 12, rank=r, world_size=3)]) for r in range(3)]
    assert all(len(p) == 4 for p in parts)
    assert torch.equal(torch.cat(parts), rows)
    with pytest.warns(UserWarning, match="holds 29 windows"):
        assert ValLoader(arrays, 16, 8, num_sequences=100).num_sequences == 29
    # fewer validation sequences than ranks: the message names the setting, not the split's size
    with pytest.raises(
        DataError, match=r"validation asks for 2 sequence\(s\) .* raise train.eval_steps to at least 4"
    ):
        ValLoader(arrays, 16, 1, num_sequences=2, rank=0, world_size=4)


def test_loaders_on_the_embedded_corpus(embedded_cfg):
    ds = open_dataset(embedded_cfg)
    loader = BatchLoader(ds.train, 64, 8, 4, seed=0)
    batches = loader.get(0)
    assert len(batches) == 2 and batches[0][0].shape == (4, 64)
    assert int(max(x.max() for x, _ in batches)) < 50257
    val = ValLoader(ds.val, 64, 8, num_sequences=32)
    assert sum(len(x) for x, _ in val) == 32


def test_block_size_longer_than_a_shard(tmp_path):
    arrays = shards(tmp_path, lengths=(1000, 100))
    with pytest.raises(DataError, match=r"train_000001\.bin: 100 tokens, fewer than block_size \+ 1 = 129"):
        BatchLoader(arrays, 128, 8, 8)
    with pytest.raises(DataError, match=r"train_000001\.bin: 100 tokens"):
        ValLoader(arrays, 128, 8, 8)


def test_global_batch_must_split_evenly():
    arrays = [np.arange(100, dtype=np.uint16)]
    with pytest.raises(
        DataError,
        match="global_batch_size=10 sequences must be a positive multiple of world_size x batch_size = 2 x 4",
    ):
        BatchLoader(arrays, 8, 10, 4, world_size=2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_match_cpu(tmp_path):
    arrays = shards(tmp_path)
    cpu = BatchLoader(arrays, 16, 8, 4, seed=1).get(3)
    gpu = BatchLoader(arrays, 16, 8, 4, seed=1, device="cuda").get(3)
    assert all(
        g.is_cuda and torch.equal(g.cpu(), c)
        for (gx, gy), (cx, cy) in zip(gpu, cpu, strict=True)
        for g, c in ((gx, cx), (gy, cy))
    )
    val = list(ValLoader(arrays, 16, 4, 8, device="cuda"))
    assert val[0][0].is_cuda
