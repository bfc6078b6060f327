"""python -m eval: checkpoints end to end, output files, compare, wandb payload, one-line errors."""

import dataclasses
import importlib.machinery
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from eval_fixtures import TINY, TINY_LLAMA, byte_bpe, write_checkpoint
from hydra import compose, initialize_config_dir

from mars.errors import UserError
from mars.eval import results as results_io
from mars.eval.cli import CONFIG_DIR, run
from mars.eval.config import register_configs

REPO = Path(__file__).resolve().parents[2]


def config(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose("eval", overrides=["device=cpu", *overrides])


def test_checkpoint_end_to_end_writes_results_and_table(run_dir, capsys, monkeypatch):
    (result,) = run(config(f"ckpt={run_dir}", "tasks=smoke", "limit=8"))
    out = run_dir / "eval" / "step_00000010"  # the latest checkpoint of the run
    data = json.loads((out / "results.json").read_text())
    mars = data["mars"]
    assert (mars["step"], mars["tokens"], mars["name"]) == (10, 5120, "tiny_run@10")
    assert mars["path"] == str(run_dir / "ckpt" / "step_00000010")
    assert mars["config"]["train"] == {"max_steps": 10}  # the run's config.yaml
    want = {"tasks": ["mars_quiz"], "limit": 8, "num_fewshot": 0, "batch_size": 8, "dtype": "float32"}
    assert mars["request"] == {**want, "weights": "model"}  # dtype auto computes in float32 on the CPU
    # lm-eval's own results file, untouched
    acc = data["results"]["mars_quiz"]["acc,none"]
    assert acc == mars["scores"]["mars_quiz"]["acc"] == result.scores["mars_quiz"]["acc"]
    assert data["n-samples"]["mars_quiz"]["effective"] == 8 and "configs" in data and "versions" in data
    table = (out / "table.md").read_text().splitlines()
    assert table[0] == "| Model | mars_quiz (acc_norm) | Avg |"
    assert table[2].startswith("| tiny_run@10 | ")
    printed = capsys.readouterr().out
    assert f"wrote {out / 'results.json'}" in printed and "| tiny_run@10 |" in printed

    # the same request again is read back (no task data needed: works offline), a different one is evaluated
    with monkeypatch.context() as m:
        m.setattr("mars.eval.cli.prepare_tasks", lambda *a: pytest.fail("tasks loaded for a reused result"))
        (again,) = run(config(f"ckpt={run_dir}", "tasks=smoke", "limit=8"))
    assert "reusing" in capsys.readouterr().out and again.scores == result.scores
    (other,) = run(config(f"ckpt={run_dir}", "tasks=smoke", "limit=4", f"out={run_dir / 'ev4'}", "name=mine"))
    assert other.name == "mine" and other.request["limit"] == 4
    saved = json.loads((run_dir / "ev4" / "results.json").read_text())
    assert saved["n-samples"]["mars_quiz"]["effective"] == 4


def test_average_true_scores_the_averaged_weights_into_a_dir_of_their_own(run_dir, capsys):
    """A checkpoint of a run with train.average holds its averaged weights (average.safetensors): average=true
    scores them, apart from the model's (their own output dir, row label and request); a checkpoint
    without them is one line before any model is loaded."""
    import torch
    from eval_fixtures import tiny_gpt

    from mars.checkpoint import load_model
    from mars.checkpoint.model_dir import save_average

    step_dir = run_dir / "ckpt" / "step_00000010"
    averaged = tiny_gpt(3)
    save_average({n: p.detach() for n, p in averaged.named_parameters()}, step_dir)
    model, _ = load_model(run_dir, average=True)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), averaged.parameters(), strict=True))
    (result,) = run(config(f"ckpt={run_dir}", "tasks=smoke", "limit=4", "average=true"))
    saved = json.loads((run_dir / "eval" / "step_00000010-average" / "results.json").read_text())["mars"]
    assert saved["name"] == result.name == "tiny_run@10 (averaged)"
    assert saved["request"]["weights"] == "average"
    (model_scores,) = run(config(f"ckpt={run_dir}", "tasks=smoke", "limit=4"))  # not the averaged result
    assert "reusing" not in capsys.readouterr().out and model_scores.request["weights"] == "model"
    with pytest.raises(UserError, match="average=true: .*step_00000005 holds no averaged weights"):
        run(config(f"ckpt={run_dir / 'ckpt' / 'step_00000005'}", "tasks=smoke", "average=true"))


def test_a_llama_checkpoint_is_scored_with_its_runs_tokenizer(tmp_path):
    """The run's data.tokenizer, not GPT-2's: GPT-2's ids (up to 50256) would not fit this model's
    320-token vocabulary."""
    import dataclasses

    import torch

    from mars.model.llama import Llama

    tok = byte_bpe(tmp_path / "tok")
    torch.manual_seed(0)
    model = Llama(dataclasses.replace(TINY_LLAMA, vocab_size=320))
    run_dir = tmp_path / "llama_run"
    write_checkpoint(run_dir, model, step=3, tokens=300, tokenizer=str(tok))
    (result,) = run(config(f"ckpt={run_dir}", "tasks=smoke", "limit=4"))
    assert result.step == 3 and 0.0 <= result.scores["mars_quiz"]["acc"] <= 1.0


