"""train.average: the averaged weights equal a float64 reference written from the equations (alone, in the
trainer, under ddp and fsdp on 2 ranks), a skipped step leaves them unchanged, they never change training,
resume, fork and resharding 2 -> 1 keep them bit for bit, older checkpoints start them afresh with a
warning, and a bad setting, or an average asked of a checkpoint that has none, is one line."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys

import pytest
import torch
from torch import nn
from train_helpers import REPO, compose, subprocess_env, tiny_overrides

from mars.errors import ConfigError
from mars.train.average import WeightAverage
from mars.train.config import validate
from mars.train.distributed import DistInfo
from mars.train.trainer import Trainer

# ----------------------------------------------------------------------------- the reference


def reference(
    kind: str, weights: list[dict], taken: list[bool], decay: float, start: int, steps: int
) -> dict:
    """The average after the steps, in float64, from the definitions (mars/train/average.py): weights[0]
    are the initial weights, weights[t + 1] those after the step of index t (unchanged when skipped)."""
    names = weights[0].keys()
    if kind == "ema":
        avg = {n: weights[0][n].double() for n in names}
        for t, ok in enumerate(taken):
            if ok:
                avg = {n: decay * avg[n] + (1 - decay) * weights[t + 1][n].double() for n in names}
        return avg
    if kind == "tail":
        v = [1.0 if t >= start else 0.0 for t in range(len(taken))]
    else:  # decay_sqrt
        v = [
            1 - decay if t < start else 1 - math.sqrt(min(1.0, (t - start) / (steps - start)))
            for t in range(len(taken))
        ]
    v = [w if ok else 0.0 for w, ok in zip(v, taken, strict=True)]
    total = sum(v)
    if total == 0:
        return {n: weights[-1][n].double() for n in names}
    return {n: sum(w * weights[t + 1][n].double() for t, w in enumerate(v)) / total for n in names}


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(7, 5))
        self.b = nn.Parameter(torch.randn(5))
        self.register_buffer("scale", torch.tensor([2.0]))


class Settings:
    def __init__(self, kind, decay=0.9, start=None, max_steps=50):
        self.average, self.average_decay, self.average_start, self.max_steps = kind, decay, start, max_steps


class Schedule:  # a wsd schedule of 50 steps decays over its last 20% after 5 steps of warmup
    name, warmup_steps, decay_steps, decay_fraction = "wsd", 5, None, 0.2


@pytest.mark.parametrize("kind", ["ema", "tail", "decay_sqrt"])
def test_the_average_equals_a_float64_reference_over_50_steps(kind):
    """50 steps of random updates, some skipped by the device gate (found_inf), against the reference."""
    torch.manual_seed(0)
    model, other = Tiny(), Tiny()
    avg = WeightAverage(Settings(kind, start=None), Schedule, model, other)
    assert avg.start == 41 if kind != "ema" else avg.start is None  # null: the wsd decay's start
    assert torch.equal(other.scale, model.scale)  # buffers are the model's
    weights, taken = [{n: p.detach().clone() for n, p in model.named_parameters()}], []
    for t in range(50):
        ok = t % 7 != 3  # every 7th step is skipped: its update changes nothing
        if ok:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.1 * torch.randn_like(p))  # weights of order 1, as a model's
        avg.update(t, torch.tensor(float(ok)))
        weights.append({n: p.detach().clone() for n, p in model.named_parameters()})
        taken.append(ok)
    want = reference(kind, weights, taken, 0.9, avg.start, 50)
    for name, got in avg.tensors().items():
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want[name], atol=1e-6, rtol=0)


def test_a_tail_before_its_start_is_the_weights_and_a_host_verdict_works_too():
    model, other = Tiny(), Tiny()
    avg = WeightAverage(Settings("tail", start=0.5, max_steps=10), Schedule, model, other)
    assert avg.start == 5
    for t in range(3):
        with torch.no_grad():
            model.a.add_(1.0)
        avg.update(t, True)  # an optimizer that skips on the host: a bool
    assert torch.equal(other.a, model.a) and float(avg.weight_sum) == 0
    avg.update(3, False)  # a skipped step: nothing
    assert torch.equal(other.a, model.a)


# ----------------------------------------------------------------------------- in the trainer


def tiny(data_root, *extra, **train) -> list[str]:
    values = {"max_steps": 6, "eval_interval": 3, "log_interval": 3, **train}
    return [*tiny_overrides(data_root, **values), "optimizer=adamw", *extra]


def weights_of(model) -> dict:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().double().clone()
            for n, p in model.named_parameters()}  # fmt: skip


def train_and_record(tr: Trainer, steps: int) -> tuple[list[dict], list[bool]]:
    """Steps of the trainer, with the (whole) weights after each: the reference's inputs."""
    weights, taken = [weights_of(tr.raw_model)], []
    for _ in range(steps):
        out = tr.train_step()
        weights.append(weights_of(tr.raw_model))
        taken.append(bool(torch.isfinite(out.grad_norm)))
    return weights, taken


