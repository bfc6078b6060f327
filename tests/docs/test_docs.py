"""The manual (README.md and docs/*.md) must be true as written: its Python examples run, its relative
links lead to files and headings that exist, and the README stays a short newcomer's path."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 350

# Pages that other changes are writing. A link to one of them is accepted while the page does not
# exist yet; once it exists its links and headings are checked like any other page's.
# Remove an entry when its page has landed.
PENDING_PAGES: set[str] = set()

# An example that needs what a test cannot provide (a trained run dir, an export, a GPU) says so with
# one of these placeholders (a CUDA test is marked as one); it is only compiled. Every other ```python
# block is run as written.
PLACEHOLDERS = ("RUN_DIR", "OUT_DIR", "@pytest.mark.cuda")

FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def python_blocks() -> list[tuple[str, str]]:
    """(page:line, code) of every ```python block of the manual."""
    blocks = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in PYTHON_BLOCK.finditer(text):
            blocks.append((f"{rel(page)}:{text.count(chr(10), 0, m.start()) + 1}", m.group(1)))
    return blocks


BLOCKS = python_blocks()
RUNNABLE = [(where, code) for where, code in BLOCKS if not any(p in code for p in PLACEHOLDERS)]
SHOWN = [(where, code) for where, code in BLOCKS if any(p in code for p in PLACEHOLDERS)]


def test_the_optimizer_examples_are_found():
    # approximate, exact, and build_optimizer + set_lr_factor, each run by test_example_runs
    optim = [code for _, code in RUNNABLE if "from mars.optim" in code]
    assert len(optim) >= 3
    assert any("from mars.optim import MARS" in b and "is_approx=False" not in b for b in optim)
    assert any("is_approx=False" in b and "stash_previous_grads" in b for b in optim)
    assert any("build_optimizer" in b and "set_lr_factor" in b for b in optim)


@pytest.mark.parametrize("where,code", RUNNABLE, ids=[w for w, _ in RUNNABLE])
def test_example_runs(where, code, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, f"{where}: {out.stderr[-2000:]}"
    assert out.stdout.strip(), f"{where}: every example prints its result"


@pytest.mark.parametrize("where,code", SHOWN, ids=[w for w, _ in SHOWN])
def test_placeholder_example_compiles(where, code):
    compile(code, where, "exec")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces -> '-'."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
    return {f"{base}-{i}" if i else base for base, n in seen.items() for i in range(n)}


def links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, mailto:


def test_slug_matches_github():
    assert slug("5. Exact MARS in a training loop") == "5-exact-mars-in-a-training-loop"
    assert slug("Training step (`scripts/bench_train.py`)") == "training-step-scriptsbench_trainpy"
    assert slug("Drop-in use: the torch.optim contract") == "drop-in-use-the-torchoptim-contract"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            if dest.is_relative_to(ROOT) and rel(dest) in PENDING_PAGES:
                continue
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {rel(dest)})")
    assert not broken, f"{rel(page)}: broken links: {', '.join(broken)}"


def test_every_docs_page_is_in_the_readme_index():
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README)}
    missing = [rel(p) for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"README.md does not link {', '.join(missing)}"


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, (
        f"README.md has {n} lines; keep it at most {README_MAX_LINES}: move reference to docs/"
    )
