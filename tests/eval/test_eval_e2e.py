"""A real tiny `python train.py` run with in-loop downstream eval, then `python -m eval` on it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled"}


@pytest.mark.slow
@pytest.mark.extended  # make test-all
def test_train_then_evaluate_the_run(tmp_path):
    run = tmp_path / "run"
    train = [
        sys.executable, "train.py", "model.n_layer=1", "model.n_head=2", "model.n_embd=32",
        "model.block_size=64", "train.max_steps=4", "train.batch_size=2", "train.global_batch_size=2",
        "train.eval_interval=0", "train.eval_steps=1", "train.log_interval=1", "train.ckpt_interval=0",
        "train.device=cpu", "train.progress=false", "logger=disabled", "downstream.tasks=[mars_quiz]",
        "downstream.interval=2", "downstream.limit=8", "schedule.warmup_steps=0", f"hydra.run.dir={run}",
    ]  # fmt: skip
    proc = subprocess.run(train, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    in_loop = [line for line in lines if "downstream/mars_quiz/acc" in line]
    assert [line["step"] for line in in_loop] == [2, 4]

    evaluate = [sys.executable, "-m", "eval", f"ckpt={run}", "tasks=smoke", "limit=8", "device=cpu"]
    proc = subprocess.run(evaluate, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((run / "eval" / "step_00000004" / "results.json").read_text())
    mars = data["mars"]
    assert mars["step"] == 4 and mars["tokens"] == 4 * 2 * 64
    assert mars["config"]["model"]["n_embd"] == 32  # the run's resolved config travels along
    assert f"| run@4 | {100 * mars['scores']['mars_quiz']['acc_norm']:.2f} |" in proc.stdout
    # the trainer's step-4 scores and the offline scores of the step-4 checkpoint are the same numbers
    for metric in ("acc", "acc_norm"):
        assert in_loop[-1][f"downstream/mars_quiz/{metric}"] == mars["scores"]["mars_quiz"][metric]
