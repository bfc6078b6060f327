import dataclasses
import json
import sys
from pathlib import Path

import pytest
import torch

from mars.checkpoint.export import export_hf
from mars.checkpoint.model_dir import save_model
from mars.data.tokenizer import VOCAB_SIZE, get_tokenizer
from mars.model.gpt import GPT, GPT_PRESETS
from mars.model.hf import from_hf, to_hf
from mars.model.hf_gpt2 import scale_is_honoured

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import export_hf as export_script  # noqa: E402


def real_logits(model, idx):
    """Our logits over the rows that enter the softmax: every row, or the first live_vocab_size (the
    others are -inf)."""
    with torch.no_grad():
        logits = model(idx)[0]
    live = model.config.live_vocab_size or model.config.vocab_size
    assert torch.all(logits[..., live:] == float("-inf"))
    return logits[..., :live]


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k


def variant(model, **changes):
    """The same weights under a changed config (biases dropped for bias=False), built without init."""
    cfg = dataclasses.replace(model.config, **changes)
    with torch.device("meta"):
        other = GPT(cfg)
    other.to_empty(device="cpu").materialised()
    other.load_state_dict(
        {k: v for k, v in model.state_dict().items() if cfg.bias or not k.endswith(".bias")}
    )
    return other.eval()


@pytest.mark.parametrize("preset", ["gpt2_tiny", "gpt2_small", "gpt2_medium", "gpt2_large", "gpt2_xl"])
def test_exported_logits_match_for_every_preset_width(make_model, preset):
    p = GPT_PRESETS[preset]
    # the full padded vocabulary at the tiny width; a small one at the big widths keeps this fast
    # (the vocabulary does not depend on the width)
    vocab = p.vocab_size if preset == "gpt2_tiny" else 1024
    idx = torch.randint(0, min(vocab, VOCAB_SIZE), (1, 16))
    base = make_model(n_head=p.n_head, n_embd=p.n_embd, block_size=32, vocab_size=vocab, bias=True)
    for bias in (False, True):
        for scaled in (False, True):
            model = variant(base, bias=bias, scale_attn_by_inverse_layer_idx=scaled)
            hf = to_hf(model)
            assert hf.config.vocab_size == vocab and hf.config.n_positions == 32  # every row: padding too
            assert hf.config.scale_attn_by_inverse_layer_idx is scaled
            with torch.no_grad():
                theirs = hf(idx).logits
            diff = (real_logits(model, idx) - theirs).abs().max().item()
            assert diff <= 1e-4, (preset, bias, scaled, diff)


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_layer_index_scaling_is_honoured_by_transformers(make_model, attn_implementation):
    assert scale_is_honoured(attn_implementation)
    model = make_model(n_layer=3, vocab_size=50304, scale_attn_by_inverse_layer_idx=True)
    with torch.no_grad():  # sharper attention, so that the 1/(layer_idx + 1) factor matters
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(10)
    idx = torch.randint(0, VOCAB_SIZE, (2, 16))
    hf = to_hf(model, attn_implementation=attn_implementation)
    assert hf.config._attn_implementation == attn_implementation
    unscaled = to_hf(
        variant(model, scale_attn_by_inverse_layer_idx=False), attn_implementation=attn_implementation
    )
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, real_logits(model, idx), rtol=0, atol=1e-5)
        assert (unscaled(idx).logits - hf(idx).logits).abs().max() > 1e-3  # the factor is not a no-op


def test_to_hf_copies_weights(make_model):
    model = make_model(vocab_size=50304)
    hf = to_hf(model)
    assert hf.lm_head.weight is hf.transformer.wte.weight
    assert torch.equal(hf.transformer.h[1].attn.c_attn.weight, model.transformer.h[1].attn.c_attn.weight.t())
    assert torch.count_nonzero(hf.transformer.h[0].mlp.c_fc.bias) == 0  # bias=False: zero biases
    with torch.no_grad():
        hf.transformer.wte.weight.zero_()
    assert model.transformer.wte.weight.abs().sum() > 0
    assert model.training == hf.training


@pytest.mark.parametrize("bias", [False, True])
def test_export_then_import_is_bit_identical(make_model, bias):
    """Every tensor, the padding rows included (they enter the softmax, trained like any row), both ways:
    ours -> HF -> ours, and HF -> ours -> HF."""
    model = make_model(vocab_size=50304, bias=bias, dropout=0.1)
    back = from_hf(to_hf(model))
    assert back.config == model.config
    assert back.lm_head.weight is back.transformer.wte.weight
    assert_same_state(model, back)
    hf = to_hf(model)
    assert_same_state(hf, to_hf(from_hf(hf)))


