"""The paper presets run the reference training loop (AGI-Arena/MARS, MARS/train_mars.py).

An independent reimplementation, written here from the reference script's equations and not from
this package, trains the same tiny GPT-2 on the same batches as the Trainer under
`experiment=paper/owt_small_mars(_exact)`, in float64:

- lr of iteration it (0-based, iterations 0..max_iters inclusive): peak * it / warmup for
  it < warmup (so iteration 0 runs at lr 0), then cosine down to min_lr at lr_decay_iters = max_iters;
- GPT-2 with the tanh GELU, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)));
- every micro-step back-propagates its undivided mean loss: gradients are summed over micro-steps;
- global gradient-norm clip at grad_clip (torch's clip_grad_norm_: factor grad_clip / (norm + 1e-6));
- MARS-AdamW (tests/optim/optim_reference.py) on matrices, embeddings without weight decay; AdamW with
  lr_1d / lr of the scheduled lr, betas_1d and weight_decay_1d on 1-D tensors;
- g_prev: approximate MARS, the previous step's clipped gradient; exact MARS, the look-ahead of the
  previous iteration: the gradient of batch it + 1 at the weights of iteration it, computed (summed,
  clipped) before iteration it's own gradient; zeros at iteration 0.

Per-step losses and the final weights must agree to float64 rounding (docs/algorithms.md 6.5).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from train_helpers import compose

from mars.train.distributed import DistInfo
from mars.train.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "optim"))
import optim_reference as ref  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_ITERS, WARMUP = 12, 4  # iterations 0..12: 13 optimizer steps, lr 0 at iteration 0
N_LAYER, N_HEAD, N_EMBD, BLOCK = 2, 2, 16, 16
MICRO_BATCH, MICRO_STEPS = 2, 2
# A clip that binds on some steps and not on others: only an unclipped step sees the gradient's scale,
# i.e. whether micro-steps are summed or averaged (the test checks that both kinds occur).
GRAD_CLIP = 2.0
# float64 rounding (different summation orders: SDPA against the attention written out, multi-tensor
# against per-tensor optimizer arithmetic), amplified over the steps: the two agree to ~1e-15 in the
# losses and ~1e-13 in the weights. Each drift this test guards against, made once on purpose, moved
# the losses by 2.6e-5 (exact GELU), 3.1e-3 (mean over micro-steps), 2.0e-2 (exact MARS's look-ahead
# on the current batch); a (step + 1) / warmup warmup changes the lr of step 0 from 0 to 1.5e-3.
TOL = 1e-10


@pytest.fixture
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def preset_trainer(data_root, run_dir, exact: bool) -> Trainer:
    """The paper preset scaled down: reference max_iters = lr_decay_iters = MAX_ITERS is the preset's
    train.max_steps = MAX_ITERS + 1 and schedule.decay_steps = MAX_ITERS."""
    cfg = compose(
        [
            f"experiment=paper/owt_small_mars{'_exact' if exact else ''}",
            "data=embedded",
            f"data.root={data_root}",
            f"model.n_layer={N_LAYER}",
            f"model.n_head={N_HEAD}",
            f"model.n_embd={N_EMBD}",
            f"model.block_size={BLOCK}",
            f"train.batch_size={MICRO_BATCH}",
            f"train.global_batch_size={MICRO_BATCH * MICRO_STEPS}",
            f"train.max_steps={MAX_ITERS + 1}",
            f"schedule.decay_steps={MAX_ITERS}",
            f"schedule.warmup_steps={WARMUP}",
            f"train.grad_clip={GRAD_CLIP}",
            "train.device=cpu",
            "train.dtype=float32",  # no autocast: the float64 default dtype makes a float64 model
            "train.compile=false",
            "train.eval_steps=0",
            "train.ckpt_interval=0",
            "train.progress=false",
            "logger=disabled",
        ]
    )
    assert cfg.train.grad_reduction == "sum" and cfg.model.activation == "gelu_tanh"
    return Trainer(cfg, run_dir, DistInfo())


# ----------------------------------------------------------------------------- the reference, rewritten


def tanh_gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def layer_norm(x, w):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-5) * w


def gpt2_loss(P, idx, targets):
    """nanoGPT's GPT-2 as the reference configures it: no biases, tied head, attention logits of layer
    i scaled by 1 / (sqrt(head_dim) (i + 1)), tanh GELU; the mean token cross-entropy."""
    B, T = idx.shape
    hd = N_EMBD // N_HEAD
    x = P["transformer.wte.weight"][idx] + P["transformer.wpe.weight"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(N_LAYER):
        h = f"transformer.h.{i}."
        a = layer_norm(x, P[h + "ln_1.weight"]) @ P[h + "attn.c_attn.weight"].T
        q, k, v = (t.view(B, T, N_HEAD, hd).transpose(1, 2) for t in a.split(N_EMBD, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd) / (i + 1))
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, N_EMBD)
        x = x + y @ P[h + "attn.c_proj.weight"].T
        m = tanh_gelu(layer_norm(x, P[h + "ln_2.weight"]) @ P[h + "mlp.c_fc.weight"].T)
        x = x + m @ P[h + "mlp.c_proj.weight"].T
    logits = layer_norm(x, P["transformer.ln_f.weight"]) @ P["transformer.wte.weight"].T
    logp = logits.log_softmax(-1)
    return -logp.gather(-1, targets[..., None]).mean()


def reference_run(init, batches, o, s, exact: bool):
    """train_mars.py's loop; returns the per-iteration mean micro-step loss and the final weights."""
    P = {k: v.clone() for k, v in init.items() if k != "lm_head.weight"}  # the head is wte
    lr0, min_lr = o.lr, s.min_lr

    def get_lr(it):
        if it < WARMUP:
            return lr0 * it / WARMUP
        if it > MAX_ITERS:  # lr_decay_iters = max_iters
            return min_lr
        ratio = (it - WARMUP) / (MAX_ITERS - WARMUP)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr0 - min_lr)

    def summed_clipped_grad(micro_batches):
        names = list(P)
        leaves = [P[n].detach().requires_grad_(True) for n in names]
        total, losses = None, []
        for x, y in micro_batches:  # loss.backward() per micro-step: the gradients add up
            loss = gpt2_loss(dict(zip(names, leaves, strict=True)), x, y)
            g = torch.autograd.grad(loss, leaves)
            total = g if total is None else [a + b for a, b in zip(total, g, strict=True)]
            losses.append(loss.item())
        norm = math.sqrt(sum(float((t * t).sum()) for t in total))
        coef = min(1.0, GRAD_CLIP / (norm + 1e-6))
        return {n: t * coef for n, t in zip(names, total, strict=True)}, losses

    state = {n: {} for n in P}
    g_prev = {n: torch.zeros_like(p) for n, p in P.items()}
    losses = []
    for it in range(MAX_ITERS + 1):
        lr = get_lr(it)
        ahead = summed_clipped_grad(batches[it + 1])[0] if exact else None  # before the current grad
        g, step_losses = summed_clipped_grad(batches[it])
        losses.append(sum(step_losses) / len(step_losses))
        with torch.no_grad():
            for n, p in P.items():
                if p.ndim == 2:  # MARS; embeddings sit in the no-weight-decay group
                    wd = 0.0 if n in ("transformer.wte.weight", "transformer.wpe.weight") else o.weight_decay
                    ref.mars(
                        p, g[n], g_prev[n], state[n], mars_type="mars-adamw", lr=lr, betas=tuple(o.betas),
                        eps=o.eps, wd=wd, gamma=o.gamma, clip=True, matrix=True,
                    )  # fmt: skip
                else:  # 1-D: AdamW at lr * lr_1d / lr, whatever the group's weight decay
                    ref.adamw(
                        p, g[n], state[n], lr=lr * o.lr_1d / lr0, betas=tuple(o.betas_1d), eps=o.eps,
                        wd=o.weight_decay_1d,
                    )  # fmt: skip
        g_prev = ahead if exact else g
    return losses, P