def lines(run_dir, drop=("time", "train_time", "ms_per_step", "ms_forward_backward", "ms_optimizer",
                         "tokens_per_s", "hardware", "val/loss_avg")) -> list[dict]:  # fmt: skip
    records = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return [{k: v for k, v in r.items() if k not in drop} for r in records]


def test_the_trainer_keeps_the_average_and_training_is_unchanged(data_root, tmp_path, one_thread):
    tr = Trainer(
        compose(tiny(data_root, "train.average=ema", "train.average_decay=0.6")), tmp_path / "a", DistInfo()
    )
    weights, taken = train_and_record(tr, 5)
    want = reference("ema", weights, taken, 0.6, 0, 5)
    for name, got in tr.average.tensors().items():
        torch.testing.assert_close(got.double(), want[name], atol=1e-6, rtol=0)

    # a run with the average logs val/loss_avg next to val/loss, and trains exactly as one without
    with_avg, without = tmp_path / "with", tmp_path / "without"
    Trainer(
        compose(tiny(data_root, "train.average=tail", "train.average_start=2")), with_avg, DistInfo()
    ).fit()
    Trainer(compose(tiny(data_root)), without, DistInfo()).fit()
    assert lines(with_avg) == lines(without)  # bit for bit: every loss, norm and val loss
    evals = [
        r for r in map(json.loads, (with_avg / "metrics.jsonl").read_text().splitlines()) if "val/loss" in r
    ]
    assert [r["step"] for r in evals] == [0, 3, 6]
    assert evals[0]["val/loss_avg"] == evals[0]["val/loss"]  # the initial weights
    assert evals[2]["val/loss_avg"] != evals[2]["val/loss"]  # the mean of the weights after steps 3-6
    meta = json.loads((with_avg / "ckpt" / "step_00000006" / "meta.json").read_text())
    assert meta["average"] == "tail" and meta["val_loss_avg"] == evals[2]["val/loss_avg"]


