"""The training loop in one process: exact MARS against a hand computation, gradient accumulation,
the logged loss, non-finite steps, and exact resume."""

from __future__ import annotations

import json
import math
import shutil
import signal

import pytest
import torch
from torch.func import functional_call
from train_helpers import compose, tiny_overrides

from mars.checkpoint import latest_checkpoint
from mars.train.distributed import DistInfo
from mars.train.trainer import Trainer, TrainingDivergedError

pytestmark = pytest.mark.usefixtures("one_thread")


def make_trainer(data_root, run_dir, extra=(), resume_from=None, **train) -> Trainer:
    cfg = compose([*tiny_overrides(data_root, **train), *extra])
    return Trainer(cfg, run_dir, DistInfo(), resume_from=resume_from)


def metric_lines(run_dir, key="train/loss") -> dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if key in rec:
            out[rec["step"]] = rec[key]
    return out


def count_backward_passes(trainer: Trainer) -> list[int]:
    """A counter bumped once per backward pass (hook on the position embedding's gradient)."""
    calls = [0]
    wpe = trainer.raw_model.transformer.wpe.weight

    def bump(_):
        calls[0] += 1

    wpe.register_post_accumulate_grad_hook(bump)
    return calls


# ----------------------------------------------------------------------------- exact MARS by hand

HP = dict(
    lr=1e-2, lr_1d=5e-3, wd=0.01, wd_1d=0.1, betas=(0.95, 0.99), betas_1d=(0.9, 0.95), gamma=0.1, eps=1e-8
)
CLIP = 0.5
EXACT = [
    "optimizer=mars_adamw",
    "optimizer.approx=false",
    f"optimizer.lr={HP['lr']}",
    f"optimizer.lr_1d={HP['lr_1d']}",
    f"optimizer.weight_decay={HP['wd']}",
    f"optimizer.weight_decay_1d={HP['wd_1d']}",
    "optimizer.betas=[0.95,0.99]",
    "optimizer.betas_1d=[0.9,0.95]",
    f"optimizer.gamma={HP['gamma']}",
    "optimizer.optimize_1d=false",
    "schedule=constant",
    "schedule.warmup_steps=0",
]


def hand_mars_adamw(model, batches, steps: int, exact: bool):
    """MARS-AdamW (docs/algorithms.md sections 1, 2, 5) written out per tensor, driven like the trainer:
    mean loss over the micro-batches, global grad-norm clip at CLIP (also on the look-ahead
    gradient), g_prev = grad f(x_{t-1}, B_t) in exact mode or last step's gradient in approx mode."""
    x = {n: p.detach().clone() for n, p in model.named_parameters()}

    def grad(params, step):
        ps = {n: v.clone().requires_grad_(True) for n, v in params.items()}
        losses = [functional_call(model, ps, (bx, by))[1] for bx, by in batches[step]]
        g = torch.autograd.grad(sum(losses) / len(losses), list(ps.values()))
        norm = sum(t.double().square().sum() for t in g).sqrt()  # exact (float64): as the trainer's
        coef = min(1.0, CLIP / (float(norm) + 1e-6))
        return {n: t * coef for n, t in zip(ps, g, strict=True)}

    b1, b2 = HP["betas"]
    a1, a2 = HP["betas_1d"]
    m = {n: torch.zeros_like(v) for n, v in x.items()}
    v = {n: torch.zeros_like(t) for n, t in x.items()}
    g_prev = {n: torch.zeros_like(t) for n, t in x.items()}
    for k in range(1, steps + 1):
        ahead = grad(x, k) if exact else None  # grad f(x_{k-1}, B_k): next step's g_prev
        g = grad(x, k - 1)
        for n in x:
            if x[n].ndim == 2:  # MARS on matrices, embeddings in the no-weight-decay group
                c = g[n] + HP["gamma"] * b1 / (1 - b1) * (g[n] - g_prev[n])
                norm = torch.linalg.vector_norm(c)
                if norm > 1:
                    c = c / norm
                m[n] = b1 * m[n] + (1 - b1) * c
                v[n] = b2 * v[n] + (1 - b2) * c * c
                step = m[n] / ((v[n].sqrt() / math.sqrt(1 - b2**k) + HP["eps"]) * (1 - b1**k))
                wd = 0.0 if n.startswith(("transformer.wte", "transformer.wpe")) else HP["wd"]
                x[n] = x[n] - HP["lr"] * (wd * x[n] + step)
            else:  # 1-D tensors: plain AdamW on the raw gradient with the *_1d settings
                m[n] = a1 * m[n] + (1 - a1) * g[n]
                v[n] = a2 * v[n] + (1 - a2) * g[n] * g[n]
                step = m[n] / ((v[n].sqrt() / math.sqrt(1 - a2**k) + HP["eps"]) * (1 - a1**k))
                x[n] = x[n] - HP["lr_1d"] * (HP["wd_1d"] * x[n] + step)
        g_prev = ahead if exact else g
    return x