def test_compare_rows_side_by_side(run_dir, tmp_path, capsys):
    step5 = run_dir / "ckpt" / "step_00000005"
    evals = run(config(f"compare=[{step5},{run_dir}]", "tasks=smoke", f"out={tmp_path / 'cmp'}"))
    assert [e.name for e in evals] == ["tiny_run@5", "tiny_run@10"]
    assert evals[0].scores != evals[1].scores  # different weights: each row is its own checkpoint
    md = (tmp_path / "cmp" / "compare.md").read_text().splitlines()
    assert md[2].startswith("| tiny_run@5 | ") and md[3].startswith("| tiny_run@10 | ")
    summary = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert [s["step"] for s in summary] == [5, 10]
    # saved results.json files are rows too, no model needed
    saved = run_dir / "eval" / "step_00000005" / "results.json"
    (row,) = run(config(f"compare=[{saved}]", "tasks=smoke"))
    assert row.scores == evals[0].scores and "reusing" in capsys.readouterr().out


def test_unknown_task_fails_before_scoring(run_dir):
    with pytest.raises(UserError, match="'hellaswagg'"):
        run(config(f"ckpt={run_dir}", "tasks=[mars_quiz,hellaswagg]"))
    assert not (run_dir / "eval").exists()


def test_nothing_to_evaluate_and_bad_values(run_dir):
    with pytest.raises(UserError, match="nothing to evaluate"):
        run(config("tasks=smoke"))
    with pytest.raises(UserError, match="limit=-1"):
        run(config(f"ckpt={run_dir}", "limit=-1"))
    with pytest.raises(UserError, match="is not a results.json"):
        results_io.load(run_dir / "ckpt" / "step_00000005" / "meta.json")


def test_a_device_this_machine_lacks_is_refused_before_anything_is_read(tmp_path):
    """train.py's check (mars.train.config.check_device) under eval's key: one line, before the checkpoint
    (here none) is looked for."""
    with pytest.raises(UserError, match=r"^device=cuda:99: this machine has cpu only .*; use device=cpu"):
        run(config(f"ckpt={tmp_path}", "tasks=smoke", "device=cuda:99"))
    with pytest.raises(UserError, match=r"^device='gpu' is not a device .* machine has cpu only .*=auto$"):
        run(config(f"ckpt={tmp_path}", "tasks=smoke", "device=gpu"))


def test_precache_loads_the_tasks_only(capsys):
    assert run(config("precache=true", "tasks=smoke")) == []
    assert "cached the datasets of 1 task(s): mars_quiz" in capsys.readouterr().out


def test_wandb_gets_flat_scores_and_the_table(run_dir, monkeypatch):
    calls = {}

    class FakeRun:
        summary = {}

        def log(self, data, step):
            calls["log"] = (data, step)

        def finish(self):
            calls["finished"] = True

    fake = types.ModuleType("wandb")  # with a __spec__: transformers probes importlib.util.find_spec("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    fake.init = lambda **kw: calls.setdefault("init", kw) and FakeRun()
    fake.Table = lambda columns: types.SimpleNamespace(columns=columns, add_data=lambda *row: None)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_MODE", raising=False)  # (the suite sets it to disabled; it would win)
    overrides = ["tasks=smoke", "limit=4", "wandb.mode=offline", "wandb.project=p"]
    (result,) = run(config(f"ckpt={run_dir}", *overrides))
    init = calls["init"]
    assert (init["project"], init["mode"], init["job_type"]) == ("p", "offline", "eval")
    assert init["name"] == "tiny_run@10"
    assert init["config"]["step"] == 10 and init["config"]["tasks"] == ["mars_quiz"]
    data, step = calls["log"]
    assert step == 10 and calls["finished"]
    assert data["downstream/mars_quiz/acc"] == result.scores["mars_quiz"]["acc"]
    assert data["downstream/table"].columns == ["model", "mars_quiz (acc_norm)", "Avg"]


def _bad_checkpoints(tmp_path):
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.safetensors").write_bytes(b"\x00garbage")
    (tmp_path / "bad" / "model.json").write_text(json.dumps(dataclasses.asdict(TINY)))


@pytest.mark.parametrize(
    "target, expected",
    [
        ("missing_run", "does not exist"),
        ("notes.txt", "is a file, not a checkpoint"),
        ("bad/model.safetensors", "is not a readable safetensors file"),
        ("bad", "is not a readable safetensors file"),
    ],
)
def test_checkpoint_errors_name_the_path(tmp_path, target, expected):
    from mars.errors import CheckpointError

    _bad_checkpoints(tmp_path)
    with pytest.raises(CheckpointError) as err:
        run(config(f"ckpt={tmp_path / target}", "tasks=smoke"))
    msg = str(err.value)
    assert expected in msg and str(tmp_path / target) in msg and "\n" not in msg


def test_command_line_errors_are_one_line_and_exit_2(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    _bad_checkpoints(tmp_path)
    for target in ("missing_run", "notes.txt"):
        proc = subprocess.run(
            [sys.executable, "-m", "eval", f"ckpt={tmp_path / target}", "tasks=smoke"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / target}"), lines
        assert "Traceback" not in proc.stdout + proc.stderr
