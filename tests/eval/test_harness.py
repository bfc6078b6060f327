"""evaluate_model: same scores as lm-eval's own HF backend, and no side effects on a training model."""

import random

import numpy as np
import pytest
import torch
from eval_fixtures import tiny_gpt, tiny_llama, write_checkpoint

from mars.checkpoint import load_model
from mars.checkpoint.export import export_hf
from mars.eval.harness import (
    _loaded_tasks,
    evaluate_model,
    flatten_scores,
    run_lm_eval,
    scores_from_results,
    unwrap,
)
from mars.eval.tasks import LOCAL_TASKS_DIR


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_in_memory_scores_equal_lm_eval_hf_backend_on_the_export(run_dir, tmp_path, arch):
    """GPT-2 through GPT2LMHeadModel, LLaMA through LlamaForCausalLM: the same numbers either way."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    if arch == "llama":
        run_dir = tmp_path / "llama_run"
        write_checkpoint(run_dir, tiny_llama(3), step=10, tokens=5120)

    hf_dir = export_hf(run_dir, tmp_path / "hf")
    model, _ = load_model(run_dir)
    scores, raw = run_lm_eval(model, "smoke", batch_size=4)

    reference = simple_evaluate(
        model="hf",
        model_args=f"pretrained={hf_dir}",
        tasks=["mars_quiz"],
        task_manager=TaskManager(include_path=str(LOCAL_TASKS_DIR), include_defaults=False),
        num_fewshot=0,
        batch_size=4,
        device="cpu",
        log_samples=False,
    )["results"]["mars_quiz"]
    ours = raw["results"]["mars_quiz"]
    assert ours["sample_len"] == reference["sample_len"] == 40
    for key in ("acc,none", "acc_norm,none", "acc_stderr,none", "acc_norm_stderr,none"):
        assert ours[key] == reference[key], key
    assert scores == {"mars_quiz": {"acc": reference["acc,none"], "acc_norm": reference["acc_norm,none"]}}


def test_evaluate_model_leaves_a_training_model_as_it_was():
    model = tiny_gpt()
    model.train()
    x = torch.randint(0, 50257, (2, 16))
    _, loss = model(x, x)
    loss.backward()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    grads = {k: v.grad.clone() for k, v in model.named_parameters()}
    rng = random.getstate(), np.random.get_state(), torch.get_rng_state()
    expected = random.random(), np.random.rand(), torch.rand(3)
    random.setstate(rng[0]), np.random.set_state(rng[1]), torch.set_rng_state(rng[2])

    scores = evaluate_model(model, ["mars_quiz"], limit=6, batch_size=4)

    assert set(scores) == {"mars_quiz"} and set(scores["mars_quiz"]) == {"acc", "acc_norm"}
    assert all(0.0 <= v <= 1.0 for v in scores["mars_quiz"].values())
    assert model.training
    for k, v in model.named_parameters():
        assert torch.equal(v, params[k]) and torch.equal(v.grad, grads[k]), k
    # lm-eval reseeds every generator; the caller's streams continue untouched
    assert random.random() == expected[0] and np.random.rand() == expected[1]
    assert torch.equal(torch.rand(3), expected[2])

    model.eval()
    evaluate_model(model, "smoke", limit=2, batch_size=4)
    assert not model.training


def test_repeated_in_loop_calls_reuse_the_loaded_tasks():
    model = tiny_gpt(3)
    first = evaluate_model(model, "smoke", limit=8, batch_size=8)
    hits = _loaded_tasks.cache_info().hits
    second = evaluate_model(model, "smoke", limit=8, batch_size=8)
    assert _loaded_tasks.cache_info().hits == hits + 1
    assert first == second


def test_unwrap_ddp_and_compile_wrappers():
    class Wrapper(torch.nn.Module):  # the attribute layout of DDP (.module) and compile (._orig_mod)
        def __init__(self, inner, attr):
            super().__init__()
            setattr(self, attr, inner)

    gpt = tiny_gpt()
    assert unwrap(Wrapper(Wrapper(gpt, "module"), "_orig_mod")) is gpt
    assert unwrap(gpt) is gpt


def test_scores_from_results_and_flat_keys():
    results = {
        "results": {
            "arc_easy": {"alias": "arc_easy", "acc,none": 0.5, "acc_stderr,none": 0.1, "acc_norm,none": 0.25},
            "gsm8k": {"exact_match,strict-match": 0.125, "exact_match_stderr,strict-match": "N/A"},
            "mmlu": {"acc,none": np.float64(0.3).item(), "sample_count": {"acc,none": 10}},
        }
    }
    scores = scores_from_results(results, ["arc_easy", "gsm8k", "mmlu", "absent"])
    assert scores == {
        "arc_easy": {"acc": 0.5, "acc_norm": 0.25},
        "gsm8k": {"exact_match,strict-match": 0.125},
        "mmlu": {"acc": 0.3},
        "absent": {},
    }
    assert flatten_scores({"arc_easy": {"acc": 0.5}}) == {"downstream/arc_easy/acc": 0.5}


def test_fractional_limit():
    scores, raw = run_lm_eval(tiny_gpt(), "smoke", limit=0.1, batch_size=8)
    assert raw["results"]["mars_quiz"]["sample_len"] == 4  # 10% of 40 questions
    assert set(scores["mars_quiz"]) == {"acc", "acc_norm"}
