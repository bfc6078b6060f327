"""train.parallel=fsdp end to end (torchrun, gloo on CPU): it trains as one process does (loss,
grad_norm, final weights), a SIGKILL mid-run resumes exactly, and a checkpoint written by 2 ranks
continues alike on 1 and 4 ranks, under HSDP (2 replicas x 2 shards) and in one process. Marked slow."""

from __future__ import annotations

import json

import pytest
import torch
from test_e2e import (
    KILL_AFTER_CHECKPOINT,
    TRAIN,
    assert_same_training,
    final_weights,
    in_process,
    losses,
    run,
)
from train_helpers import PYTHON, tiny_overrides

from mars.checkpoint import latest_checkpoint, read_meta

pytestmark = [pytest.mark.slow, pytest.mark.extended]  # make test-all


def torchrun(n: int, *args) -> list[str]:
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", *args]


def test_fsdp_sigkill_resume_and_resharding(data_root, tmp_path):
    overrides = [
        *tiny_overrides(
            data_root, max_steps=8, batch_size=1, global_batch_size=4, ckpt_interval=4, eval_steps=4
        ),
        "model.n_layer=2",
        "optimizer=adamw",
        "train.parallel=fsdp",
    ]
    straight = tmp_path / "straight"
    run(torchrun(2, TRAIN, *overrides, f"hydra.run.dir={straight}"), tmp_path)
    want = losses(straight)
    assert sorted(want) == list(range(1, 9))
    ddp = [o for o in overrides if o != "train.parallel=fsdp"]
    one = in_process(ddp, tmp_path / "unsharded")  # the same run in one process, from the start
    for s, loss in losses(one).items():
        assert abs(want[s] - loss) < 1e-4, (s, want[s], loss)
    assert_same_training(straight, one, "fsdp from the start")

    killed = tmp_path / "killed"
    driver = tmp_path / "kill_after_checkpoint.py"
    driver.write_text(KILL_AFTER_CHECKPOINT.format(step=4, train=TRAIN))
    proc = run(torchrun(2, str(driver), *overrides, f"hydra.run.dir={killed}"), tmp_path, check=False)
    assert proc.returncode != 0
    step4 = latest_checkpoint(killed / "ckpt")
    assert step4.name == "step_00000004"
    meta = read_meta(step4)
    assert meta["format"] == "sharded" and meta["world_size"] == 2
    assert sorted(p.name for p in (step4 / "sharded").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    # each rank hashed its share of the shard files: checksums.json covers them all
    sums = json.loads((step4 / "checksums.json").read_text())["files"]
    assert {"sharded/.metadata", "sharded/__0_0.distcp", "sharded/__1_0.distcp"} <= set(sums)

    run(torchrun(2, TRAIN, *overrides, "train.resume=auto", f"hydra.run.dir={killed}"), tmp_path)
    got = losses(killed)
    assert [got[s] for s in range(1, 9)] == [want[s] for s in range(1, 9)]  # identical
    assert losses(killed, "grad_norm") == losses(straight, "grad_norm")
    (resumed, _), (straight_weights, _) = final_weights(killed), final_weights(straight)
    assert all(torch.equal(w, straight_weights[k]) for k, w in resumed.items())  # identical

    hsdp = [*overrides, "train.fsdp_replicate=2"]
    layouts = (("fsdp1", 1, overrides), ("fsdp4", 4, overrides), ("hsdp2x2", 4, hsdp), ("one", 1, ddp))
    for name, n, how in layouts:  # DCP reshards onto other ranks and layouts
        other = tmp_path / name
        run(torchrun(n, TRAIN, *how, f"train.resume={step4}", f"hydra.run.dir={other}"), tmp_path)
        got = losses(other)
        assert sorted(got) == [5, 6, 7, 8]
        for s in (5, 6, 7, 8):
            assert abs(got[s] - want[s]) < 1e-4, (name, s, got[s], want[s])
        assert_same_training(other, straight, name)

    from mars.checkpoint import load_model  # export and evaluation gather it into one process

    model, info = load_model(step4)
    assert info["format"] == "sharded" and info["step"] == 4 and model.config.n_layer == 2
    assert all(bool(p.isfinite().all()) for p in model.parameters())