def test_exact_mars_matches_a_hand_computed_three_step_trajectory(data_root, tmp_path):
    tr = make_trainer(
        data_root, tmp_path, EXACT, grad_clip=CLIP, max_steps=3, batch_size=2, global_batch_size=4
    )
    assert tr.exact and tr.accum_steps == 2
    start = {n: p.detach().clone() for n, p in tr.raw_model.named_parameters()}
    batches = [tr.loader.get(k) for k in range(4)]
    backward = count_backward_passes(tr)
    for _ in range(3):
        tr.train_step()
    assert backward[0] == 3 * 2 * 2  # 3 steps x (look-ahead + own) x 2 micro-steps

    reference = type(tr.raw_model)(tr.raw_model.config)
    reference.load_state_dict(start, strict=False)
    reference.tie_weights()
    exact = hand_mars_adamw(reference, batches, 3, exact=True)
    approx = hand_mars_adamw(reference, batches, 3, exact=False)
    gap = 0.0
    # atol: embedding rows of tokens that barely occur get gradients ~1e-8, where sqrt(v) is of the
    # order of eps and the Adam ratio amplifies float32 rounding (a few elements in 1.6M differ by ~1e-5)
    for n, p in tr.raw_model.named_parameters():
        torch.testing.assert_close(p.detach(), exact[n], rtol=1e-4, atol=2e-5, msg=lambda m, n=n: f"{n}: {m}")
        gap = max(gap, float((exact[n] - approx[n]).abs().max()))
    assert gap > 1e-4  # the test tells exact from approximate g_prev


def test_approx_mars_does_one_backward_per_micro_step(data_root, tmp_path):
    tr = make_trainer(data_root, tmp_path, ["optimizer=mars_adamw"], batch_size=2, global_batch_size=4)
    assert not tr.exact
    backward = count_backward_passes(tr)
    tr.train_step()
    tr.train_step()
    assert backward[0] == 2 * 2


# ----------------------------------------------------------------------------- accumulation and logging


def test_sum_reduction_gives_accumulation_steps_times_the_mean_gradient(data_root, tmp_path):
    grads = {}
    for mode in ("mean", "sum"):
        tr = make_trainer(
            data_root, tmp_path / mode, grad_reduction=mode, grad_clip=0, batch_size=1, global_batch_size=4
        )
        tr.forward_backward_step(0)
        grads[mode] = [p.grad.clone() for p in tr.params]
    assert tr.accum_steps == 4
    for mean, total in zip(grads["mean"], grads["sum"], strict=True):
        torch.testing.assert_close(total, 4 * mean)


def test_logged_train_loss_is_the_mean_over_the_global_batch(data_root, tmp_path):
    tr = make_trainer(data_root, tmp_path, max_steps=1, batch_size=1, global_batch_size=3, eval_steps=0)
    with torch.no_grad():
        expected = sum(float(tr.raw_model(x, y)[1]) for x, y in tr.loader.get(0)) / 3
    tr.fit()
    assert metric_lines(tmp_path)[1] == pytest.approx(expected, rel=1e-6)


