"""docs/research.md's worked example runs as written and prints exactly the numbers the page explains."""

from __future__ import annotations

import contextlib
import io
import re
import tempfile
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "research.md"


def test_the_worked_example_prints_what_the_page_shows(tmp_path, monkeypatch):
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("### 3.6 A worked example") : text.index("### 3.7")]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    (shown,) = re.findall(r"```text\n(.*?)```", section, flags=re.S)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the example writes its sweep
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), {"__name__": "__main__"})
    assert out.getvalue() == shown
    # the numbers the explanation quotes are in the output it explains
    explanation = section.split("Reading the gamma = 0.05 row")[1]
    quoted = ("-0.0468", "-0.0485", "-0.0315", "0.00540", "0.0159", "0.0707", "0.0478", "0.0562", "0.0306")
    for number in quoted:
        assert number in shown and number in explanation
