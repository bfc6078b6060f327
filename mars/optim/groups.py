"""Parameter grouping as the reference does it, in one of two styles (each registered optimizer says which;
mars.optim.param_groups(model, name) groups for a registered name).

Grouping (docs/algorithms.md sections 2-4):
- "decay" (adamw, lion, mars_adamw, mars_lion, mars_shampoo): two groups, decay (matrices that are not
  embeddings: Linear weights, an untied output head) with the configured weight decay, and
  no-decay (embeddings, LayerNorm weights, biases) with 0. MARS routes the no-decay group's 1-D
  tensors through its AdamW path with weight_decay_1d, as the reference does.
- "matrix" (muon, moonlight, mars_m): hidden matrices (ndim >= 2, not an embedding or the head) with
  use_muon=True; embeddings, the head and every tensor of fewer than 2 dims with use_muon=False.
A parameter shared by two modules (GPT's lm_head tied to wte) is listed once, under its first name,
and counts as an embedding. Which parameters are embeddings and which the output head: the model's
architecture says (its spec's param_roles, mars.model.spec); for any other module, names and
nn.Embedding decide.
"""

from __future__ import annotations

from torch import nn

GROUPINGS = ("decay", "matrix")
EMBEDDING_NAMES = frozenset({"wte", "wpe", "embed_tokens", "embed_positions", "embedding", "embeddings"})
HEAD_NAMES = frozenset({"lm_head"})


def _special_params(model: nn.Module) -> tuple[set[int], set[int]]:
    """ids of embedding parameters and of output-head ones: the architecture's param_roles, else
    nn.Embedding or an embedding-like name."""
    from mars.model.spec import spec_of

    try:
        roles = spec_of(model).param_roles(model)
    except TypeError:  # not a model of a registered architecture
        roles = None
    if roles is not None:
        params = dict(model.named_parameters())
        return (
            {id(params[n]) for n, r in roles.items() if r == "embedding"},
            {id(params[n]) for n, r in roles.items() if r == "head"},
        )
    embeddings, heads = set(), set()
    for module_name, module in model.named_modules():
        for param_name, p in module.named_parameters(recurse=False):
            parts = set(f"{module_name}.{param_name}".split("."))
            if isinstance(module, nn.Embedding) or parts & EMBEDDING_NAMES:
                embeddings.add(id(p))
            if parts & HEAD_NAMES:
                heads.add(id(p))
    return embeddings, heads


def grouped(model: nn.Module, grouping: str, weight_decay: float | None = None, *, name: str) -> list[dict]:
    """The reference's param groups of `model` in the `grouping` style (trainable parameters only), for
    the optimizer `name`. weight_decay sets the decay group's value ("decay"; otherwise the optimizer's
    default applies); the matrix optimizers take theirs from the constructor."""
    embeddings, heads = _special_params(model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if grouping == "matrix":
        if weight_decay is not None:
            raise ValueError(f"param_groups: weight_decay is set on the {name} constructor, not per group")
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