def test_metrics_lines_follow_the_documented_schema(data_root, tmp_path):
    make_trainer(data_root, tmp_path, max_steps=4, log_interval=2, eval_interval=2).fit()
    lines = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all("step" in r and "tokens" in r for r in lines)
    train = [r for r in lines if "train/loss" in r]
    val = [r for r in lines if "val/loss" in r]
    assert [r["step"] for r in train] == [2, 4] and [r["step"] for r in val] == [0, 2, 4]
    assert train[-1]["tokens"] == 4 * 4 * 32  # steps x sequences x block_size
    for key in ("lr", "grad_norm", "train/clip_rate", "time", "tokens_per_s", "ms_per_step"):
        assert math.isfinite(train[-1][key]), key
    assert latest_checkpoint(tmp_path / "ckpt").name == "step_00000004"  # the final checkpoint


# ----------------------------------------------------------------------------- non-finite steps


def poison(trainer: Trainer, bad_steps: set[int]) -> None:
    """Make the loss NaN during the given (0-based) optimizer steps."""
    model, forward = trainer.raw_model, trainer.raw_model.forward

    def nan_forward(x, y=None):
        logits, loss = forward(x, y)
        if trainer.state.step in bad_steps and loss is not None and torch.is_grad_enabled():
            loss = loss * float("nan")
        return logits, loss

    model.forward = nan_forward


def test_non_finite_steps_are_skipped_counted_and_stop_the_run(data_root, tmp_path):
    # no warmup: its step 0 would run at lr 0 and leave the weights where they are
    tr = make_trainer(
        data_root, tmp_path, ["schedule.warmup_steps=0"], max_steps=8, max_nonfinite_steps=2, ckpt_interval=1
    )
    poison(tr, {1, 3, 4})
    before = {n: p.detach().clone() for n, p in tr.raw_model.named_parameters()}
    tr.train_step()  # step 0: fine
    after0 = {n: p.detach().clone() for n, p in tr.raw_model.named_parameters()}
    assert any(not torch.equal(before[n], after0[n]) for n in before)
    out = tr.train_step()  # step 1: NaN, skipped on the device; counted at the next read point
    assert not torch.isfinite(out.grad_norm) and tr.state.nonfinite_total == 0
    tr.settle()
    assert tr.state.nonfinite_total == 1
    assert all(torch.equal(after0[n], p) for n, p in tr.raw_model.named_parameters())
    tr.state.step = 0  # replay through fit(): the streak of two NaN steps (3, 4) stops the run
    tr.state.nonfinite_total = tr.state.nonfinite_streak = 0
    with pytest.raises(TrainingDivergedError, match="2 steps in a row"):
        tr.fit()
    assert all(torch.isfinite(p).all() for p in tr.raw_model.parameters())
    # step 4 (one skipped step, weights of step 3) was saved; the run stopped during step 5
    assert latest_checkpoint(tmp_path / "ckpt").name == "step_00000004"
    lines = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if "train/loss" in r]
    assert [r["train/nonfinite_steps"] for r in train] == [0, 1, 1, 2]
    assert train[-1]["train/loss"] == "nan"  # a window of skipped steps has no loss


# ----------------------------------------------------------------------------- exact resume in process


@pytest.mark.parametrize(
    "extra",
    [
        ["optimizer.approx=false"],
        ["optimizer=adamw"],
        ["optimizer=mars_m", "model.parametrization=mup", "model.mup_base_width=16"],  # groups x multipliers
    ],
    ids=["mars_exact", "adamw", "mars_m-mup"],
)
def test_resume_from_a_checkpoint_reproduces_the_straight_run(data_root, tmp_path, extra):
    straight = tmp_path / "straight"
    make_trainer(data_root, straight, extra, max_steps=6).fit()

    split = tmp_path / "split"
    first = make_trainer(data_root, split, extra, max_steps=6)
    first._fit_start = None
    for _ in range(3):
        first.train_step()
    first.settle()
    first.window = type(first.window)(first.device)  # as the straight run's log line at step 3 left it
    first.save()
    resumed = make_trainer(
        data_root, split, extra, max_steps=6, resume_from=latest_checkpoint(split / "ckpt")
    )
    assert resumed.state.step == 3
    resumed.fit()
    want, got = metric_lines(straight), metric_lines(split)
    assert [got[s] for s in (4, 5, 6)] == [want[s] for s in (4, 5, 6)]  # bit-identical