# ----------------------------------------------------------------------------- the comparison


@pytest.mark.parametrize("exact", [False, True], ids=["approx", "exact"])
def test_paper_preset_trains_like_the_reference_loop(data_root, tmp_path, float64, exact):
    tr = preset_trainer(data_root, tmp_path, exact)
    assert tr.exact is exact and tr.accum_steps == MICRO_STEPS
    with torch.no_grad():  # wider MLP inputs, where the tanh and exact GELU differ (by ~1e-4, not ~1e-8)
        for block in tr.raw_model.transformer.h:
            block.mlp.c_fc.weight.mul_(10)
    init = {k: v.detach().clone() for k, v in tr.raw_model.state_dict().items()}
    assert init["transformer.wte.weight"].dtype == torch.float64
    batches = [tr.loader.get(t) for t in range(MAX_ITERS + 2)]

    losses, norms, lrs = [], [], []
    for _ in range(MAX_ITERS + 1):
        out = tr.train_step()
        assert torch.isfinite(out.grad_norm)  # taken
        losses.append(out.loss_sum.item() / MICRO_STEPS)
        norms.append(out.grad_norm.item())
        lrs.append(out.lr)
    assert tr.state.step == tr.cfg.train.max_steps == MAX_ITERS + 1
    # the schedule's end points: lr 0 at the first step, the peak at WARMUP, min_lr at the last
    assert (lrs[0], lrs[WARMUP], lrs[-1]) == (0.0, tr.cfg.optimizer.lr, pytest.approx(tr.cfg.schedule.min_lr))
    assert min(norms) < GRAD_CLIP < max(norms), norms  # clipped and unclipped steps both occur

    ref_losses, ref_weights = reference_run(init, batches, tr.cfg.optimizer, tr.cfg.schedule, exact)
    assert losses[-1] < losses[0] - 0.1  # it trains
    diff = max(abs(a - b) for a, b in zip(losses, ref_losses, strict=True))
    assert diff < TOL, (diff, losses, ref_losses)
    ours = tr.raw_model.state_dict()
    for name, w in ref_weights.items():
        torch.testing.assert_close(ours[name], w, rtol=0, atol=TOL, msg=name)
