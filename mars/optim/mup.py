"""muP's side of the optimizers: the lr and weight-decay multiplier of every parameter of a muP model
(mars.model.mup), per registered optimizer, and the param groups that carry them.

Each optimizer registers its rule (`register(..., mup=RULE)`): a function of a parameter's role
(mars.model.spec's embedding / head / hidden / vector), its shape and its shape in the base model,
returning its lr multiplier. r is the fan-in ratio (fan-in over the base's), m = n_embd / base width.

    ELEMENTWISE   (AdamW, Lion, MARS-AdamW, MARS-Lion; and the AdamW side of the matrix optimizers)
                  an update of O(1) per entry: hidden matrices x 1/r, everything else x 1
    MATRIX_REFERENCE, MATRIX_MOONLIGHT  (Muon; Moonlight, MARS-M: hidden matrices orthogonalised)
                  the update lr * scale(rows, cols) * O, O orthogonal: muP needs the spectral norm of a
                  hidden matrix's update to stay fixed, so the shape rule is evaluated at the BASE shape:
                  multiplier = scale(base shape) / scale(shape). Muon's sqrt(max(1, rows/cols)) has the
                  same value at every width (x 1); Moonlight's 0.2 sqrt(max(rows, cols)) grows as sqrt(m)
                  (x 1/sqrt(r)). The other tensors take AdamW: ELEMENTWISE (x 1).
    MARS-Shampoo  refused (NO_SHAMPOO): it orthogonalises the embedding and a tied head as well

The weight decay follows the lr inversely (multiplier 1/lr multiplier): the decay a step applies,
lr x weight_decay, is the same at every width ("independent" weight decay, Wortsman et al. 2023), so a
weight decay tuned at the base transfers. docs/mup.md derives each rule and shows the coordinate check.

The multipliers go into the param groups once, when the optimizer is built (groups of equal
multipliers; `lr_mult` and `wd_mult` kept in each group): mars.optim.set_lr_factor scales every group
from its initial lr, so the schedule composes with them, and a step costs what it cost under SP.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .rules import orthogonal_scale

# rule(role, shape, base_shape) -> lr multiplier
Rule = Callable[[str, tuple, tuple], float]


def _matrix(shape: tuple) -> tuple[int, int]:
    return shape[0], math.prod(shape[1:])


def _fan_in_ratio(shape: tuple, base: tuple) -> float:
    return _matrix(shape)[1] / _matrix(base)[1]


def ELEMENTWISE(role: str, shape: tuple, base: tuple) -> float:  # noqa: N802 - a rule, named like a constant
    """Adam- and sign-type updates: hidden matrices x 1/r (the base fan-in over the fan-in)."""
    return 1.0 / _fan_in_ratio(shape, base) if role == "hidden" else 1.0


def _orthogonal(form: str, shape: tuple, base: tuple) -> float:
    return orthogonal_scale(form, *_matrix(base)) / orthogonal_scale(form, *_matrix(shape))


def _matrix_rule(form: str) -> Rule:
    def rule(role: str, shape: tuple, base: tuple) -> float:
        if role == "hidden":
            return _orthogonal(form, shape, base)
        return ELEMENTWISE(role, shape, base)

    rule.__name__ = rule.__qualname__ = f"MATRIX_{form.upper()}"
    rule.__doc__ = f"Hidden matrices orthogonalised, the {form} shape rule at the base shape; the rest AdamW."
    return rule


MATRIX_REFERENCE = _matrix_rule("reference")
MATRIX_MOONLIGHT = _matrix_rule("moonlight")


# MARS-Shampoo's reason, as its registered `mup`: no rule scales its update for muP (docs/mup.md).
NO_SHAMPOO = (
    "MARS-Shampoo orthogonalises the embedding matrix (and GPT-2's tied head) too, and no lr multiplier "
    "keeps that update's effect fixed across widths (with a tied head, the embedding and the logits need "
    "different ones; the coordinate check shows the logits shrinking); use mars_adamw or mars_m, or "
    "model.parametrization=sp"
)


def refusal(name: str, rule: Rule | str | None) -> str | None:
    """Why optimizer `name`, registered with muP rule `rule` (its `mup`), cannot train a muP model (one line
    naming the fix), or None."""
    if isinstance(rule, str):
        return f"optimizer={name} does not support model.parametrization=mup: {rule}"
    if rule is None:
        return (
            f"optimizer={name} has no muP rule (model.parametrization=mup): register it with "
            "mup=mars.optim.mup.ELEMENTWISE (or another rule of mars.optim.mup), or train with "
            "model.parametrization=sp"
        )
    return None


def split(model, groups: list[dict], rule: Rule | None, name: str) -> list[dict]:
    """The param groups of a muP model (the model's own `groups`, unchanged under SP) split into groups of
    equal multipliers, each with `lr_mult` and `wd_mult`; ValueError when `rule` is None (an optimizer
    registered without one)."""
    from mars.model import mup
    from mars.model.spec import spec_of

    if not mup.is_mup(getattr(model, "config", None)):
        return groups
    if not callable(rule):
        raise ValueError(refusal(name, rule))
    roles = spec_of(model).param_roles(model)
    base = mup.base_shapes(model)
    names = {id(p): n for n, p in model.named_parameters()}
    out = []
    for group in groups:
        parts: dict[float, list] = {}
        for p in group["params"]:
            n = names[id(p)]
            parts.setdefault(float(rule(roles[n], tuple(p.shape), base[n])), []).append(p)
        for mult, params in parts.items():
            out.append({**group, "params": params, "lr_mult": mult, "wd_mult": 1.0 / mult})
    return out


def resolve(groups: list[dict], lr: float, weight_decay: float | None) -> list[dict]:
    """Groups with `lr_mult` get lr = lr x lr_mult, and weight_decay x wd_mult on the value they hold or
    else `weight_decay` (the constructor's); the multipliers stay in the group (the logged lr divides by
    lr_mult: the schedule's lr). A group whose lr another default sets (Muon's lr_1d for its AdamW
    group) has lr_mult 1 and keeps it."""
    out = []
    for group in groups:
        group = dict(group)
        if group.get("lr_mult", 1.0) != 1.0:
            group["lr"] = lr * group["lr_mult"]
        if group.get("wd_mult", 1.0) != 1.0:
            wd = group.get("weight_decay", weight_decay)
            if wd is not None:
                group["weight_decay"] = wd * group["wd_mult"]
        out.append(group)
    return out


def base_lr(group: dict) -> float:
    """A group's lr over its muP multiplier: the schedule's lr (what the training log reports)."""
    return float(group["lr"]) / float(group.get("lr_mult", 1.0))
