"""Runs that start from another run: forks (train.fork_from) and weights alone (train.init_from).

A fork is a new run, in a run dir of its own, that continues another run's checkpoint exactly as a
resume would (weights, optimizer state, data position, RNG, step, the log window): its schedule,
train.max_steps and optimizer hyperparameters may differ from the parent's, the keys a resume fixes
may not (mars.train.resume). init_from takes the weights alone (a mars checkpoint, or a Hugging Face
GPT-2 / LLaMA directory) and starts at step 0 with a fresh optimizer and the run's own data order.

Both are checked before any compute (rank 0, before Hydra writes the run dir: mars.train.cli): the
checkpoint verifies against its checksums, is healthy (mars.train.health), and holds a model of the
config's architecture and shape; each refusal is one line naming the file, the key and the fix.

The run records where it began in RUN_DIR/lineage.json (mars.checkpoint.lineage, which reads it back
for the reports).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mars.checkpoint as ckpt
from mars.checkpoint.layout import MODEL_CONFIG, MODEL_WEIGHTS, RUN_CONFIG, SHARDED_DIR
from mars.checkpoint.lineage import HF_CONFIG, HF_WEIGHTS, is_hf_dir
from mars.checks import get
from mars.errors import ConfigError

NO_PATH = (None, "", "none", "null")


def given(value: Any) -> bool:
    return value not in NO_PATH


# ----------------------------------------------------------------------------- the sources


def source_checkpoint(key: str, value: str) -> Path:
    """The step dir `key`=`value` names (a step dir, a run dir or its ckpt/: the newest complete one)."""
    chosen = ckpt.resolve_checkpoint(Path(str(value)).expanduser())
    if chosen is None:
        raise ckpt.CheckpointError(
            f"{key}={value}: no complete checkpoint there; give a run dir, its ckpt/ folder or a "
            "ckpt/step_XXXXXXXX folder"
        )
    return chosen


def _check_healthy(key: str, value: str, step_dir: Path, meta: dict) -> None:
    if not meta.get("healthy", True):
        raise ckpt.CheckpointError(
            f"{key}={value}: {step_dir} is marked unhealthy in its meta.json (saved within "
            "train.health_window steps of a divergence alarm); branch from an earlier checkpoint of that "
            'run (one without "healthy": false)'
        )


def _verify(key: str, value: str, step_dir: Path, only=None, healthy: bool = True) -> dict:
    """meta.json after checking the checkpoint's bytes (all of them, or the files `only` accepts) and
    (healthy=True) that it is not marked unhealthy."""
    from mars.checkpoint import checksums

    try:
        meta = ckpt.read_meta(step_dir)
        if healthy:
            _check_healthy(key, value, step_dir, meta)
        if only is None:
            ckpt.verify_checkpoint(step_dir)
        else:
            checksums.verify(step_dir, meta, only=only)
    except ckpt.CheckpointError as e:
        text = str(e)
        raise type(e)(text if text.startswith(f"{key}=") else f"{key}={value}: {text}") from None
    return meta


def _effective(arch: str, key: str, config: Any) -> Any:
    """A model key's value as it shapes the model (LLaMA: a null mlp_hidden / n_kv_head is derived)."""
    if arch == "llama" and key in ("mlp_hidden", "n_kv_head"):
        from mars.model.llama import kv_heads, mlp_hidden

        return mlp_hidden(config) if key == "mlp_hidden" else kv_heads(config)
    return get(config, key)


def model_differences(saved: Any, model_cfg: Any) -> list[str]:
    """`model.KEY=saved (config: ours)` for the architecture and every key its spec fixes (shape_keys,
    fixed_keys) on which the saved model config and the run's differ."""
    from mars.model.spec import arch_of, model_config, spec_for

    theirs, ours = arch_of(saved), arch_of(model_cfg)
    if theirs != ours:
        return [f"model.arch={theirs} (config: {ours})"]
    spec, saved, model_cfg = spec_for(model_cfg), model_config(saved), model_config(model_cfg)
    keys = [k for k in (*spec.shape_keys, *spec.fixed_keys) if not (ours == "llama" and k == "multiple_of")]
    return [
        f"model.{k}={_effective(ours, k, saved)} (config: {_effective(ours, k, model_cfg)})"
        for k in keys
        if _effective(ours, k, saved) != _effective(ours, k, model_cfg)
    ]