def test_a_preempted_and_resumed_run_logs_the_lines_of_the_straight_run(data_root, tmp_path):
    """The sums of the log window travel in the checkpoint: the first line after a resume averages the
    same steps as the uninterrupted run's (bit-identical on CPU; timing keys aside: each segment also
    names its hardware)."""
    timing = {"time", "train_time", "ms_per_step", "ms_forward_backward", "ms_optimizer", "tokens_per_s"}
    timing |= {"mfu", "hardware"}

    def lines(run_dir):
        records = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        return [{k: v for k, v in r.items() if k not in timing} for r in records]

    cfg = compose(tiny_overrides(data_root, max_steps=6, log_interval=4))  # composed once: 4 runs share it
    straight, split = tmp_path / "straight", tmp_path / "split"
    Trainer(cfg, straight, DistInfo()).fit()
    first = Trainer(cfg, split, DistInfo())
    real = first.train_step

    def sigterm_during_step_2():
        if first.state.step == 1:
            first._on_signal(signal.SIGTERM, None)
        return real()

    first.train_step = sigterm_during_step_2
    assert first.fit() == "preempted"
    step2 = latest_checkpoint(split / "ckpt")
    assert step2.name == "step_00000002"
    Trainer(cfg, split, DistInfo(), resume_from=step2).fit()
    assert [r["step"] for r in lines(straight)] == [0, 4, 6, 6]
    assert lines(split) == lines(straight)

    # a checkpoint of an older version, without the window: it resumes, its first line averages the
    # steps since the resume, and the lines after it are exact again
    older = tmp_path / "older" / "ckpt" / step2.name
    shutil.copytree(step2, older)
    state = torch.load(older / "train_state.pt", weights_only=True)
    del state["window"]
    torch.save(state, older / "train_state.pt")
    Trainer(cfg, older.parent.parent, DistInfo(), resume_from=older).fit()
    got, want = lines(older.parent.parent), lines(straight)
    assert [r["step"] for r in got] == [4, 6, 6] and got[1:] == want[2:]
    assert got[0]["train/loss"] != want[1]["train/loss"]


def test_in_loop_downstream_eval_is_logged_every_interval(data_root, tmp_path, monkeypatch):
    import mars.eval.harness as harness

    calls = []

    def fake_evaluate_model(
        model, tasks, limit=None, batch_size=8, device="cpu", num_fewshot=0, tokenizer="gpt2", dtype="auto"
    ):
        assert dtype == "auto"  # train.dtype: the precision the scores are computed in
        calls.append((model.training, list(tasks), limit, batch_size, device, num_fewshot))
        return {"hellaswag": {"acc": 0.25, "acc_norm": 0.5, "alias": "hellaswag"}}

    monkeypatch.setattr(harness, "evaluate_model", fake_evaluate_model)
    extra = ["downstream.tasks=[hellaswag]", "downstream.interval=2", "downstream.limit=10"]
    tr = make_trainer(data_root, tmp_path, [*extra, "train.average=ema"], max_steps=4)
    tr.fit()
    # steps 2 and 4: the model, then the averaged weights, each in eval mode
    assert calls == [(False, ["hellaswag"], 10, 8, "cpu", 0)] * 4
    assert tr.raw_model.training
    lines = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    downstream = [r for r in lines if any(k.startswith("downstream/") for k in r)]
    assert [r["step"] for r in downstream] == [2, 4]
    assert (
        downstream[0]["downstream/hellaswag/acc"] == 0.25
        and "downstream/hellaswag/alias" not in downstream[0]
        and downstream[0]["downstream_avg/hellaswag/acc"] == 0.25
    )


