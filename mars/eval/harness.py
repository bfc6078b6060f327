"""Zero-shot downstream evaluation of mars models (GPT-2, LLaMA, ...) with lm-evaluation-harness.

The model is converted in memory to its transformers class (``mars.model.hf.to_hf``: a
``GPT2LMHeadModel``, a ``LlamaForCausalLM``, ...), paired with the tokenizer its data was prepared
with (data.tokenizer; the offline GPT-2 tokenizer by default) and scored by
``lm_eval.simple_evaluate`` through lm-eval's own Hugging Face backend (``HFLM``), so the numbers
are exactly those of ``lm_eval --model hf`` on the directory ``scripts/export_hf.py`` writes.

``evaluate_model`` is the in-loop API the trainer calls every ``downstream.interval`` steps;
``evaluate_checkpoint`` is what ``python -m eval`` runs.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from mars.eval.tasks import LoadedTasks, TaskSpec, load_tasks, resolve_tasks

Scores = dict[str, dict[str, float]]  # task or group name -> {metric: value}


def evaluate_model(
    model: torch.nn.Module,
    tasks: str | Sequence[str],
    limit: int | float | None = None,
    batch_size: int = 8,
    device: str | torch.device = "cpu",
    num_fewshot: int = 0,
    tokenizer: str = "gpt2",
    dtype: str = "auto",
) -> Scores:
    """Score ``model`` on ``tasks``; returns ``{task: {metric: value}}`` (e.g. ``{"arc_easy": {"acc": .5,
    "acc_norm": .47}}``; stderr entries are left out, groups such as mmlu carry their aggregate).

    ``model`` is a mars model of any registered architecture (also inside DDP or torch.compile) or a
    transformers causal LM; ``tokenizer`` is the data.tokenizer it was trained with. ``tasks`` as in
    :func:`mars.eval.tasks.resolve_tasks`; ``limit`` caps the documents per task (a fraction when
    < 1). ``dtype`` as train.dtype: auto computes under bfloat16 autocast on CUDA, in float32 on the
    CPU (mars.device.Precision). The model's train/eval mode, its gradients and the global RNG
    states (python, numpy, torch) are the same afterwards; call it on one rank only.
    """
    scores, _ = run_lm_eval(
        model,
        tasks,
        limit=limit,
        batch_size=batch_size,
        device=device,
        num_fewshot=num_fewshot,
        tokenizer=tokenizer,
        dtype=dtype,
    )
    return scores


def run_lm_eval(
    model: torch.nn.Module,
    tasks: str | Sequence[str] | TaskSpec,
    *,
    limit: int | float | None = None,
    batch_size: int = 8,
    device: str | torch.device = "cpu",
    num_fewshot: int = 0,
    include: Sequence[str] = (),
    tokenizer: str = "gpt2",
    dtype: str = "auto",
) -> tuple[Scores, dict]:
    """:func:`evaluate_model` that also returns lm-eval's full (JSON-ready) results dict."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    from mars.device import Precision

    module = unwrap(model)
    was_training = module.training
    precision = Precision.of(dtype, torch.device(device).type)
    try:
        with _quiet_lm_eval(), _preserved_rng(), torch.no_grad(), precision.autocast():
            loaded = prepare_tasks(tasks, num_fewshot, include)
            tok = hf_tokenizer(tokenizer)
            hf_model = as_hf_model(module, tok).to(device)
            lm = HFLM(pretrained=hf_model, tokenizer=tok, batch_size=batch_size)
            results = simple_evaluate(
                model=lm,
                tasks=list(loaded.objects),
                task_manager=loaded.manager,
                num_fewshot=num_fewshot,
                limit=limit,
                batch_size=batch_size,
                device=str(device),
                log_samples=False,
            )
    finally:
        module.train(was_training)
    results = json_ready(results)
    return scores_from_results(results, loaded.names), results


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain module inside DistributedDataParallel / FSDP (``.module``) and torch.compile."""
    while True:
        if isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        elif isinstance(getattr(model, "module", None), torch.nn.Module):
            model = model.module
        else:
            return model


def as_hf_model(model: torch.nn.Module, tokenizer=None):
    """A transformers model for HFLM: transformers models as they are, mars models through to_hf
    (``tokenizer``: the transformers tokenizer it was trained with; None: GPT-2's)."""
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        return model
    from mars.model.hf import to_hf
    from mars.model.hf_gpt2 import scale_is_honoured

    # transformers releases that drop scale_attn_by_inverse_layer_idx under SDPA get eager attention
    scaled = getattr(model.config, "scale_attn_by_inverse_layer_idx", False)
    needs_eager = scaled and not scale_is_honoured("sdpa")
    return to_hf(model, attn_implementation="eager" if needs_eager else "sdpa", tokenizer=tokenizer)


@functools.cache
def hf_tokenizer(name: str = "gpt2"):
    """The transformers tokenizer of data.tokenizer=name (built once; lm-eval only sets its pad token,
    idempotently)."""
    from mars.data.tokenizer import get_hf_tokenizer

    return get_hf_tokenizer(name)


def prepare_tasks(
    tasks: str | Sequence[str] | TaskSpec, num_fewshot: int = 0, include: Sequence[str] = ()
) -> LoadedTasks:
    """Resolve the tasks and load their data now (cached for later evaluations of the same list).

    Raises UserError / UserError, so a caller can fail before it spends time
    on a model: the CLI before loading checkpoints, a trainer before its first step.
    """
    with _quiet_lm_eval():
        return _loaded_tasks(resolve_tasks(tasks, include), num_fewshot)


@functools.lru_cache(maxsize=4)
def _loaded_tasks(spec: TaskSpec, num_fewshot: int) -> LoadedTasks:
    # Task objects hold their loaded datasets: repeated in-loop calls reuse them. Keyed by
    # num_fewshot because simple_evaluate writes it into the task config.
    return load_tasks(spec)


@contextlib.contextmanager
def _preserved_rng() -> Iterator[None]:
    """simple_evaluate reseeds python/numpy/torch; give the caller (a training loop) its RNG back."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


class _DropMessages(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(p in message for p in self.prefixes)


# lm-eval warnings that misdescribe this use: passing a model object is what we mean to do, and
# mars_quiz takes no metadata. lm-eval's INFO chatter (seeds, task lists: ~8 lines per call) is
# held back too, which keeps a training log readable with in-loop evaluation.
_NOISE = {
    "lm_eval.models.huggingface": ("`pretrained` model kwarg is not", "Passed an already-initialized"),
    "lm_eval.api.task": ("Custom kwargs can be passed",),
}


@contextlib.contextmanager
def _quiet_lm_eval() -> Iterator[None]:
    root = logging.getLogger("lm_eval")
    level = root.level
    root.setLevel(max(level, logging.WARNING))
    filters = {name: _DropMessages(prefixes) for name, prefixes in _NOISE.items()}
    for name, f in filters.items():
        logging.getLogger(name).addFilter(f)
    try:
        yield
    finally:
        root.setLevel(level)
        for name, f in filters.items():
            logging.getLogger(name).removeFilter(f)


def json_ready(results: dict) -> dict:
    """lm-eval's results with numpy scalars and other non-JSON values made plain."""
    from lm_eval.utils import handle_non_serializable

    return json.loads(json.dumps(results, default=handle_non_serializable))


def scores_from_results(results: dict, names: Sequence[str]) -> Scores:
    """``{name: {metric: value}}`` from lm-eval's results; "acc,none" -> "acc", stderr dropped."""
    scores: Scores = {}
    for name in names:
        metrics = {}
        for key, value in (results.get("results", {}).get(name) or {}).items():
            metric, _, filt = key.partition(",")
            if not filt or metric.endswith("_stderr") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)):
                metrics[metric if filt == "none" else key] = float(value)
        scores[name] = metrics
    return scores


