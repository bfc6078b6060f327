import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import mars.checkpoint as ckpt
from mars.model import GPT, GPTConfig

CFG = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64)


def _save(run_dir, step, model=None, keep_last=3, **state):
    model = model or GPT(CFG)
    return ckpt.save_checkpoint(
        run_dir, step, model, {"step": step, **state}, {"tokens": step * 10}, "a: 1\n", keep_last=keep_last
    )


def test_step_dir_holds_every_file_and_loads_safely(tmp_path):
    model = GPT(CFG)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))[1].backward()
    opt.step()
    path = ckpt.save_checkpoint(
        tmp_path,
        7,
        model,
        {"optimizer": opt.state_dict(), "rng": ckpt.rng_state()},
        {"tokens": 70, "wandb_run_id": "abc"},
        "train:\n  max_steps: 9\n",
        keep_last=2,
    )
    assert path == tmp_path / "ckpt" / "step_00000007"
    assert sorted(p.name for p in path.iterdir()) == [
        "checksums.json",
        "config.yaml",
        "meta.json",
        "model.json",
        "model.safetensors",
        "train_state.pt",
    ]
    meta = json.loads((path / "meta.json").read_text())
    assert meta == {
        "tokens": 70,
        "wandb_run_id": "abc",
        "step": 7,
        "format": "full",
        "healthy": True,
        "checksums": "xxh3_128",
    }
    sums = json.loads((path / "checksums.json").read_text())
    assert sums["algorithm"] == "xxh3_128"
    assert sorted(sums["files"]) == ["config.yaml", "model.json", "model.safetensors", "train_state.pt"]
    assert sums["files"]["model.safetensors"]["size"] == (path / "model.safetensors").stat().st_size
    assert (path / "config.yaml").read_text() == "train:\n  max_steps: 9\n"
    state = ckpt.load_train_state(path)  # torch.load(weights_only=True) inside
    opt2 = torch.optim.AdamW(GPT(CFG).parameters(), lr=1e-3)
    opt2.load_state_dict(state["optimizer"])
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    from mars.checkpoint import load_model

    loaded, info = load_model(tmp_path)
    assert info["step"] == 7 and info["config"] == {"train": {"max_steps": 9}}
    assert model.state_dict().keys() == loaded.state_dict().keys()
    for k, a in model.state_dict().items():
        assert torch.equal(a, loaded.state_dict()[k]), k
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".")]


def test_keep_last_rotates_old_checkpoints(tmp_path):
    model = GPT(CFG)
    for step in (10, 20, 30, 40):
        _save(tmp_path, step, model, keep_last=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "ckpt")] == ["step_00000030", "step_00000040"]
    assert ckpt.latest_checkpoint(tmp_path / "ckpt").name == "step_00000040"


def test_interrupted_save_leaves_the_previous_checkpoint_latest(tmp_path, monkeypatch):
    model = GPT(CFG)
    _save(tmp_path, 10, model)

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing")

    import mars.checkpoint.save as save_module

    monkeypatch.setattr(save_module.torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 20, model)
    root = tmp_path / "ckpt"
    assert (root / ".tmp-step_00000020").is_dir()  # the half-written copy stays under its temp name
    assert not (root / "step_00000020").exists()
    assert ckpt.latest_checkpoint(root).name == "step_00000010"
    assert ckpt.resolve_checkpoint(tmp_path).name == "step_00000010"
    # a dir with the final name but no meta.json (not ours, or a foreign copy) is not complete either
    (root / "step_00000030").mkdir()
    assert ckpt.latest_checkpoint(root).name == "step_00000010"
    monkeypatch.undo()
    _save(tmp_path, 40, model)  # the next save clears the leftover
    assert not (root / ".tmp-step_00000020").exists()


def test_resaving_a_step_replaces_it(tmp_path):
    model = GPT(CFG)
    _save(tmp_path, 5, model, marker=1)
    _save(tmp_path, 5, model, marker=2)
    assert ckpt.load_train_state(tmp_path / "ckpt" / "step_00000005")["marker"] == 2
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["step_00000005"]


def test_refuses_to_save_non_finite_weights(tmp_path):
    model = GPT(CFG)
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="non-finite"):
        _save(tmp_path, 1, model)
    assert ckpt.list_checkpoints(tmp_path / "ckpt") == []


def test_rng_state_round_trips_through_a_weights_only_file(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    torch.save({"rng": ckpt.rng_state()}, tmp_path / "s.pt")
    expected = (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist())
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    ckpt.set_rng_state(torch.load(tmp_path / "s.pt", weights_only=True)["rng"])
    assert (random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()) == expected


def test_model_shape_mismatch_names_the_keys(tmp_path):
    path = _save(tmp_path, 1)
    ckpt.check_model_shape(path, CFG)  # same shape: fine
    other = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=64)
    with pytest.raises(ckpt.CheckpointError, match=r"n_layer=1 \(config: 2\)"):
        ckpt.check_model_shape(path, other)


def test_resolve_checkpoint_accepts_run_ckpt_and_step_dirs(tmp_path):
    assert ckpt.resolve_checkpoint(tmp_path) is None
    model = GPT(CFG)
    _save(tmp_path, 3, model)
    last = _save(tmp_path, 4, model)
    assert ckpt.resolve_checkpoint(tmp_path) == last
    assert ckpt.resolve_checkpoint(tmp_path / "ckpt") == last
    first = tmp_path / "ckpt" / "step_00000003"
    assert ckpt.resolve_checkpoint(first) == first


# ----------------------------------------------------------------------------- reliability