def _fsdp_downstream_rank(rank: int, world: int, data_root: str, run_dir: str) -> dict:
    """One rank of a 2-rank fsdp run with in-loop downstream evaluation (the scorer replaced by one
    that records the weights it was given)."""
    import mars.eval.harness as harness

    seen = []

    def fake_evaluate_model(
        model, tasks, limit=None, batch_size=8, device="cpu", num_fewshot=0, tokenizer="gpt2", dtype="auto"
    ):
        with torch.no_grad():
            model(torch.zeros(1, 4, dtype=torch.long))  # runs on rank 0 alone (a sharded model would hang)
        seen.append({n: p.detach().clone() for n, p in model.named_parameters()})
        return {"hellaswag": {"acc": 0.25}}

    harness.evaluate_model = fake_evaluate_model
    extra = ["train.parallel=fsdp", "downstream.tasks=[hellaswag]", "downstream.interval=2"]
    extra += ["train.average=ema", "train.average_decay=0.5"]
    cfg = compose([*tiny_overrides(data_root, max_steps=2, batch_size=1, global_batch_size=2), *extra])
    tr = Trainer(cfg, run_dir, DistInfo(rank=rank, local_rank=rank, world_size=world, device="cpu"))
    tr.fit()
    whole = {n: p.full_tensor() for n, p in tr.raw_model.named_parameters()}  # a collective: every rank
    average = {n: p.full_tensor() for n, p in tr.average.model.named_parameters()}
    return {"seen": seen, "whole": whole, "average": average}


def test_in_loop_downstream_eval_under_fsdp_scores_the_whole_model_on_rank_0(data_root, tmp_path):
    """Rank 0 cannot run a sharded model alone (its forward all-gathers from every rank): it gets the
    gathered weights, and the run finishes instead of hanging."""
    from dist_helpers import run_ranks

    out = run_ranks(2, _fsdp_downstream_rank, str(data_root), str(tmp_path))
    assert len(out["seen"]) == 2  # step 2, on rank 0: the model, then the averaged weights
    for evaluated, whole in zip(out["seen"], (out["whole"], out["average"]), strict=True):
        assert set(evaluated) == set(whole)
        for name, tensor in whole.items():
            assert not hasattr(evaluated[name], "to_local"), f"{name}: a shard was evaluated"
            assert torch.equal(evaluated[name], tensor), name
    assert not all(torch.equal(out["whole"][n], t) for n, t in out["average"].items())  # two models
    lines = [json.loads(s) for s in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "downstream/hellaswag/acc" in r] == [2]
    assert [r["step"] for r in lines if "downstream_avg/hellaswag/acc" in r] == [2]


# ----------------------------------------------------------------------------- seeds


def test_data_seed_orders_batches_and_seed_initialises(data_root, tmp_path):
    def first(*extra):
        tr = make_trainer(data_root, tmp_path / "_".join(extra), list(extra))
        weights = {n: p.detach().clone() for n, p in tr.raw_model.named_parameters()}
        return weights, torch.cat([x for x, _ in tr.loader.get(0)])

    base_w, base_x = first("train.seed=1", "train.data_seed=5")
    other_data_w, other_data_x = first("train.seed=1", "train.data_seed=6")
    other_init_w, other_init_x = first("train.seed=2", "train.data_seed=5")
    default_w, default_x = first("train.seed=5")  # data_seed defaults to seed

    assert not torch.equal(base_x, other_data_x)  # data_seed changes the batches ...
    assert all(torch.equal(base_w[n], other_data_w[n]) for n in base_w)  # ... and not the init
    assert torch.equal(base_x, other_init_x)  # seed keeps the batches ...
    assert not torch.equal(
        base_w["transformer.wte.weight"], other_init_w["transformer.wte.weight"]
    )  # ... not the init
    assert torch.equal(default_x, base_x)