def flatten_scores(scores: Scores, prefix: str = "downstream") -> dict[str, float]:
    """``{"downstream/arc_easy/acc_norm": 0.47, ...}``: the metrics.jsonl / wandb key names."""
    return {f"{prefix}/{task}/{m}": value for task, metrics in scores.items() for m, value in metrics.items()}


# ----------------------------------------------------------------------------- checkpoints


@dataclass
class CheckpointEval:
    """The scores of one checkpoint plus what identifies it (written as results.json)."""

    name: str  # row label: RUN_NAME@STEP
    path: str  # the checkpoint step directory
    step: int | None
    tokens: int | None
    config: dict | None  # the run's resolved config (config.yaml), when the checkpoint has one
    request: dict  # tasks, limit, num_fewshot, batch_size
    scores: Scores
    lm_eval: dict = field(default_factory=dict, repr=False)  # lm-eval's full results


def evaluate_checkpoint(
    path: str | Path,
    tasks: str | Sequence[str] = "paper",
    *,
    limit: int | float | None = None,
    batch_size: int = 8,
    device: str = "cpu",
    num_fewshot: int = 0,
    include: Sequence[str] = (),
    name: str | None = None,
    dtype: str = "auto",
    average: bool = False,
) -> CheckpointEval:
    """Load a checkpoint (run dir, RUN_DIR/ckpt or a step dir) and score it; see evaluate_model.
    average=True scores the averaged weights its run kept (train.average) instead of the model's.

    Raises mars.checkpoint's CheckpointError / CheckpointError for a missing or bad
    checkpoint, UserError and UserError for the tasks; all before any scoring.
    """
    from mars.checkpoint import load_model

    spec = resolve_tasks(tasks, include)
    prepare_tasks(spec, num_fewshot)  # bad task names and missing data fail before the model loads
    from mars.data.tokenizer import tokenizer_of_run

    model, info = load_model(path, device=device, average=average)
    ckpt = Path(info.get("path", path))
    scores, raw = run_lm_eval(
        model,
        spec,
        limit=limit,
        batch_size=batch_size,
        device=device,
        num_fewshot=num_fewshot,
        tokenizer=tokenizer_of_run(info.get("config")),
        dtype=dtype,
    )
    return CheckpointEval(
        name=name or checkpoint_label(ckpt, info.get("step"), average),
        path=str(ckpt),
        step=info.get("step"),
        tokens=info.get("tokens"),
        config=info.get("config"),
        request=request_of(spec, limit, num_fewshot, batch_size, precision_name(dtype, device), average),
        scores=scores,
        lm_eval=raw,
    )


