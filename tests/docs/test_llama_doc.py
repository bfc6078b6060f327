"""docs/llama.md stays true: its Python example runs, its preset table holds the counts the code gives,
and every preset of configs/model/ it names exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "llama.md").read_text(encoding="utf-8")


def test_the_python_example_runs(tmp_path):
    (code,) = re.findall(r"```python\n(.*?)```", DOC, flags=re.S)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["Llama", "2", "LlamaForCausalLM"]


def test_the_preset_table_matches_the_configs_and_the_counts():
    from mars.model.spec import model_config, spec_for

    rows = re.findall(r"^\| `(llama_\w+)` \|(.*)$", DOC, flags=re.M)
    presets = sorted(p.stem for p in (REPO / "configs" / "model").glob("llama_*.yaml"))
    assert sorted(r[0] for r in rows) == presets and len(presets) == 5
    for preset, rest in rows:
        cells = [c.strip() for c in rest.split("|")]
        raw = yaml.safe_load((REPO / "configs" / "model" / f"{preset}.yaml").read_text())
        c = model_config({k: v for k, v in raw.items() if k != "defaults"})
        spec = spec_for(c)
        heads = f"{c.n_head} ({c.n_kv_head})" if c.n_kv_head is not None else str(c.n_head)
        assert cells[:4] == [str(c.n_layer), str(c.n_embd), heads, cells[3]]
        assert cells[3].split()[0] == str(c.mlp_hidden or 704)
        assert cells[4:6] == [str(c.block_size), "tied" if c.tie_embeddings else "untied"]
        assert cells[6:8] == [
            f"{spec.count_params(c, True) / 1e6:.2f}M",
            f"{spec.count_params(c, False) / 1e6:.2f}M",
        ]
