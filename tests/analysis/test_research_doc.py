"""docs/research.md's worked example runs as written and prints exactly the numbers the page explains."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "research.md"


def test_the_worked_example_prints_what_the_page_shows(tmp_path):
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### 3.6 A worked example") : text.index("### 3.7")]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    (shown,) = re.findall(r"```text\n(.*?)```", section, flags=re.S)
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout == shown
    # the numbers the explanation quotes are in the output it explains
    for number in (
        "-0.0468",
        "-0.0485",
        "-0.0315",
        "0.00540",
        "0.0159",
        "0.0707",
        "0.0478",
        "0.0562",
        "0.0306",
    ):
        assert number in shown
        assert number in section.split("Reading the gamma = 0.05 row")[1]