def request_of(
    spec: TaskSpec, limit, num_fewshot: int, batch_size: int, dtype: str = "float32", average: bool = False
) -> dict:
    """What decides the scores: tasks, limit, shots, the precision computed in (bfloat16 or float32) and
    the weights (the model's, or the averaged ones); the batch size only changes speed, but is recorded
    for the record."""
    return {
        "tasks": list(spec.names),
        "limit": limit,
        "num_fewshot": num_fewshot,
        "batch_size": batch_size,
        "dtype": dtype,
        "weights": "average" if average else "model",
    }


def precision_name(dtype: str, device: str | torch.device) -> str:
    """What a dtype setting computes in on `device`: "bfloat16" or "float32"."""
    from mars.device import Precision

    return Precision.of(dtype, torch.device(device).type).name


def run_dir_of(ckpt: Path) -> Path | None:
    """RUN_DIR for RUN_DIR/ckpt/step_XXXXXXXX, None for a step dir outside that layout."""
    return ckpt.parent.parent if ckpt.parent.name == "ckpt" else None


def checkpoint_label(ckpt: Path, step: int | None, average: bool = False) -> str:
    run_dir = run_dir_of(ckpt)
    base = (run_dir or ckpt).resolve().name
    return (f"{base}@{step}" if step is not None else base) + (" (averaged)" if average else "")
