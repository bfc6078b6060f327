import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from mars.checkpoint import find_checkpoint, latest_checkpoint, load_model
from mars.checkpoint.model_dir import save_model
from mars.errors import CheckpointError


def make_step(root, step, model, meta=True, config_yaml=None):
    d = root / f"step_{step:08d}"
    save_model(model, d)
    if meta:
        (d / "meta.json").write_text(json.dumps({"step": step, "tokens": step * 1000, "wandb_run_id": "abc"}))
    if config_yaml is not None:
        (d / "config.yaml").write_text(config_yaml)
    return d


def assert_same_model(a, b):
    assert a.config == b.config
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_round_trip(tmp_path, make_model):
    model = make_model(bias=True, dropout=0.1, scale_attn_by_inverse_layer_idx=False)
    out = save_model(model, tmp_path / "m")
    assert sorted(p.name for p in out.iterdir()) == ["model.json", "model.safetensors"]
    assert json.loads((out / "model.json").read_text()) == dataclasses.asdict(model.config)
    stored = load_file(str(out / "model.safetensors"))
    assert "lm_head.weight" not in stored and "transformer.wte.weight" in stored  # tied matrix stored once

    loaded, info = load_model(out)
    assert_same_model(model, loaded)
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    assert not loaded.training
    assert info == {"path": str(out)}
    idx = torch.randint(0, 128, (2, 8))
    assert torch.equal(model(idx)[0], loaded(idx)[0])
    # the weights file itself is accepted as a path too
    assert find_checkpoint(out / "model.safetensors") == out


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # raised inside torch.compile's imports
def test_save_unwraps_compiled_model(tmp_path, make_model):
    model = make_model()
    save_model(torch.compile(model), tmp_path)
    assert all(not k.startswith("_orig_mod") for k in load_file(str(tmp_path / "model.safetensors")))
    assert_same_model(model, load_model(tmp_path)[0])


def test_load_strips_compile_and_ddp_prefixes(tmp_path, make_model):
    model = make_model()
    save_model(model, tmp_path)
    tensors = {f"module._orig_mod.{k}": v for k, v in load_file(str(tmp_path / "model.safetensors")).items()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert_same_model(model, load_model(tmp_path)[0])


def test_run_dir_resolution_and_info(tmp_path, make_model):
    run = tmp_path / "run"
    ckpt = run / "ckpt"
    old = make_model()
    new = make_model()
    make_step(ckpt, 100, old)
    make_step(ckpt, 200, new, config_yaml="train:\n  max_steps: 300\nmodel:\n  n_layer: 2\n")
    make_step(ckpt, 300, make_model(), meta=False)  # interrupted: no meta.json
    (ckpt / ".tmp-step_00000400").mkdir()
    (ckpt / "step_500").mkdir()  # not step_XXXXXXXX

    latest = ckpt / "step_00000200"
    assert latest_checkpoint(ckpt) == latest
    assert find_checkpoint(run) == latest
    assert find_checkpoint(ckpt) == latest
    assert find_checkpoint(ckpt / "step_00000100") == ckpt / "step_00000100"

    model, info = load_model(run)
    assert_same_model(new, model)
    assert info == {
        "step": 200,
        "tokens": 200_000,
        "wandb_run_id": "abc",
        "config": {"train": {"max_steps": 300}, "model": {"n_layer": 2}},
        "path": str(latest),
    }
    assert_same_model(old, load_model(ckpt / "step_00000100")[0])


def test_latest_checkpoint_of_missing_or_empty_root(tmp_path):
    assert latest_checkpoint(tmp_path / "nope") is None
    assert latest_checkpoint(tmp_path) is None


def test_missing_path(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_model(tmp_path / "nope")


def test_directory_without_checkpoint_says_what_was_looked_for(tmp_path):
    with pytest.raises(CheckpointError, match=r"looked for .*model\.safetensors.*step_XXXXXXXX") as e:
        find_checkpoint(tmp_path)
    assert "incomplete" not in str(e.value)


def test_only_incomplete_checkpoints(tmp_path, make_model):
    make_step(tmp_path / "ckpt", 300, make_model(), meta=False)
    (tmp_path / "ckpt" / ".tmp-step_00000400").mkdir()
    with pytest.raises(CheckpointError, match=r"incomplete .*step_00000300"):
        find_checkpoint(tmp_path)


def test_file_that_is_not_a_checkpoint(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    with pytest.raises(CheckpointError, match="notes.txt is a file, not a checkpoint"):
        load_model(f)


def test_corrupt_weights_file(tmp_path, make_model):
    save_model(make_model(), tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(CheckpointError, match=r"model\.safetensors is not a readable safetensors file"):
        load_model(tmp_path)


def test_step_dir_without_weights(tmp_path, make_model):
    d = make_step(tmp_path, 100, make_model())
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"step_00000100/model\.safetensors is missing"):
        load_model(d)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: "{not json", r"model\.json is not valid JSON"),
        (lambda c: json.dumps([1, 2]), r"model\.json should hold a JSON object"),
        (lambda c: json.dumps({**c, "n_layers": 2}), r"unknown keys \['n_layers'\]"),
        (lambda c: json.dumps({k: v for k, v in c.items() if k != "n_embd"}), r"missing keys \['n_embd'\]"),
        (lambda c: json.dumps({**c, "n_layer": "2"}), r"n_layer='2' should be a int"),
        (lambda c: json.dumps({**c, "bias": 1}), r"bias=1 should be a bool"),
    ],
)
def test_bad_model_json(tmp_path, make_model, edit, message):
    save_model(make_model(), tmp_path)
    cfg = json.loads((tmp_path / "model.json").read_text())
    (tmp_path / "model.json").write_text(edit(cfg))
    with pytest.raises(CheckpointError, match=message):
        load_model(tmp_path)


