"""The architecture registry (mars.model.spec): lookups, strict configs, and a third architecture
registered from outside the package, which the trainer's builder, the optimizers' grouping and the
checkpoint files then serve without further code."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mars.model import spec as spec_module
from mars.model.spec import ModelSpec, arch, arch_names, model_config, register_arch, spec_of


def test_the_built_in_architectures_and_their_configs():
    assert arch_names()[:2] == ("gpt2", "llama")
    assert arch("llama").title == "LLaMA" and arch("gpt2").hf_adapter == "mars.model.hf_gpt2"
    with pytest.raises(
        ValueError, match=r"model\.arch='mamba' is not a known architecture; choose one of gpt2, llama"
    ):
        arch("mamba")
    assert type(model_config({"n_layer": 2})).__name__ == "GPTConfig"  # no arch: GPT-2, as before
    assert model_config({"arch": "llama", "n_kv_head": 2}).n_kv_head == 2
    with pytest.raises(ValueError, match=r"model\.arch=gpt2 has no key 'n_kv_head'; its keys: n_layer"):
        model_config({"arch": "gpt2", "n_kv_head": 2})
    with pytest.raises(ValueError, match=r"tie_embeddings='yes' should be a bool"):
        model_config({"arch": "llama", "tie_embeddings": "yes"})


# ----------------------------------------------------------------------------- a third architecture


@dataclass
class ToyConfig:
    arch: str = "toy"
    n_layer: int = 2
    n_embd: int = 8
    block_size: int = 8
    vocab_size: int = 32
    scale: float = 1.0  # a float the architecture sets no rule for


class Toy(nn.Module):
    """A bag-of-previous-token model: an embedding, residual tanh layers, an untied head."""

    def __init__(self, config: ToyConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.n_embd)
        self.layers = nn.ModuleList(nn.Linear(config.n_embd, config.n_embd) for _ in range(config.n_layer))
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    @classmethod
    def empty(cls, config, device, dtype=None, on_meta=None):
        with torch.device("meta"):
            model = cls(config)
        if on_meta is not None:
            on_meta(model)
        return model.to_empty(device=device).to(dtype=dtype or torch.float32)

    def tie_weights(self):
        pass

    @torch.no_grad()
    def init_weights(self, generator=None):
        for p in self.parameters():
            p.normal_(0.0, 0.02, generator=generator)

    def num_params(self, non_embedding=True):
        return sum(p.numel() for p in self.parameters()) - (self.embed.weight.numel() if non_embedding else 0)

    def forward(self, idx, targets=None):
        x = self.embed(idx)
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        logits = self.head(x)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return logits, loss


TOY = ModelSpec(
    name="toy",
    title="Toy",
    config=ToyConfig,
    model=Toy,
    blocks=lambda model: model.layers,
    flops_per_token=lambda c, t=None: 6.0 * (c.n_layer * c.n_embd**2 + c.n_embd * c.vocab_size),
    count_params=lambda c, non_embedding=True: (
        c.n_layer * (c.n_embd**2 + c.n_embd)
        + c.n_embd * c.vocab_size
        + (0 if non_embedding else c.n_embd * c.vocab_size)
    ),
    param_roles=lambda model: spec_module.roles_by_name(model, ("embed.weight",), ("head.weight",)),
    tied=lambda c: {},
    shape_keys=("n_layer", "n_embd", "block_size", "vocab_size"),
    required_keys=("n_layer", "n_embd", "block_size", "vocab_size"),
)


@pytest.fixture
def toy(monkeypatch):
    spec_module.arch_names()  # the built-in ones first
    monkeypatch.setattr(spec_module, "_REGISTRY", dict(spec_module._REGISTRY))  # dropped after the test
    return register_arch(TOY)


def test_a_registered_architecture_is_built_grouped_saved_and_loaded_without_other_code(toy, tmp_path):
    from mars.checkpoint import check_model_shape, load_model
    from mars.checkpoint.model_dir import save_model
    from mars.errors import CheckpointError
    from mars.optim import param_groups
    from mars.train.trainer import build_model

    config = model_config({"arch": "toy", "n_layer": 3})
    model = build_model(config, torch.device("cpu"), seed=7)
    assert isinstance(model, Toy) and spec_of(model) is toy and len(toy.blocks(model)) == 3
    assert model.num_params() == toy.count_params(config)
    assert torch.equal(model.head.weight, build_model(config, torch.device("cpu"), seed=7).head.weight)

    names = {id(p): n for n, p in model.named_parameters()}
    groups = {
        opt: [sorted(names[id(p)] for p in g["params"]) for g in param_groups(model, opt)]
        for opt in ("adamw", "mars_m")
    }
    # decay: every matrix but the embedding (the untied head decays); Newton-Schulz: the hidden matrices
    assert groups["adamw"][0] == ["head.weight", "layers.0.weight", "layers.1.weight", "layers.2.weight"]
    assert groups["mars_m"][0] == ["layers.0.weight", "layers.1.weight", "layers.2.weight"]
    assert "head.weight" in groups["mars_m"][1] and "embed.weight" in groups["mars_m"][1]

    save_model(model, tmp_path / "m")
    assert json.loads((tmp_path / "m" / "model.json").read_text())["arch"] == "toy"
    loaded, _ = load_model(tmp_path / "m")
    assert isinstance(loaded, Toy) and loaded.config == config
    theirs = model.state_dict()
    assert all(torch.equal(t, theirs[k]) for k, t in loaded.state_dict().items())
    with pytest.raises(
        CheckpointError,
        match=r"holds a model\.arch=toy model, but the config asks for model\.arch=gpt2",
    ):
        check_model_shape(tmp_path / "m", model_config({"arch": "gpt2"}))
    assert math.isfinite(
        model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))[1].item()
    )


@pytest.mark.parametrize(
    "values, message",
    [  # the floats they are, refused by the rule they break (not "should be a float")
        ({"arch": "llama", "rope_theta": math.inf}, r"^model\.rope_theta=inf must be a finite number > 0$"),
        ({"arch": "llama", "norm_eps": math.nan}, r"^model\.norm_eps=nan must be a finite number > 0$"),
        ({"arch": "llama", "norm_eps": -math.inf}, r"^model\.norm_eps=-inf must be a finite number > 0$"),
        ({"arch": "gpt2", "dropout": math.nan}, r"^model\.dropout=nan must lie in \[0, 1\)$"),
        (
            {"arch": "toy", "scale": math.inf},
            r"^model\.scale=inf must be a finite number$",
        ),  # no rule of its own
        ({"arch": "llama", "rope_theta": "big"}, r"^model: rope_theta='big' should be a float$"),
    ],
)
def test_a_non_finite_float_breaks_its_rule(toy, values, message):
    from mars.model.spec import validate_model

    with pytest.raises(ValueError, match=message):
        validate_model(values)


def test_register_arch_checks_the_config():
    @dataclass
    class NoArch:
        n_layer: int = 1

    with pytest.raises(ValueError, match=r"the config's first field must be arch = 'bad'"):
        register_arch(ModelSpec("bad", "Bad", NoArch, Toy, *[None] * 5, shape_keys=()))
