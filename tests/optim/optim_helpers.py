"""Drivers for the optimizer tests: gradient sequences, running ours and the reference, error measures."""

from __future__ import annotations

import torch
from torch import nn

STEPS = 20
# A mix of matrices (one large enough for the compiled kernels: >= _kernels.FUSED_MIN_NUMEL entries;
# the rest take the multi-tensor path even when fused), 1-D and 3-D tensors.
SHAPES = [(6, 5), (4, 7), (256, 160), (5,), (3, 4, 2)]
# Gradient scales: some tensors' c has norm > 1 (clipped), others < 1 (not clipped).
SCALES = [1.0, 0.05, 0.02, 0.3, 0.05]


def make_params(shapes=SHAPES, dtype=torch.float32, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen).to(dtype) for s in shapes]


def gradient_sequence(shapes=SHAPES, steps=STEPS, scales=SCALES, dtype=torch.float32, seed=2):
    gen = torch.Generator().manual_seed(seed)
    return [
        [(torch.randn(s, generator=gen) * k).to(dtype) for s, k in zip(shapes, scales, strict=True)]
        for _ in range(steps)
    ]


def run_ours(make_opt, params0, grads, stashes=None):
    """Step an optimizer over a gradient sequence; in exact mode stash `stashes[t]` before step t."""
    params = [torch.nn.Parameter(p.clone()) for p in params0]
    opt = make_opt(params)
    for t, step_grads in enumerate(grads):
        if stashes is not None:
            for p, s in zip(params, stashes[t], strict=True):
                p.grad = s.clone()
            opt.stash_previous_grads()
        for p, g in zip(params, step_grads, strict=True):
            p.grad = g.clone()
        opt.step()
    return [p.detach() for p in params], opt


def previous_grads(grads, stashes, t, i):
    """g_prev at step t for tensor i: approx = last step's gradient, exact = the stash of step t-1."""
    if t == 0:
        return torch.zeros_like(grads[0][i])
    return (stashes if stashes is not None else grads)[t - 1][i]


def rel_err(actual, expected) -> float:
    """max |actual - expected| / max |expected| (norm-wise relative error of a tensor)."""
    return ((actual.float() - expected.float()).abs().max() / expected.float().abs().max()).item()


def displacement_err(actual, expected, start) -> float:
    """||actual - expected|| / ||expected - start||: error relative to how far the tensor moved."""
    a, e, s = actual.float(), expected.float(), start.float()
    return ((a - e).norm() / (e - s).norm()).item()


class Norm(nn.Module):
    """A LayerNorm-like module that is not nn.LayerNorm (nanoGPT defines its own)."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class TinyGPT(nn.Module):
    """nanoGPT's parameter names and tying at toy size: wte/wpe embeddings, blocks of ln/attn/mlp,
    ln_f, and lm_head sharing wte's weight. bias=True adds Linear biases. With d=96 the MLP
    matrices (36864 entries) are large enough for the compiled kernels."""

    def __init__(self, vocab=11, block=6, d=96, n_layer=1, bias=False):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(vocab, d)
        self.transformer.wpe = nn.Embedding(block, d)
        self.transformer.h = nn.ModuleList()
        for _ in range(n_layer):
            blk = nn.Module()
            blk.ln_1, blk.ln_2 = Norm(d), Norm(d)
            blk.attn = nn.Module()
            blk.attn.c_attn = nn.Linear(d, 3 * d, bias=bias)
            blk.attn.c_proj = nn.Linear(d, d, bias=bias)
            blk.mlp = nn.Module()
            blk.mlp.c_fc = nn.Linear(d, 4 * d, bias=bias)
            blk.mlp.c_proj = nn.Linear(4 * d, d, bias=bias)
            self.transformer.h.append(blk)
        self.transformer.ln_f = Norm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight


def set_random_grads(model, seed, scale=0.3):
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = (torch.randn(p.shape, generator=gen) * scale).to(p.dtype)


def applicable(name: str, **keys) -> dict:
    """An optimizer config mapping of `keys` that optimizer `name` takes (configs are strict)."""
    from mars.optim import registered

    taken = set(registered(name).config.keys())
    return {"name": name, **{k: v for k, v in keys.items() if k in taken}}
