"""The README is the user's manual: its self-contained Python examples must run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


# examples that need a run dir or a download are shown with placeholders (RUN_DIR, OUT_DIR)
RUNNABLE = [b for b in python_blocks() if "from mars.optim" in b]


def test_the_optimizer_examples_are_found():
    # approximate, exact, and build_optimizer + set_lr_factor
    assert len(RUNNABLE) >= 3
    assert any("is_approx=False" in b and "stash_previous_grads" in b for b in RUNNABLE)


@pytest.mark.parametrize("code", RUNNABLE, ids=lambda b: b.splitlines()[-1][:40])
def test_readme_example_runs(code, tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip(), "every example prints its result"