def test_full_disk_removes_the_partial_copy_and_keeps_the_previous(tmp_path, monkeypatch):
    import errno

    import mars.checkpoint.save as save_module

    model = GPT(CFG)
    _save(tmp_path, 10, model)

    def full_disk(obj, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(save_module.torch, "save", full_disk)
    with pytest.raises(
        ckpt.CheckpointError, match="no space left on the device .* previous checkpoint is intact"
    ):
        _save(tmp_path, 20, model)
    root = tmp_path / "ckpt"
    assert sorted(p.name for p in root.iterdir()) == ["step_00000010"]  # no temp dir left behind
    assert ckpt.load_train_state(root / "step_00000010")["step"] == 10


def test_files_are_fsynced_before_the_marker_and_the_dir_after_the_rename(tmp_path, monkeypatch):
    import mars.files as files

    events = []
    real_fsync = files.os.fsync

    def record(fd):
        events.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", record)
    path = _save(tmp_path, 3)
    names = [Path(e).name for e in events]
    marker = names.index("meta.json")
    for f in ("model.safetensors", "model.json", "train_state.pt", "config.yaml"):
        assert f in names[:marker], (f, names)
    assert Path(events[-1]) == path.parent  # ckpt/ itself, after the rename


def test_truncated_or_tampered_train_state_is_one_clear_error(tmp_path):
    path = _save(tmp_path, 4)
    state_file = path / "train_state.pt"
    state_file.write_bytes(state_file.read_bytes()[:100])
    with pytest.raises(ckpt.CheckpointError, match=r"train_state\.pt is not a valid training-state file"):
        ckpt.load_train_state(path)

    class Payload:  # what a tampered file would carry: an object whose unpickling runs code
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"optimizer": Payload()}, state_file)
    with pytest.raises(ckpt.CheckpointError, match="holding objects this harness never writes") as e:
        ckpt.load_train_state(path)
    assert len(str(e.value).splitlines()) == 1
    assert "system" in str(e.value)  # names what it carries
    # a refusal of untrusted content never passes on torch's advice to load it unsafely
    assert "weights_only" not in str(e.value) and "trusted source" not in str(e.value)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / "meta.json").write_text("{not json"), r"meta\.json is not valid JSON"),
        (lambda d: (d / "meta.json").write_text('{"step": "x"}'), r"'step' must be a non-negative integer"),
        (lambda d: (d / "train_state.pt").write_bytes(b""), r"train_state\.pt is not a valid"),
        (lambda d: (d / "config.yaml").write_text("a: [1"), r"config\.yaml is not valid YAML"),
    ],
)
def test_verify_names_the_bad_file(tmp_path, damage, message):
    """The structural checks, which are all a checkpoint from before checksums has (with checksums, the
    checksum refuses any changed file first: test_checksums.py)."""
    path = _save(tmp_path, 5)
    ckpt.verify_checkpoint(path)  # intact: fine
    written_before_checksums(path)
    damage(path)
    with pytest.raises(ckpt.CheckpointError, match=message):
        ckpt.verify_checkpoint(path)


def written_before_checksums(step_dir):
    """Make a checkpoint look like one written before checksums existed."""
    meta = json.loads((step_dir / "meta.json").read_text())
    del meta["checksums"]
    (step_dir / "meta.json").write_text(json.dumps(meta))
    (step_dir / "checksums.json").unlink()


def test_verify_refuses_non_finite_weights(tmp_path):
    from safetensors.torch import load_file, save_file

    path = _save(tmp_path, 6)
    written_before_checksums(path)
    tensors = load_file(path / "model.safetensors")
    tensors["transformer.h.0.mlp.c_fc.weight"][0, 0] = float("inf")
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ckpt.CheckpointError, match=r"mlp\.c_fc\.weight hold NaN or inf values"):
        ckpt.verify_checkpoint(path)


def test_rotation_keeps_the_newest_healthy_checkpoint(tmp_path):
    model = GPT(CFG)
    root = tmp_path / "ckpt"
    ckpt.save_checkpoint(tmp_path, 10, model, {}, {}, "", keep_last=2, healthy=True)
    for step in (20, 30, 40):
        ckpt.save_checkpoint(tmp_path, step, model, {}, {}, "", keep_last=2, healthy=False)
    assert [p.name for p in ckpt.list_checkpoints(root)] == [
        "step_00000010",
        "step_00000030",
        "step_00000040",
    ]
    ckpt.save_checkpoint(tmp_path, 50, model, {}, {}, "", keep_last=2, healthy=True)
    assert [p.name for p in ckpt.list_checkpoints(root)] == ["step_00000040", "step_00000050"]
    assert not ckpt.is_healthy(root / "step_00000040") and ckpt.is_healthy(root / "step_00000050")


def test_dcp_index_is_read_without_running_code(tmp_path):
    """The index of a sharded checkpoint is a pickle; a tampered one must not run anything."""
    import pickle

    from mars.checkpoint import sharded

    sharded.save_tensors({"model.w": torch.arange(6.0).reshape(2, 3)}, tmp_path / "s")
    shapes = sharded.saved_shapes(tmp_path / "s")
    assert shapes == {"model.w": torch.Size([2, 3])}
    target = {"model.w": torch.zeros(2, 3)}
    sharded.load_tensors(target, tmp_path / "s")
    assert torch.equal(target["model.w"], torch.arange(6.0).reshape(2, 3))

    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    (tmp_path / "s" / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ckpt.CheckpointError, match=r"global posix\.system is not allowed"):
        sharded.read_metadata(tmp_path / "s")
