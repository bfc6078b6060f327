"""The public extension points, used from outside the package exactly as the manual shows them: the
plugin of docs/hacking.md (a MARS variant with another c_t, and a logged metric) and the reader of
docs/data.md (a data source), written to a temporary directory, named in MARS_PLUGINS, and trained
with through `python train.py`; report and plots then take the new metric with --metric.

The variant's c_t is g + gamma (g - g_prev), which is MARS-AdamW's g + gamma beta / (1 - beta)
(g - g_prev) with gamma scaled by (1 - beta) / beta: the two runs must give the same losses, which
proves the variant's correction is the one that ran (and only it changed)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from train_helpers import PYTHON, REPO, subprocess_env

from mars.metrics_jsonl import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.extended]  # make test-all

BETA1 = 0.95  # MARS-AdamW's default betas[0]
GAMMA = 0.05


def block(page: str, first_line: str) -> str:
    """The ```python block of a manual page that starts with `first_line`."""
    text = (REPO / page).read_text(encoding="utf-8")
    for code in re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
        if code.startswith(first_line):
            return code
    raise AssertionError(f"{page} has no python block starting {first_line!r}")


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory):
    """A directory holding the manual's two plugin modules and a corpus, and the environment naming them."""
    root = tmp_path_factory.mktemp("plugins")
    (root / "my_ideas.py").write_text(block("docs/hacking.md", "# my_ideas.py"))
    (root / "my_lines.py").write_text(block("docs/data.md", "# my_lines.py"))
    import pydoc_data.topics

    lines = [" ".join(text.split()) for _, text in sorted(pydoc_data.topics.topics.items())[:120]]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n")
    env = subprocess_env()
    env["PYTHONPATH"] = f"{root}:{env['PYTHONPATH']}"
    env["MARS_PLUGINS"] = "my_ideas,my_lines"
    return root, env


def run(args: list[str], env: dict, cwd: Path = REPO) -> subprocess.CompletedProcess:
    out = subprocess.run([PYTHON, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{' '.join(args)}: {out.stderr[-3000:]}"
    return out


def train(root: Path, env: dict, run_dir: Path, *overrides: str) -> list[dict]:
    run(
        [
            "train.py",
            "model=gpt2_tiny",
            "model.n_layer=1",
            "model.n_head=2",
            "model.n_embd=64",
            "model.block_size=32",
            "data=lines",
            f"data.paths=[{root / 'corpus.txt'}]",
            f"data.root={root / 'data'}",
            "logger=disabled",
            "train.device=cpu",
            "train.progress=false",
            "train.batch_size=4",
            "train.global_batch_size=4",
            "train.max_steps=5",
            "train.log_interval=1",
            "train.eval_interval=5",
            "train.eval_steps=2",
            "train.ckpt_interval=0",
            "schedule.warmup_steps=0",
            f"hydra.run.dir={run_dir}",
            *overrides,
        ],
        env,
    )
    return read_metrics(run_dir / "metrics.jsonl")


def test_a_plugin_optimizer_metric_and_source_train_through_train_py(plugin_env, tmp_path):
    root, env = plugin_env
    prepared = run(
        [
            "scripts/prepare_data.py",
            "data=lines",
            f"data.paths=[{root / 'corpus.txt'}]",
            f"data.root={root / 'data'}",
        ],
        env,
    )
    assert (root / "data" / "lines" / "manifest.json").is_file(), prepared.stdout
    manifest = json.loads((root / "data" / "lines" / "manifest.json").read_text())
    assert manifest["source"] == {"name": "lines", "files": [str(root / "corpus.txt")]}

    sweep = tmp_path / "sweep"
    variant = train(root, env, sweep / "plain", "optimizer=mars_plain", f"optimizer.gamma={GAMMA}")
    builtin = train(
        root,
        env,
        sweep / "builtin",
        "optimizer=mars_adamw",
        f"optimizer.gamma={GAMMA * (1 - BETA1) / BETA1!r}",
    )
    config = (sweep / "plain" / ".hydra" / "config.yaml").read_text()
    assert "name: mars_plain" in config and "name: lines" in config

    train_lines = [r for r in variant if "train/loss" in r]
    assert [r["step"] for r in train_lines] == [1, 2, 3, 4, 5]
    # the plugin's metric, on every training line; the weights move, so it changes
    rms = [r["weights/rms"] for r in train_lines]
    assert all(isinstance(v, float) and v > 0 for v in rms) and len(set(rms)) > 1
    # the variant's c_t ran: it equals MARS-AdamW with the rescaled gamma, loss for loss
    losses = [r["train/loss"] for r in train_lines]
    expected = [r["train/loss"] for r in builtin if "train/loss" in r]
    assert losses == pytest.approx(expected, rel=1e-5, abs=1e-5)
    # ... and it is not MARS-AdamW with the same gamma (the correction mattered)
    same_gamma = train(root, env, tmp_path / "same_gamma", "optimizer=mars_adamw", f"optimizer.gamma={GAMMA}")
    other = [r["train/loss"] for r in same_gamma if "train/loss" in r]
    assert max(abs(a - b) for a, b in zip(losses, other, strict=True)) > 1e-4

    # report and plots take the plugin's metric like a built-in one (no plugin needed to read it)
    plain_env = subprocess_env()
    out = run(
        ["scripts/report.py", str(sweep), "--metric", "weights/rms", "--out", str(tmp_path / "report")],
        plain_env,
    )
    report = (tmp_path / "report" / "report.md").read_text()
    assert "weights/rms" in report and "mars_plain" in report, out.stdout
    png = tmp_path / "rms.png"
    run(["scripts/plot_curves.py", str(sweep), "--metric", "weights/rms", "--out", str(png)], plain_env)
    assert png.is_file() and png.stat().st_size > 0