def _refuse_model(key: str, value: str, file: Path, diffs: list[str]) -> None:
    """A ConfigError (exit 2), as for train.resume=PATH and a fork's other fixed keys: the fix is on the
    command line."""
    if diffs:
        raise ConfigError(
            f"{key}={value}: {file} holds another model: {', '.join(diffs)}; set those model keys (or pick "
            "the model= preset) the source was trained with"
        )


def check_fork(cfg: Any, world_size: int, key: str = "train.fork_from") -> Path:
    """The step dir train.fork_from names (or train.resume=PATH naming another run dir's checkpoint, which
    makes the same fork: `key`), verified (every file against its checksums), healthy (train.resume=PATH
    continues an unhealthy one as asked), of the config's model, and trained under the config's values
    of every key a resume fixes."""
    from mars.checkpoint.model_dir import read_model_config
    from mars.train.resume import FIXED_KEYS, fixed_differences

    value = str(get(cfg, key))
    step_dir = source_checkpoint(key, value)
    meta = _verify(key, value, step_dir, healthy=key == "train.fork_from")
    _refuse_model(key, value, step_dir / MODEL_CONFIG, model_differences(
        read_model_config(step_dir / MODEL_CONFIG), cfg.model
    ))  # fmt: skip
    saved = ckpt.read_run_config(step_dir)
    diffs = [
        d
        for d in fixed_differences(saved, cfg, meta.get("world_size"), world_size)
        if d.split(":", 1)[0] in FIXED_KEYS
    ]
    if diffs:
        name, change = diffs[0].split(": ", 1)
        old = change.split(" -> ", 1)[0].strip("'")
        raise ConfigError(
            f"{key}={value}: the fork would change {'; '.join(diffs)} (from the parent's "
            f"{step_dir / RUN_CONFIG}); a fork keeps the keys a resume keeps (model shape, optimizer kind, "
            f"data, global batch, seeds): set {name}={old} as the parent has it, or start from its weights "
            "alone with train.init_from"
        )
    if meta["step"] > int(cfg.train.max_steps):
        raise ConfigError(
            f"{key}={value}: {step_dir} is at step {meta['step']}, beyond train.max_steps="
            f"{cfg.train.max_steps}; raise train.max_steps above {meta['step']}, or fork from an earlier "
            "checkpoint"
        )
    return step_dir


def _model_file(rel: str) -> bool:
    return rel in (MODEL_CONFIG, MODEL_WEIGHTS) or rel.startswith(f"{SHARDED_DIR}/")


def check_init(cfg: Any) -> Path:
    """The directory train.init_from names, checked: a mars checkpoint's model files verify against its
    checksums and it is healthy, or an HF directory has its config and weights; either holds a model
    of the config's architecture and shape (the HF model is loaded to tell)."""
    from mars.checkpoint.model_dir import read_model_config

    value = str(cfg.train.init_from)
    path = Path(value).expanduser()
    if is_hf_dir(path):
        hf_config, _ = _hf_config_and_adapter(path)
        check_hf_weights(path, hf_config)
        _refuse_model("train.init_from", value, path / HF_CONFIG, model_differences(
            hf_model_config(path), cfg.model
        ))  # fmt: skip
        return path
    step_dir = source_checkpoint("train.init_from", value)
    _verify("train.init_from", value, step_dir, only=_model_file)
    _refuse_model("train.init_from", value, step_dir / MODEL_CONFIG, model_differences(
        read_model_config(step_dir / MODEL_CONFIG), cfg.model
    ))  # fmt: skip
    return step_dir


