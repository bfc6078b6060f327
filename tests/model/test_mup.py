"""muP (mars.model.mup, mars.optim.mup; docs/mup.md) against a hand-written reference for both families:
the initialisation, the attention and output multipliers, every optimizer's lr and weight-decay
multipliers; equality with SP at the base width; the export as an SP model; the bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from mars.model import mup
from mars.model.spec import model_config
from mars.optim import build_optimizer, optimizer_names, registered, set_lr_factor
from mars.optim.mup import base_lr
from mars.train.trainer import build_model

BASE, WIDTH = 16, 64  # m = 4
FAMILIES = {
    "gpt2": {"arch": "gpt2", "n_layer": 2, "n_head": 2, "block_size": 8, "vocab_size": 96},
    # the SwiGLU width: 8/3 x 16 = 42 -> 48 at the base, 8/3 x 64 = 170 -> 176 (multiple_of 8): r = 11/3
    "llama": {
        "arch": "llama",
        "n_layer": 2,
        "n_head": 2,
        "n_kv_head": 1,
        "block_size": 8,
        "vocab_size": 96,
        "multiple_of": 8,
        "tie_embeddings": False,
    },  # fmt: skip
}
RULED = [n for n in optimizer_names() if n != "mars_shampoo"]


def config(family: str, width: int = WIDTH, parametrization: str = "mup", **more):
    return model_config({**FAMILIES[family], "n_embd": width, "parametrization": parametrization,
                         "mup_base_width": BASE if parametrization == "mup" else None, **more})  # fmt: skip


def hidden(family: str) -> dict[str, float]:
    """The hand-written fan-in ratio r of each block matrix (the rest are embeddings, head, vectors)."""
    if family == "gpt2":
        names = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
        return {f"transformer.h.{i}.{n}.weight": 4.0 for i in range(2) for n in names}
    r = {f"self_attn.{n}": 4.0 for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    r.update({"mlp.gate_proj": 4.0, "mlp.up_proj": 4.0, "mlp.down_proj": 176 / 48})
    return {f"model.layers.{i}.{n}.weight": v for i in range(2) for n, v in r.items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_initialisation_is_sps_with_hidden_matrices_over_sqrt_r(family):
    ours = build_model(config(family), torch.device("cpu"), seed=3)
    sp = build_model(config(family, parametrization="sp"), torch.device("cpu"), seed=3)
    ratios = hidden(family)
    assert mup.fan_in_ratios(ours) == pytest.approx(ratios)
    theirs = dict(sp.named_parameters())
    for name, p in ours.named_parameters():  # the same draws, each matrix's std divided by sqrt(r)
        torch.testing.assert_close(p, theirs[name] / math.sqrt(ratios.get(name, 1.0)), rtol=1e-6, atol=0)


def reference_attention(x, q, k, v, n_head, scale):
    """softmax(q k^T scale) v, causal, per head: written out, not scaled_dot_product_attention."""
    B, T, C = q.shape
    q, k, v = (t.view(B, T, n_head, -1).transpose(1, 2) for t in (q, k, v))
    att = (q @ k.transpose(-2, -1)) * scale
    att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    return (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_scales_by_sqrt_d0_over_d_and_the_logits_by_1_over_m(family):
    model = build_model(config(family), torch.device("cpu"), seed=0)
    d, d0 = WIDTH // 2, BASE // 2
    x = torch.randn(2, 8, WIDTH)
    with torch.no_grad():
        if family == "gpt2":
            attn = model.transformer.h[1].attn  # layer 2: GPT-2 also divides q by the layer's index + 1
            q, k, v = attn.c_attn(x).split(WIDTH, dim=2)
            want = attn.c_proj(reference_attention(x, q / 2, k, v, 2, math.sqrt(d0) / d))
            final, head = model.transformer.ln_f, model.lm_head
        else:
            from mars.model.llama import apply_rope

            attn = model.model.layers[0].self_attn
            cos, sin = model.rope_cos[:8], model.rope_sin[:8]
            q = apply_rope(attn.q_proj(x).view(2, 8, 2, d).transpose(1, 2), cos, sin)
            k = apply_rope(attn.k_proj(x).view(2, 8, 1, d).transpose(1, 2), cos, sin)
            v = attn.v_proj(x).view(2, 8, 1, d).transpose(1, 2)
            k, v = k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1)  # one key/value head serves both
            q, k, v = (t.transpose(1, 2).reshape(2, 8, -1) for t in (q, k, v))
            want = attn.o_proj(reference_attention(x, q, k, v, 2, math.sqrt(d0) / d))
            final, head = model.model.norm, model.lm_head
        torch.testing.assert_close(attn(x) if family == "gpt2" else attn(x, cos, sin), want)
        idx = torch.randint(0, 96, (2, 8))
        seen = {}
        hook = final.register_forward_hook(lambda m, a, out: seen.setdefault("h", out))
        logits, _ = model(idx)
        hook.remove()
        torch.testing.assert_close(logits, head(seen["h"]) * BASE / WIDTH)


def reference_multipliers(family: str, optimizer: str) -> dict[str, float]:
    """The lr multiplier of every hidden matrix, by hand (docs/mup.md); 1 for every other tensor."""
    r = hidden(family)
    if optimizer in ("adamw", "lion", "mars_adamw", "mars_lion"):
        return {n: 1 / v for n, v in r.items()}
    if optimizer == "muon":  # sqrt(max(1, rows/cols)) is the same at the base shape (gate/up: rounding)
        up = math.sqrt(3 * 16 / 16) / math.sqrt(176 / 64)  # (48, 16) at the base, (176, 64) here
        return {n: up if n.endswith(("gate_proj.weight", "up_proj.weight")) else 1.0 for n in r}
    # moonlight, mars_m: 0.2 sqrt(max(rows, cols)) at the base shape over here
    shapes = {"c_attn": (48, 192), "c_proj": (16, 64), "c_fc": (64, 256), "q_proj": (16, 64),
              "k_proj": (16, 64), "v_proj": (16, 64), "o_proj": (16, 64), "gate_proj": (48, 176),
              "up_proj": (48, 176), "down_proj": (48, 176)}  # fmt: skip
    out = {}
    for n in r:
        base, here = shapes[n.split(".")[-2]]
        if n.endswith("mlp.c_proj.weight"):
            base, here = 64, 256
        out[n] = math.sqrt(base / here)
    return out


@pytest.mark.parametrize("optimizer", RULED)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_optimizers_group_multipliers_match_the_hand_written_rules(family, optimizer):
    model = build_model(config(family), torch.device("cpu"), seed=0)
    opt = build_optimizer(model, {"name": optimizer, "lr": 0.01})
    want = reference_multipliers(family, optimizer)
    names = {id(p): n for n, p in model.named_parameters()}
    for group in opt.param_groups:
        for p in group["params"]:
            mult = want.get(names[id(p)], 1.0)
            assert group["lr_mult"] == pytest.approx(mult), names[id(p)]
            assert group["wd_mult"] == pytest.approx(1 / mult)
        if group["lr_mult"] != 1.0:  # lr x weight decay as at the base: the decay transfers
            assert group["lr"] == pytest.approx(0.01 * group["lr_mult"])
            assert group["weight_decay"] == pytest.approx(opt.defaults["weight_decay"] / group["lr_mult"])
    before = [group["lr"] for group in opt.param_groups]
    set_lr_factor(opt, 0.25)  # the schedule scales every group from its own initial lr
    assert [group["lr"] for group in opt.param_groups] == pytest.approx([0.25 * lr for lr in before])
    assert base_lr(opt.param_groups[0]) == pytest.approx(0.0025)  # what the training log reports


@pytest.mark.parametrize("optimizer", RULED)
@pytest.mark.parametrize("family", FAMILIES)
def test_at_the_base_width_mup_is_sp_bit_for_bit(family, optimizer):
    """The same weights, multipliers of 1, the same losses over 3 steps, to the last bit."""
    runs = []
    for parametrization in ("sp", "mup"):
        model = build_model(config(family, BASE, parametrization), torch.device("cpu"), seed=1)
        opt = build_optimizer(model, {"name": optimizer, "lr": 0.01})
        idx = torch.randint(0, 96, (4, 9), generator=torch.Generator().manual_seed(0))
        losses = []
        for _ in range(3):
            _, loss = model(idx[:, :-1], idx[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        runs.append((losses, model.state_dict()))
    (a, sa), (b, sb) = runs
    assert a == b
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_hugging_face_export_is_the_sp_model_of_the_same_function(family):
    model = build_model(config(family), torch.device("cpu"), seed=0).eval()
    for p in model.parameters():  # trained-looking weights: the norms' gains away from 1
        p.data.add_(0.05 * torch.randn_like(p))
    idx = torch.randint(0, 96, (2, 8))
    sp = mup.as_sp(model)
    assert sp.config.parametrization == "sp" and not sp.training
    with torch.no_grad():
        torch.testing.assert_close(sp(idx)[0], model(idx)[0], rtol=1e-5, atol=1e-6)
        from mars.model.hf import to_hf

        hf = to_hf(model)
        torch.testing.assert_close(hf(idx).logits[..., :96], model(idx)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("family", "more", "message"),
    [
        ("gpt2", {"mup_base_width": 15}, "model.mup_base_width=15 is not a multiple of model.n_head=2"),
        ("gpt2", {"mup_base_width": None}, "model.parametrization=mup needs model.mup_base_width"),
        ("gpt2", {"parametrization": "ntk"}, "model.parametrization='ntk'"),
        ("llama", {"mlp_hidden": 128}, "model.mlp_hidden=128 is fixed"),
        ("llama", {"mup_base_width": 6}, "odd head size 3"),
    ],
)
def test_bad_mup_settings_are_one_line_naming_the_key(family, more, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as e:
        from mars.model.spec import validate_model

        validate_model({**FAMILIES[family], "n_embd": WIDTH, "parametrization": "mup", "mup_base_width": BASE,
                        **more})  # fmt: skip
    assert "\n" not in str(e.value)


def test_an_optimizer_without_a_mup_rule_is_refused_in_one_line():
    from mars.optim.mup import refusal

    why = refusal("mars_shampoo", registered("mars_shampoo").mup)
    assert "MARS-Shampoo orthogonalises the embedding" in why
    model = build_model(config("gpt2"), torch.device("cpu"), seed=0)
    with pytest.raises(ValueError, match="optimizer=mars_shampoo does not support model.parametrization=mup"):
        build_optimizer(model, {"name": "mars_shampoo"})
    assert all(refusal(n, registered(n).mup) is None for n in RULED)


def test_the_step_is_one_computation_whatever_the_width_and_has_no_per_layer_number():
    """muP adds one Python float per model (the same in every block: one compilation) and no buffer."""
    model = build_model(config("gpt2", n_layer=4), torch.device("cpu"), seed=0)
    scales = {b.attn.scale for b in model.transformer.h}
    assert len(scales) == 1 and scales.pop() == pytest.approx(math.sqrt(8) / 32)
    assert {n for n, _ in model.named_buffers()} == {f"transformer.h.{i}.attn.layer_div" for i in range(4)}