def test_a_model_with_masked_rows_exports_the_rows_it_has():
    """A transformers GPT-2 with its 50257 rows imports as 50304 rows with the 47 it lacks masked out of
    the softmax: its logits over its rows, and so its loss, are the transformers model's; exported, it
    is that model again, and imported again, this one."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(
        GPT2Config(vocab_size=VOCAB_SIZE, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    ).eval()
    model = from_hf(hf).eval()
    assert (model.config.vocab_size, model.config.live_vocab_size) == (50304, VOCAB_SIZE)
    idx = torch.randint(0, VOCAB_SIZE, (2, 16))
    targets = torch.randint(0, VOCAB_SIZE, (2, 16))
    with torch.no_grad():
        theirs = hf(idx, labels=None).logits
        torch.testing.assert_close(real_logits(model, idx), theirs, rtol=0, atol=1e-5)
        ours_loss = model(idx, targets)[1]
        their_loss = torch.nn.functional.cross_entropy(theirs.flatten(0, 1), targets.flatten())
    assert abs(ours_loss.item() - their_loss.item()) < 1e-6
    again = to_hf(model)
    assert again.config.vocab_size == VOCAB_SIZE and again.config.mars_vocab_size == 50304
    assert_same_state(hf, again)
    back = from_hf(again)
    assert_same_state(model, back)
    assert back.config == model.config


def test_small_vocab_is_exported_whole(make_model):
    model = make_model(vocab_size=128)
    hf = to_hf(model)
    assert hf.config.vocab_size == 128 and hf.config.eos_token_id is None
    assert_same_state(model, from_hf(hf))


def test_import_of_plain_hf_model_detects_bias_and_pads_vocab():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = dict(
        vocab_size=VOCAB_SIZE, n_positions=16, n_embd=32, n_layer=2, n_head=2, activation_function="gelu"
    )
    hf = GPT2LMHeadModel(GPT2Config(**cfg)).eval()
    with torch.no_grad():
        hf.transformer.h[1].mlp.c_fc.bias.normal_()
    model = from_hf(hf)
    assert model.config.bias and model.config.vocab_size == 50304 and model.config.block_size == 16
    assert model.config.live_vocab_size == VOCAB_SIZE  # the padding it lacks: out of the softmax
    assert model.config.dropout == hf.config.resid_pdrop
    idx = torch.randint(0, VOCAB_SIZE, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(real_logits(model.eval(), idx), hf(idx).logits, rtol=0, atol=1e-5)

    zero_bias = GPT2LMHeadModel(GPT2Config(**cfg))  # freshly initialised biases are all zero
    assert not from_hf(zero_bias).config.bias


def test_import_rejects_other_architectures():
    from transformers import GPT2Config, GPT2LMHeadModel

    base = dict(
        vocab_size=128, n_positions=8, n_embd=16, n_layer=1, n_head=2, bos_token_id=None, eos_token_id=None
    )
    with pytest.raises(ValueError, match=r"n_inner=32 .*activation_function='relu' \(we take gelu_new, "):
        from_hf(GPT2LMHeadModel(GPT2Config(**base, n_inner=32, activation_function="relu")))


def test_export_names_gpt2s_tanh_gelu(make_model):
    assert to_hf(make_model()).config.activation_function == "gelu_new"  # as GPT-2's own config.json
    assert to_hf(make_model(activation="gelu")).config.activation_function == "gelu"


@pytest.mark.parametrize(
    "hf_name, ours",
    [
        ("gelu_new", "gelu_tanh"),
        ("gelu_pytorch_tanh", "gelu_tanh"),
        ("gelu_fast", "gelu_tanh"),
        ("gelu", "gelu"),
    ],
)
def test_import_keeps_the_models_activation(hf_name, ours):
    """Every Hugging Face spelling of the tanh GELU imports as ours, the exact one as activation="gelu":
    the imported model computes what the Hugging Face one does, and exports back under the same form."""
    import warnings

    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=VOCAB_SIZE, n_positions=16, n_embd=32, n_layer=2, n_head=2, activation_function=hf_name
    )
    hf = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # larger MLP inputs and outputs, and logits, so that the two forms differ
        hf.transformer.wte.weight.mul_(20)
        for block in hf.transformer.h:
            block.mlp.c_fc.weight.mul_(20)
            block.mlp.c_proj.weight.mul_(20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about: the function is the same
        model = from_hf(hf)
    assert model.config.activation == ours
    idx = torch.randint(0, VOCAB_SIZE, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(real_logits(model, idx), hf(idx).logits, rtol=0, atol=1e-5)
        other = variant(model, activation="gelu" if ours == "gelu_tanh" else "gelu_tanh")
        assert (real_logits(other, idx) - hf(idx).logits).abs().max() > 1e-3  # the check can fail
    assert to_hf(model).config.activation_function == ("gelu_new" if ours == "gelu_tanh" else "gelu")


@pytest.fixture
def run_dir(tmp_path, make_model):
    model = make_model(vocab_size=50304, block_size=64)
    step = tmp_path / "run" / "ckpt" / "step_00000010"
    save_model(model, step)
    (step / "meta.json").write_text(json.dumps({"step": 10}))
    return tmp_path / "run", model


def test_export_dir_loads_offline_with_auto_classes(tmp_path, run_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2LMHeadModel

    run, model = run_dir
    out = export_hf(run, tmp_path / "hf")
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= names

    hf = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert isinstance(hf, GPT2LMHeadModel) and not hf.training
    text = "Hello world, the quick brown fox.<|endoftext|>"
    ids = tok(text, return_tensors="pt").input_ids
    assert ids[0].tolist() == get_tokenizer().encode(text, allowed_special="all")
    assert tok.eos_token_id == 50256 and hf.config.eos_token_id == 50256
    assert tok.model_max_length == 64
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, real_logits(model, ids), rtol=0, atol=1e-5)


def test_export_refuses_non_empty_dir_unless_forced(tmp_path, run_dir, capsys):
    run, _ = run_dir
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not empty.*--force"):
        export_hf(run, out)
    assert export_script.main([str(run), str(out)]) == 1
    assert "--force" in capsys.readouterr().err
    assert export_script.main([str(run), str(out), "--force"]) == 0
    assert (out / "model.safetensors").is_file() and (out / "keep.txt").is_file()


def test_export_script_reports_missing_checkpoint(tmp_path, capsys):
    assert export_script.main([str(tmp_path), str(tmp_path / "out")]) == 1
    assert "no checkpoint in" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_scale_check_leaves_global_rng_alone():
    scale_is_honoured.cache_clear()
    state = torch.random.get_rng_state()
    assert scale_is_honoured("eager")
    assert torch.equal(torch.random.get_rng_state(), state)


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err.strip()


def test_export_script_refuses_an_out_dir_it_cannot_make_before_reading_anything(
    tmp_path, capsys, monkeypatch
):
    (tmp_path / "notes.txt").write_text("a file\n")
    run = tmp_path / "no_run"  # never read: the output is checked first
    assert export_script.main([str(run), str(tmp_path / "notes.txt" / "hf")]) == 1
    assert one_line(capsys) == (
        f"error: OUT_DIR {tmp_path / 'notes.txt' / 'hf'}: {tmp_path / 'notes.txt'} is a file, not a "
        "directory; choose another OUT_DIR"
    )

    def read_only(base):  # as a read-only mount or another user's directory answers (root is never refused)
        raise PermissionError(13, "Permission denied", str(base))

    monkeypatch.setattr(export_script, "try_create_dir_in", read_only)
    assert export_script.main([str(run), str(tmp_path / "ro" / "hf")]) == 1
    assert one_line(capsys) == (
        f"error: OUT_DIR {tmp_path / 'ro' / 'hf'}: cannot create directories in {tmp_path} (Permission "
        "denied); choose another OUT_DIR"
    )


def test_export_script_errors_are_one_line(tmp_path, run_dir, capsys, monkeypatch):
    run, _ = run_dir
    step = run / "ckpt" / "step_00000010"
    (step / "config.yaml").write_text("model:\n  n_layer: [1\n")  # YAML's own message has 6 lines
    assert export_script.main([str(run), str(tmp_path / "hf")]) == 1
    line = one_line(capsys)
    assert line.startswith(f"error: {step / 'config.yaml'} is not valid YAML (while parsing a flow sequence")
    assert not (tmp_path / "hf").exists()

    # a plugin's architecture, without the plugin: named, with the variable that loads it
    (step / "config.yaml").unlink()
    config = json.loads((step / "model.json").read_text())
    (step / "model.json").write_text(json.dumps({**config, "arch": "tinygpt"}))
    monkeypatch.delenv("MARS_PLUGINS", raising=False)
    assert export_script.main([str(run), str(tmp_path / "hf")]) == 1
    line = one_line(capsys)
    assert line.startswith(f"error: {step / 'model.json'}: model.arch='tinygpt' is not an architecture of ")
    assert (
        "MARS_PLUGINS is not set): it is a plugin's, so name the module that registers 'tinygpt' in " in line
    )
    assert "cannot load it" not in line

    # a plugin that cannot be imported: its own line, exit status 2 (a command-line problem)
    import mars.plugins as plugins

    monkeypatch.setattr(plugins, "_done", False)
    monkeypatch.setattr(plugins, "_entry_points", lambda: [])
    monkeypatch.setenv("MARS_PLUGINS", "no_such_plugin_module")
    assert export_script.main([str(run), str(tmp_path / "hf")]) == 2
    assert "MARS_PLUGINS=no_such_plugin_module: cannot import plugin" in one_line(capsys)