def _hf_problem(path: Path, e: BaseException) -> ckpt.CheckpointError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return ckpt.CheckpointError(
        f"train.init_from={path}: cannot import it as a GPT-2 or LLaMA model ({first})"
    )


def _hf_config_and_adapter(path: Path):
    """(transformers' config, the mars adapter of its model_type) of an HF directory that has weights."""
    from transformers import AutoConfig

    from mars.model.hf import adapter_for

    if not any((path / w).is_file() for w in HF_WEIGHTS):
        raise ckpt.CheckpointError(
            f"train.init_from={path}: no weights next to {path / HF_CONFIG} "
            f"(expected {' or '.join(HF_WEIGHTS)})"
        )
    try:
        hf_config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        return hf_config, adapter_for(hf_config.model_type)
    except (OSError, ValueError, KeyError) as e:
        raise _hf_problem(path, e) from None


def _weights(path: Path, wanted) -> Iterator[Any]:
    """The tensors of an HF directory's weights file whose names pass `wanted`, read one at a time
    (safetensors: only those; pytorch_model.bin: memory-mapped where its format allows, and always
    with weights_only=True, so no code in it runs)."""
    single = path / HF_WEIGHTS[0]
    if single.is_file():
        with _readable(path, single):
            from safetensors import safe_open

            with safe_open(str(single), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    if wanted(name):
                        yield f.get_tensor(name)
        return
    yield from (t for name, t in _state_dict(path).items() if wanted(name))


def _state_dict(path: Path) -> dict:
    """pytorch_model.bin, loaded with torch.load(weights_only=True) (memory-mapped where its format
    allows): a file holding more than tensors, or a damaged one, is one line."""
    import pickle

    import torch

    file = path / HF_WEIGHTS[1]
    try:
        with _readable(path, file):
            try:
                return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # the legacy (non-zip) format cannot be memory-mapped
                return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ckpt.CheckpointError(
            f"train.init_from={path}: {file} holds Python objects besides tensors, which a weights-only load "
            "refuses (nothing in it was run): give the model as model.safetensors, saved where it is "
            "trusted"
        ) from None


@contextmanager
def _readable(path: Path, file: Path):
    """A weights file that cannot be read (cut short, damaged) as one line naming it."""
    try:
        yield
    except ckpt.CheckpointError:
        raise
    except (OSError, RuntimeError, ValueError, EOFError) as e:
        first = " ".join(str(e).split())[:200] or type(e).__name__
        raise ckpt.CheckpointError(
            f"train.init_from={path}: {file} cannot be read ({first}): it is cut short or damaged; copy, "
            "download or export it again"
        ) from None
    except Exception as e:  # safetensors' own error type
        if type(e).__name__ != "SafetensorError":
            raise
        raise ckpt.CheckpointError(
            f"train.init_from={path}: {file} cannot be read ({' '.join(str(e).split())[:200]}): it is cut "
            "short or damaged; copy, download or export it again"
        ) from None


def _weight_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """name -> shape of each tensor in an HF directory's weights (safetensors: read from its header)."""
    single = path / HF_WEIGHTS[0]
    if single.is_file():
        with _readable(path, single):
            from safetensors import safe_open

            with safe_open(str(single), framework="pt") as f:
                return {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}  # noqa: SIM118
    return {n: tuple(t.shape) for n, t in _state_dict(path).items() if hasattr(t, "shape")}


BUFFERS = ("attn.bias", "attn.masked_bias", "rotary_emb.inv_freq")  # older checkpoints store these


def check_hf_weights(path: Path, hf_config) -> None:
    """The weights of an HF directory hold the model its config.json describes: every tensor, of its
    shape (a config.json of another model, or weights of another, would train something else or fail
    after the run dir was made). Checked from the file's header, on transformers' meta-device model."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config)
    except (ValueError, KeyError):  # a model type transformers does not build: its adapter checks it
        return
    prefix = f"{model.base_model_prefix}."

    def plain(name: str) -> str:  # checkpoints are saved with and without the base model's prefix
        return name[len(prefix) :] if name.startswith(prefix) else name

    tied = getattr(model, "_tied_weights_keys", None) or ()
    optional = {plain(n) for n in tied} if getattr(hf_config, "tie_word_embeddings", False) else set()
    want = {plain(n): tuple(t.shape) for n, t in model.state_dict().items()}
    got = {plain(n): s for n, s in _weight_shapes(path).items()}
    file = next(path / w for w in HF_WEIGHTS if (path / w).is_file())
    for name, shape in want.items():
        if name in got and got[name] != shape:
            raise ckpt.CheckpointError(
                f"train.init_from={path}: {file} does not hold the model {path / HF_CONFIG} describes: "
                f"{name} has shape {list(got[name])} there, {list(shape)} by config.json; put the "
                "config.json of these weights next to them"
            )
    missing = [n for n in want if n not in got and n not in optional]
    extra = [n for n in got if n not in want and not n.endswith(BUFFERS)]
    if missing or extra:
        what = "; ".join(
            f"{label} {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
            for label, names in (("lacks", missing), ("has tensors the model lacks:", extra))
            if names
        )
        raise ckpt.CheckpointError(
            f"train.init_from={path}: {file} does not hold the model {path / HF_CONFIG} describes ({what}); "
            "put the config.json of these weights next to them"
        )


def hf_model_config(path: Path):
    """The mars model config an HF directory imports as, from its config.json (and, for GPT-2's `bias`,
    its bias tensors alone): the check of train.init_from, without loading the model."""
    hf_config, adapter = _hf_config_and_adapter(path)
    if not hasattr(adapter, "config_from_hf"):  # a plugin's adapter may have from_hf alone
        return load_hf(path).config
    is_bias = getattr(adapter, "is_bias", lambda name: False)
    try:
        return adapter.config_from_hf(hf_config, lambda: any(bool(t.any()) for t in _weights(path, is_bias)))
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise _hf_problem(path, e) from None


def load_hf(path: Path):
    """The mars model of a transformers GPT-2 / LLaMA directory (CPU, float32), through its adapter
    (mars.model.hf). Weights are read by transformers: model.safetensors, or pytorch_model.bin, which
    it loads with torch.load(weights_only=True), so no code in the files runs."""
    import torch
    from transformers import AutoModelForCausalLM

    _, adapter = _hf_config_and_adapter(path)
    try:
        with _quiet_transformers():
            hf = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch.float32)
        return adapter.from_hf(hf.eval())
    except (OSError, ValueError, KeyError) as e:
        raise _hf_problem(path, e) from None


@contextmanager
def _quiet_transformers():
    """No progress bars from transformers while it loads (a refusal stays one line on stderr)."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def init_weights(model, source: str) -> None:
    """Copy the weights train.init_from names into `model` (plain or FSDP2-sharded), in place."""
    from mars.model.lm import copy_full_, unwrap_model

    path = Path(source).expanduser()
    if not is_hf_dir(path):
        ckpt.load_model_state(model, source_checkpoint("train.init_from", source))
        return
    import logging

    import torch

    imported = load_hf(path)
    state = imported.state_dict()
    inner = unwrap_model(model)
    with torch.no_grad():
        for name, param in inner.state_dict(keep_vars=True).items():
            copy_full_(param, state[name])
    live = getattr(imported.config, "live_vocab_size", None)
    if hasattr(inner.config, "live_vocab_size"):  # rows the source lacks: out of the softmax, as there
        inner.config.live_vocab_size = live
    if live is not None:
        vocab = inner.config.vocab_size
        logging.getLogger("mars.train").info(
            f"train.init_from={path}: its {live} vocabulary rows fill model.vocab_size={vocab}; the "
            f"{vocab - live} rows it lacks are masked out of the softmax (model.live_vocab_size={live} in "
            "the checkpoints' model.json)"
        )