def final_average(run_dir) -> dict:
    from mars.checkpoint import latest_checkpoint, load_model

    model, _ = load_model(run_dir, average=True)
    assert latest_checkpoint(run_dir / "ckpt").name == "step_00000006"
    return {n: p.detach() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kind", ["ema", "tail"])
def test_resume_and_fork_continue_the_average_bit_for_bit(data_root, tmp_path, one_thread, kind):
    cfg = compose(tiny(data_root, f"train.average={kind}", "train.average_start=1", "train.ckpt_steps=[3]"))
    straight = tmp_path / "straight"
    Trainer(cfg, straight, DistInfo()).fit()
    step3 = straight / "ckpt" / "step_00000003"
    resumed = tmp_path / "resumed"
    import shutil

    shutil.copytree(step3, resumed / "ckpt" / step3.name)
    Trainer(cfg, resumed, DistInfo(), resume_from=resumed / "ckpt" / step3.name).fit()
    forked = tmp_path / "forked"
    Trainer(cfg, forked, DistInfo(), resume_from=step3).fit()  # another run dir's checkpoint: a fork
    want = final_average(straight)
    for other in (resumed, forked):
        got = final_average(other)
        assert all(torch.equal(got[n], want[n]) for n in want), other.name
        assert lines(other)[-1] == lines(straight)[-1]
    val = [r["val/loss_avg"] for r in map(json.loads, (forked / "metrics.jsonl").read_text().splitlines())
           if "val/loss_avg" in r]  # fmt: skip
    assert val[-1] == [r for r in map(json.loads, (straight / "metrics.jsonl").read_text().splitlines())
                       if "val/loss_avg" in r][-1]["val/loss_avg"]  # fmt: skip


def test_a_checkpoint_without_the_average_resumes_with_it_started_afresh(
    data_root, tmp_path, one_thread, caplog
):
    """Said as a warning (the average is not the one an uninterrupted run would hold), except for a tail
    that begins after the checkpoint: then nothing is lost."""
    run_dir = tmp_path / "old"
    Trainer(compose(tiny(data_root, max_steps=3)), run_dir, DistInfo()).fit()
    step3 = run_dir / "ckpt" / "step_00000003"
    with caplog.at_level(logging.WARNING, logger="mars.train.trainer"):
        tr = Trainer(compose(tiny(data_root, "train.average=ema")), run_dir, DistInfo(), resume_from=step3)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "holds no averaged weights" in warning and "starts afresh" in warning
    pairs = zip(tr.average.model.parameters(), tr.raw_model.parameters(), strict=True)
    assert all(torch.equal(a, p) for a, p in pairs)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mars.train.trainer"):
        Trainer(compose(tiny(data_root, "train.average=tail", "train.average_start=4")), run_dir, DistInfo(),
                resume_from=step3)  # fmt: skip
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


# ----------------------------------------------------------------------------- 2 ranks


def _two_ranks(rank: int, world: int, data_root: str, run_dir: str) -> dict:
    info = DistInfo(rank=rank, local_rank=rank, world_size=world, device="cpu")
    out = {}
    for parallel in ("ddp", "fsdp"):
        extra = [f"train.parallel={parallel}", "train.global_batch_size=4", "train.batch_size=2"]
        cfg = compose(tiny(data_root, *extra, *AVERAGE, max_steps=5))
        for kind in ("ema", "tail"):
            cfg.train.average = kind
            tr = Trainer(cfg, f"{run_dir}/{parallel}_{kind}", info)
            weights, taken = train_and_record(tr, 5)
            want = reference(kind, weights, taken, 0.7, 2, 5)
            got = weights_of(tr.average.model)
            out[(parallel, kind, "error")] = max(float((got[n] - want[n]).abs().max()) for n in want)
            out[(parallel, kind, "average")] = got
            if parallel == "fsdp" and kind == "ema":
                out["saved"] = str(tr.save())  # sharded, by both ranks
    return out


AVERAGE = ["train.average=ema", "train.average_decay=0.7", "train.average_start=2"]


def test_ddp_and_fsdp_on_2_ranks_keep_the_average_and_reshard_it_onto_one(data_root, tmp_path):
    from dist_helpers import run_ranks

    out = run_ranks(2, _two_ranks, str(data_root), str(tmp_path))
    one = {}
    cfg = compose(tiny(data_root, *AVERAGE, max_steps=5))
    for kind in ("ema", "tail"):
        cfg.train.average = kind
        tr = Trainer(cfg, tmp_path / f"one_{kind}", DistInfo())
        weights, taken = train_and_record(tr, 5)
        one[kind] = weights_of(tr.average.model)
        want = reference(kind, weights, taken, 0.7, 2, 5)
        assert max(float((one[kind][n] - want[n]).abs().max()) for n in want) < 1e-6
    for parallel in ("ddp", "fsdp"):
        for kind in ("ema", "tail"):
            assert out[(parallel, kind, "error")] < 1e-6, (parallel, kind)  # against the reference
            got = out[(parallel, kind, "average")]  # against one process (the same training, other sums)
            assert max(float((got[n] - one[kind][n]).abs().max()) for n in got) < 1e-5, (parallel, kind)
    # the checkpoint written by 2 fsdp ranks, resumed in one process: the same average, bit for bit
    from pathlib import Path

    saved = Path(out["saved"])
    assert json.loads((saved / "meta.json").read_text())["format"] == "sharded"
    cfg.train.average = "ema"
    resumed = Trainer(cfg, saved.parent.parent, DistInfo(), resume_from=saved)
    want = out[("fsdp", "ema", "average")]
    assert all(torch.equal(p.detach().double(), want[n]) for n, p in resumed.average.model.named_parameters())


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["train.average=ema", "train.average_decay=1.0"], "train.average_decay=1 must lie in (0, 1)"),
        (["train.average=decay_sqrt", "train.average_decay=0"], "train.average_decay=0 must lie in (0, 1)"),
        (
            ["train.average=tail", "train.average_start=6"],
            "train.average_start=6 (step 6) is at or beyond the end",
        ),
        (["train.average=tail", "schedule=constant"], "schedule=constant's decay begins"),
        (["train.average=tail", "train.average_start=2.5"], "must be a whole step"),
        (["train.average=mean"], "train.average='mean' is not one of off, ema, tail, decay_sqrt"),
    ],
)
def test_a_bad_average_is_one_line_naming_the_key(data_root, overrides, fragment):
    with pytest.raises(ConfigError) as e:
        validate(compose(tiny(data_root, *overrides)))
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_averaged_weights_asked_of_a_checkpoint_without_them_are_one_line(data_root, tmp_path, one_thread):
    """python -m eval average=true and export_hf.py --average: one line before anything is computed; with
    them, load_model gives the averaged weights."""
    from mars.checkpoint import load_model
    from mars.errors import CheckpointError

    plain, averaged = tmp_path / "plain", tmp_path / "averaged"
    Trainer(compose(tiny(data_root, max_steps=2)), plain, DistInfo()).fit()
    tr = Trainer(compose(tiny(data_root, "train.average=ema", max_steps=2)), averaged, DistInfo())
    tr.fit()
    model, _ = load_model(averaged, average=True)
    assert all(
        torch.equal(p, q) for p, q in zip(model.parameters(), tr.average.model.parameters(), strict=True)
    )
    with pytest.raises(
        CheckpointError, match="holds no averaged weights: its run trained with train.average=off"
    ):
        load_model(plain, average=True)
    env = subprocess_env()
    for args in (
        ["-m", "eval", f"ckpt={plain}", "average=true", "tasks=smoke"],
        [str(REPO / "scripts" / "export_hf.py"), str(plain), str(tmp_path / "hf"), "--average"],
    ):
        proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=REPO)
        err = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode != 0 and len(err) == 1, proc.stderr
        assert "holds no averaged weights" in err[0] and ("average=true" in err[0] or "--average" in err[0])
    assert not (tmp_path / "hf").exists()
