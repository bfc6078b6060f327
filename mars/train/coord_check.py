"""The coordinate check of muP (Yang et al. 2022, "Tensor Programs V", section D.4): train a model for a
few steps at several widths and watch the size of its activations. Under muP the mean absolute
coordinate of every layer kind stays the same as the width grows; under SP the blocks' outputs and the
logits grow with it once the updates count (with Adam, a hidden matrix's update moves its output by
lr x width). scripts/coord_check.py draws it; docs/mup.md shows the figure.

    records = coord_data(model_overrides, widths, ("sp", "mup"), {"name": "adamw", "lr": 1e-2}, tokens)
    slope(records, "mup", "logits", step)   # d log mean|x| / d log width, least squares over the widths

The layer kinds, each the mean absolute value of all its coordinates on a fixed batch, averaged over
the blocks: "embedding" (what the first block receives: the token and position embeddings), "attention"
and "mlp" (each block's attention and MLP outputs, before the residual sum), "logits". Step t is after
t optimizer steps at a constant lr (t = 0: the initialisation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

KINDS = ("embedding", "attention", "mlp", "logits")
ATTENTION_NAMES, MLP_NAMES = ("attn", "self_attn"), ("mlp",)


@dataclass(frozen=True)
class Record:
    parametrization: str
    width: int
    seed: int
    step: int
    kind: str
    value: float  # mean |x|


def _taps(model) -> dict[str, list]:
    """The modules whose outputs each kind averages (the embedding: the first block's input)."""
    from mars.model.spec import spec_of

    blocks = list(spec_of(model).blocks(model))
    out = {"attention": [], "mlp": []}
    for block in blocks:
        for name, module in block.named_children():
            if name in ATTENTION_NAMES:
                out["attention"].append(module)
            elif name in MLP_NAMES:
                out["mlp"].append(module)
    if not out["attention"] or not out["mlp"]:
        raise ValueError(
            f"{type(model).__name__}: the coordinate check finds a block's attention "
            f"({', '.join(ATTENTION_NAMES)}) and MLP ({', '.join(MLP_NAMES)}) by their names; its blocks "
            f"have {', '.join(n for n, _ in blocks[0].named_children())}"
        )
    return {"embedding": [blocks[0]], **out}


@torch.no_grad()
def measure(model, x: torch.Tensor) -> dict[str, float]:
    """Mean |coordinate| of every layer kind of `model` on the batch x (eval mode, no gradient)."""
    sums: dict[str, list[float]] = {k: [] for k in KINDS}
    hooks = []
    for kind, modules in _taps(model).items():
        for module in modules:
            if kind == "embedding":
                hook = module.register_forward_pre_hook(lambda m, args, k=kind: sums[k].append(_l1(args[0])))
            else:
                hook = module.register_forward_hook(lambda m, args, out, k=kind: sums[k].append(_l1(out)))
            hooks.append(hook)
    was_training = model.training
    model.eval()
    try:
        logits, _ = model(x)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    sums["logits"].append(_l1(logits))
    return {k: sum(v) / len(v) for k, v in sums.items()}


def _l1(t: torch.Tensor) -> float:
    return float(t.detach().float().abs().mean())


def batches(tokens: torch.Tensor, batch_size: int, block_size: int, steps: int, seed: int) -> list:
    """steps + 1 batches of (batch_size, block_size + 1) windows of the 1-D token stream, drawn with `seed`
    (the first is the fixed batch every step is measured on)."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(tokens) - block_size - 1, (steps + 1, batch_size), generator=g)
    return [torch.stack([tokens[s : s + block_size + 1] for s in row.tolist()]) for row in starts]


def coord_data(
    model: dict,
    widths: Sequence[int],
    parametrizations: Sequence[str],
    optimizer: dict,
    tokens: torch.Tensor,
    *,
    steps: int = 5,
    seeds: Sequence[int] = (0,),
    batch_size: int = 8,
) -> list[Record]:
    """Train `model` (model.* keys, with model.n_embd set to each width and model.parametrization to each
    of `parametrizations`) for `steps` steps of `optimizer` (an optimizer config mapping with its name)
    at a constant lr, from each seed, on batches of `tokens`; the activations' sizes after each step."""
    from mars.model.spec import model_config
    from mars.optim import build_optimizer
    from mars.train.trainer import build_model

    out = []
    for parametrization in parametrizations:
        for width in widths:
            config = model_config({**model, "n_embd": int(width), "parametrization": parametrization})
            for seed in seeds:
                net = build_model(config, torch.device("cpu"), seed)
                opt = build_optimizer(net, optimizer)
                data = batches(tokens, batch_size, config.block_size, steps, seed)
                fixed = data[0][:, :-1]
                for step in range(steps + 1):
                    for kind, value in measure(net, fixed).items():
                        out.append(Record(parametrization, int(width), seed, step, kind, value))
                    if step == steps:
                        break
                    batch = data[step]
                    _, loss = net(batch[:, :-1], batch[:, 1:])
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
    return out


def curve(records: Sequence[Record], parametrization: str, kind: str, step: int) -> list[tuple[int, float]]:
    """(width, mean over seeds of mean |x|), by width."""
    by_width: dict[int, list[float]] = {}
    for r in records:
        if (r.parametrization, r.kind, r.step) == (parametrization, kind, step):
            by_width.setdefault(r.width, []).append(r.value)
    return sorted((w, sum(v) / len(v)) for w, v in by_width.items())


def slope(records: Sequence[Record], parametrization: str, kind: str, step: int) -> float:
    """The least-squares slope of log mean|x| against log width: 0 flat, 1 proportional to the width."""
    pts = [(math.log(w), math.log(v)) for w, v in curve(records, parametrization, kind, step) if v > 0]
    if len(pts) < 2:
        return math.nan
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def figure(records: Sequence[Record], path, title: str = ""):
    """One panel per layer kind (rows) and parametrization (columns): mean |x| against width, log-log,
    one line per step (darker: later); each panel's title gives the last step's slope."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    params = list(dict.fromkeys(r.parametrization for r in records))
    steps = sorted({r.step for r in records})
    size = (4.2 * len(params), 2.6 * len(KINDS))
    fig, axes = plt.subplots(len(KINDS), len(params), figsize=size, squeeze=False)
    cmap = plt.get_cmap("viridis")
    for j, p in enumerate(params):
        for i, kind in enumerate(KINDS):
            ax = axes[i][j]
            for k, step in enumerate(steps):
                pts = curve(records, p, kind, step)
                color = cmap(k / max(1, len(steps) - 1))
                xs, ys = [w for w, _ in pts], [v for _, v in pts]
                ax.plot(xs, ys, "o-", ms=3, color=color, label=f"step {step}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            last = slope(records, p, kind, steps[-1])
            ax.set_title(f"{p}: {kind} (slope {last:+.2f} at step {steps[-1]})", fontsize=9)
            if i == len(KINDS) - 1:
                ax.set_xlabel("width (n_embd)")
            if j == 0:
                ax.set_ylabel("mean |x|")
    axes[0][-1].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
