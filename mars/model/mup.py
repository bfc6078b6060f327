"""muP, the maximal update parametrization (Yang & Hu 2021; Yang et al. 2022, "Tensor Programs V"), for
every architecture whose config has the keys `parametrization` and `mup_base_width` (GPT-2, LLaMA):
the model's side of it. The optimizers' side, the lr and weight-decay multipliers of each parameter
group, is mars.optim.mup; docs/mup.md has the rules with their derivation and the coordinate check.

    model.parametrization=sp     the standard parametrization (the default; the reference runs')
    model.parametrization=mup    muP relative to a base model: this config with n_embd = mup_base_width

The base model keeps every other key: the same depth and heads (so the head dimension d scales with the
width), LLaMA's SwiGLU width from its 8/3 rule. m = n_embd / mup_base_width; for each weight matrix, r
is its fan-in over the same matrix's fan-in in the base model (m, up to LLaMA's rounding of the SwiGLU
width). Against SP:

    hidden matrices        init std / sqrt(r)        (what stays O(1) is the update, not the weight)
    embeddings, head       init as SP
    attention logits       q.k sqrt(d0) / d           (SP: q.k / sqrt(d); d0 the base model's d)
    output logits          x 1/m                      (applied to the final norm's output)
    per-group lr / wd      mars.optim.mup             (hidden matrices x 1/r under AdamW, ...)

At the base width (m = r = 1) every factor is 1: muP is SP exactly, bit for bit. No depth rule: the
residual projections keep SP's 1/sqrt(2 n_layer), so transfer across depth is not claimed.
Nothing here adds a per-layer number: the attention scale and the output multiplier are one Python
float per model (identical in every block, so torch.compile compiles one block for all).

A Hugging Face model has no multiplier: export folds both into the weights (`as_sp`: q's rows times
sqrt(d0 / d), the final norm's gain and shift times 1/m), which computes the same function as SP.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

PARAMETRIZATIONS = ("sp", "mup")


def is_mup(config: Any) -> bool:
    return getattr(config, "parametrization", "sp") == "mup"


def check(config: Any) -> None:
    """The muP keys of an architecture's config: ValueError "model.KEY=VALUE ...; fix" (one line)."""
    from mars.checks import at_least, choice

    choice("model.parametrization", config.parametrization, PARAMETRIZATIONS)
    base = config.mup_base_width
    if not is_mup(config):
        return
    if base is None:
        raise ValueError(
            "model.parametrization=mup needs model.mup_base_width: the width the hyperparameters were tuned "
            f"at (e.g. model.mup_base_width={config.n_embd} for this width)"
        )
    at_least("model.mup_base_width", base, 1)
    if base % config.n_head:
        lo = max(config.n_head, base // config.n_head * config.n_head)
        raise ValueError(
            f"model.mup_base_width={base} is not a multiple of model.n_head={config.n_head}: the base model "
            f"keeps the heads, so its width must split into them; choose a multiple such as {lo}"
        )


def base_config(config: Any) -> Any:
    """The base model's config: this one with n_embd = mup_base_width, built as SP."""
    return dataclasses.replace(config, n_embd=config.mup_base_width, parametrization="sp")


def attention_scale(config: Any) -> float | None:
    """muP's softmax scale of q.k, sqrt(d0)/d (d0: the base model's head size); None under SP and at the
    base width, where the architecture keeps its own 1/sqrt(d) (the same number, to the last bit)."""
    if not is_mup(config) or config.n_embd == config.mup_base_width:
        return None
    return math.sqrt(config.mup_base_width // config.n_head) / (config.n_embd // config.n_head)


def attention_fold(config: Any) -> float:
    """sqrt(d0 / d): muP's attention scale over SP's, what as_sp multiplies q by (1 under SP)."""
    if attention_scale(config) is None:
        return 1.0
    return math.sqrt((config.mup_base_width // config.n_head) / (config.n_embd // config.n_head))


def output_multiplier(config: Any) -> float:
    """What the logits are multiplied by: 1/m (1 under SP and at the base width)."""
    return config.mup_base_width / config.n_embd if is_mup(config) else 1.0


def base_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """{parameter name: its shape in the base model} (a muP model's), built on the meta device."""
    import torch

    from mars.model.spec import spec_of

    base = spec_of(model).model.empty(base_config(model.config), torch.device("meta"))
    return {n: tuple(p.shape) for n, p in base.named_parameters()}


def fan_in_ratios(model: Any) -> dict[str, float]:
    """{parameter name: r} for every hidden matrix (role "hidden" of the architecture's param_roles):
    its fan-in (the product of all dims but the first) over the base model's. Empty under SP."""
    from mars.model.spec import spec_of

    if not is_mup(model.config):
        return {}
    base = base_shapes(model)
    params = dict(model.named_parameters())
    return {
        name: math.prod(params[name].shape[1:]) / math.prod(base[name][1:])
        for name, role in spec_of(model).param_roles(model).items()
        if role == "hidden"
    }


def init_factors(model: Any) -> dict[str, float]:
    """{parameter name: what SP's init std is multiplied by}: 1/sqrt(r) for the hidden matrices."""
    return {name: r**-0.5 for name, r in fan_in_ratios(model).items()}


def as_sp(model: Any) -> Any:
    """An SP model (a copy, on the model's device and dtype, in its train/eval mode) that computes what the
    muP `model` computes: the attention factor sqrt(d0/d) folded into q's rows, the output multiplier
    into the final norm (the model's fold_multipliers). An SP model is returned as it is."""
    from mars.model.spec import spec_of

    config = model.config
    if not is_mup(config):
        return model
    attn, out = attention_fold(config), output_multiplier(config)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.fold_multipliers(state, attn, out)
    first = next(iter(model.parameters()))
    sp_config = dataclasses.replace(config, parametrization="sp", mup_base_width=None)
    sp = spec_of(model).model.empty(sp_config, first.device, dtype=first.dtype)
    sp.load_state_dict(state)
    return sp.train(model.training)