def test_shape_mismatch_with_model_json(tmp_path, make_model):
    save_model(make_model(), tmp_path)
    cfg = json.loads((tmp_path / "model.json").read_text())
    (tmp_path / "model.json").write_text(json.dumps({**cfg, "vocab_size": 256}))
    with pytest.raises(
        CheckpointError, match=r"transformer\.wte\.weight has shape \(128, 32\) .* gives \(256, 32\)"
    ):
        load_model(tmp_path)


def test_missing_and_unexpected_tensors(tmp_path, make_model):
    save_model(make_model(bias=True), tmp_path)
    cfg = json.loads((tmp_path / "model.json").read_text())
    (tmp_path / "model.json").write_text(json.dumps({**cfg, "bias": False, "n_layer": 3}))
    with pytest.raises(
        CheckpointError, match=r"missing tensors \['transformer\.h\.2\..*unexpected tensors \[.*bias"
    ):
        load_model(tmp_path)


def test_untied_head_is_rejected(tmp_path, make_model):
    model = make_model()
    save_model(model, tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    tensors["lm_head.weight"] = torch.randn_like(tensors["transformer.wte.weight"])
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="lm_head.weight differs from transformer.wte.weight"):
        load_model(tmp_path)


def test_bad_meta_and_config_yaml(tmp_path, make_model):
    d = make_step(tmp_path, 1, make_model(), config_yaml="a: [unclosed\n")
    with pytest.raises(CheckpointError, match=r"config\.yaml is not valid YAML"):
        load_model(d)
    (d / "config.yaml").unlink()
    (d / "meta.json").write_text("{")
    with pytest.raises(CheckpointError, match=r"meta\.json is not valid JSON"):
        load_model(d)


def test_a_model_json_without_arch_is_gpt2_and_a_llama_one_loads_as_llama(tmp_path, make_model):
    """model.json files written before there were two architectures have no arch: they are GPT-2's."""
    from mars.model.llama import Llama, LlamaConfig

    model = make_model()
    save_model(model, tmp_path / "old")
    cfg = json.loads((tmp_path / "old" / "model.json").read_text())
    assert cfg["arch"] == "gpt2"
    del cfg["arch"]
    (tmp_path / "old" / "model.json").write_text(json.dumps(cfg))
    loaded, _ = load_model(tmp_path / "old")
    assert_same_model(loaded, model)

    llama = Llama(LlamaConfig(n_layer=1, n_head=2, n_kv_head=1, n_embd=16, block_size=8, vocab_size=64,
                              multiple_of=16, tie_embeddings=True))  # fmt: skip
    save_model(llama, tmp_path / "llama")
    stored = load_file(str(tmp_path / "llama" / "model.safetensors"))
    assert "lm_head.weight" not in stored  # a tied head is stored once
    loaded, _ = load_model(tmp_path / "llama")
    assert isinstance(loaded, Llama) and loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert_same_model(loaded, llama)


def test_a_checkpoint_of_one_architecture_is_refused_for_the_other_in_one_line(tmp_path, make_model):
    from mars.checkpoint import check_model_shape
    from mars.errors import CheckpointError
    from mars.model.gpt import GPTConfig
    from mars.model.llama import Llama, LlamaConfig

    gpt = make_step(tmp_path / "gpt", 1, make_model())
    llama_cfg = LlamaConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=128, multiple_of=16)
    llama = make_step(tmp_path / "llama", 1, Llama(llama_cfg))
    for step_dir, config, theirs, ours in [
        (gpt, llama_cfg, "gpt2", "llama"),
        (llama, GPTConfig(), "llama", "gpt2"),
    ]:
        with pytest.raises(CheckpointError) as e:
            check_model_shape(step_dir, config)
        assert "\n" not in str(e.value)
        assert f"holds a model.arch={theirs} model, but the config asks for model.arch={ours}" in str(e.value)
        assert f"model={theirs}_* preset" in str(e.value)
    with pytest.raises(CheckpointError, match=r"n_kv_head=None \(config: 1\)"):
        check_model_shape(llama, LlamaConfig(n_layer=2, n_head=2, n_kv_head=1, n_embd=32, block_size=16,
                                             vocab_size=128, multiple_of=16))  # fmt: skip
