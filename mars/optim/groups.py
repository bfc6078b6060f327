"""Parameter grouping as the reference does it, and `build_optimizer` from a plain config.

Grouping (docs/algorithms.md sections 2-4):
- adamw, lion, mars_adamw, mars_lion, mars_shampoo: two groups, decay (matrices that are not
  embeddings: Linear weights, an untied output head) with the configured weight decay, and
  no-decay (embeddings, LayerNorm weights, biases) with 0. MARS routes the no-decay group's 1-D
  tensors through its AdamW path with weight_decay_1d, as the reference does.
- muon, moonlight, mars_m: hidden matrices (ndim >= 2, not an embedding or the head) with
  use_muon=True; embeddings, the head and every tensor of fewer than 2 dims with use_muon=False.
A parameter shared by two modules (GPT's lm_head tied to wte) is listed once, under its first name,
and counts as an embedding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
from torch import nn

from .config import OptimizerConfig
from .lion import Lion
from .mars import MARS
from .mars_m import MARSM
from .muon import Moonlight, Muon

OPTIMIZER_NAMES = ("adamw", "lion", "muon", "moonlight", "mars_adamw", "mars_lion", "mars_shampoo", "mars_m")
MATRIX_OPTIMIZERS = ("muon", "moonlight", "mars_m")
EMBEDDING_NAMES = frozenset({"wte", "wpe", "embed_tokens", "embed_positions", "embedding", "embeddings"})
HEAD_NAMES = frozenset({"lm_head"})


def _check_name(name: str) -> None:
    if name not in OPTIMIZER_NAMES:
        raise ValueError(f"unknown optimizer name {name!r}: expected one of {', '.join(OPTIMIZER_NAMES)}")


def _special_params(model: nn.Module) -> tuple[set[int], set[int]]:
    """ids of embedding parameters (nn.Embedding or an embedding-like name) and of output-head ones."""
    embeddings, heads = set(), set()
    for module_name, module in model.named_modules():
        for param_name, p in module.named_parameters(recurse=False):
            parts = set(f"{module_name}.{param_name}".split("."))
            if isinstance(module, nn.Embedding) or parts & EMBEDDING_NAMES:
                embeddings.add(id(p))
            if parts & HEAD_NAMES:
                heads.add(id(p))
    return embeddings, heads


def param_groups(model: nn.Module, optimizer_name: str, weight_decay: float | None = None) -> list[dict]:
    """The reference's param groups of `model` for `optimizer_name` (trainable parameters only).

    weight_decay sets the decay group's value for adamw, lion and the MARS types (otherwise the
    optimizer's default applies); the matrix optimizers take theirs from the constructor.
    """
    _check_name(optimizer_name)
    embeddings, heads = _special_params(model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if optimizer_name in MATRIX_OPTIMIZERS:
        if weight_decay is not None:
            raise ValueError(
                f"param_groups: weight_decay is set on the {optimizer_name} constructor, not per group"
            )
        hidden = [p for _, p in named if p.ndim >= 2 and id(p) not in embeddings and id(p) not in heads]
        hidden_ids = {id(p) for p in hidden}
        rest = [p for _, p in named if id(p) not in hidden_ids]
        groups = [{"params": hidden, "use_muon": True}, {"params": rest, "use_muon": False}]
    else:
        decay = [p for _, p in named if p.ndim >= 2 and id(p) not in embeddings]
        decay_ids = {id(p) for p in decay}
        no_decay = [p for _, p in named if id(p) not in decay_ids]
        groups = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        if weight_decay is not None:
            groups[0]["weight_decay"] = weight_decay
    return [g for g in groups if g["params"]] or groups[:1]


def _as_config(cfg) -> OptimizerConfig:
    if isinstance(cfg, OptimizerConfig):
        return cfg
    if not isinstance(cfg, Mapping):
        raise TypeError(
            f"build_optimizer: expected an OptimizerConfig or a mapping, got {type(cfg).__name__}"
        )
    fields = {f.name for f in dataclasses.fields(OptimizerConfig)}
    unknown = sorted(set(cfg) - fields)
    if unknown:
        raise ValueError(
            f"build_optimizer: unknown optimizer key(s) {', '.join(map(repr, unknown))}; "
            f"valid keys: {', '.join(sorted(fields))}"
        )
    values = {k: (tuple(v) if k.startswith("betas") else v) for k, v in cfg.items()}
    return OptimizerConfig(**values)


def _torch_fused_ok(model: nn.Module) -> bool:
    return all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in model.parameters())


def build_optimizer(model: nn.Module, cfg) -> torch.optim.Optimizer:
    """Build the optimizer `cfg.name` over `model` with the reference grouping.

    cfg is an OptimizerConfig or a mapping of its keys (missing keys take OptimizerConfig's
    defaults). Keys an optimizer does not use are ignored; for muon the AdamW side uses lr_1d,
    betas_1d and weight_decay_1d; moonlight and mars_m use lr and weight_decay on both sides and
    betas_1d for AdamW; the matrix optimizers use momentum, not betas.
    """
    c = _as_config(cfg)
    _check_name(c.name)
    betas, betas_1d = tuple(c.betas), tuple(c.betas_1d)
    if c.name in MATRIX_OPTIMIZERS:
        groups = param_groups(model, c.name)
    else:
        groups = param_groups(model, c.name, weight_decay=c.weight_decay)
    if c.name == "adamw":
        fused = _torch_fused_ok(model) if c.fused is None else c.fused
        opt = torch.optim.AdamW(
            groups, lr=c.lr, betas=betas, eps=c.eps, weight_decay=c.weight_decay, fused=fused
        )
        opt.needs_previous_grads = False
        return opt
    if c.name == "lion":
        return Lion(groups, lr=c.lr, betas=betas, weight_decay=c.weight_decay, fused=c.fused)
    if c.name == "muon":
        return Muon(
            groups,
            lr=c.lr,
            momentum=c.momentum,
            nesterov=c.nesterov,
            ns_steps=c.ns_steps,
            weight_decay=c.weight_decay,
            adamw_lr=c.lr_1d,
            adamw_betas=betas_1d,
            adamw_eps=c.eps,
            adamw_wd=c.weight_decay_1d,
            fused=c.fused,
        )
    if c.name == "moonlight":
        return Moonlight(
            groups,
            lr=c.lr,
            wd=c.weight_decay,
            momentum=c.momentum,
            nesterov=c.nesterov,
            ns_steps=c.ns_steps,
            adamw_betas=betas_1d,
            adamw_eps=c.eps,
            fused=c.fused,
        )
    if c.name == "mars_m":
        return MARSM(
            groups,
            lr=c.lr,
            wd=c.weight_decay,
            momentum=c.momentum,
            ns_steps=c.ns_steps,
            adamw_betas=betas_1d,
            adamw_eps=c.eps,
            gamma=c.gamma,
            clip_c=c.clip_c and not c.lean,
            is_approx=c.approx,
            lean=c.lean,
            fused=c.fused,
        )
    return MARS(
        groups,
        lr=c.lr,
        betas=betas,
        eps=c.eps,
        weight_decay=c.weight_decay,
        gamma=c.gamma,
        is_approx=c.approx,
        mars_type=c.name.replace("_", "-"),
        optimize_1d=c.optimize_1d,
        lr_1d=c.lr_1d,
        betas_1d=betas_1d,
        weight_decay_1d=c.weight_decay_1d,
        clip_c=c.clip_c,
        two_dim_rule=c.two_dim_rule,
        fused=c.fused,
    )
