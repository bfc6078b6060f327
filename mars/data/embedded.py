"""The embedded corpus: English prose that ships inside every Python install.

Two parts, both read without importing anything that has side effects:
  * the reference manual's topics in ``pydoc_data.topics`` (what ``help("if")`` prints), one
    document per topic;
  * the standard library's docstrings, read with ``ast`` from the ``.py`` sources (never imported):
    one document per module-level definition (the module docstring, each top-level function, each
    top-level class with its methods' docstrings).

Files and topics are visited in sorted order and the documents are then shuffled with a seeded
``random.Random``, so the corpus is the same on every machine with the same Python version
(about 600k GPT-2 tokens for Python 3.11).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import random
import sys
import sysconfig
from pathlib import Path

# Directory names under the standard library that hold tests, bundled wheels or installed packages.
_SKIP_DIRS = {
    "test",
    "tests",
    "idle_test",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "_bundled",
    "pydoc_data",
}
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's ``.py`` files, sorted by their path relative to ``root``."""
    root = root or stdlib_dir()
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).parts
        if any(part in _SKIP_DIRS or part.startswith("config-") for part in rel[:-1]):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _definition_docstrings(node: ast.AST) -> list[str]:
    """Docstrings of ``node`` and of every definition nested in it, in source order."""
    out = []
    doc = ast.get_docstring(node, clean=True)
    if doc:
        out.append(doc)
    for child in getattr(node, "body", []):
        if isinstance(child, _DEFS):
            out.extend(_definition_docstrings(child))
    return out


def module_documents(source: bytes) -> list[str]:
    """One document per module-level definition that carries prose, the module docstring first."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # a few stdlib files are templates or use future syntax
        return []
    docs = []
    module_doc = ast.get_docstring(tree, clean=True)
    if module_doc:
        docs.append(module_doc)
    for node in tree.body:
        if isinstance(node, _DEFS):
            parts = _definition_docstrings(node)
            if parts:
                docs.append("\n\n".join(parts))
    return docs


def topic_documents() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[key].strip() for key in sorted(topics) if topics[key].strip()]


def embedded_documents(seed: int = 1337) -> list[str]:
    """The whole corpus as a list of documents in a seeded, machine-independent order."""
    return list(_documents(seed, stdlib_dir()))


@functools.lru_cache(maxsize=2)
def _documents(seed: int, root: Path) -> tuple[str, ...]:
    # Built once per process: parsing the standard library takes a few seconds.
    docs = topic_documents()
    for path in stdlib_files(root):
        docs.extend(module_documents(path.read_bytes()))
    random.Random(seed).shuffle(docs)
    return tuple(docs)


def corpus_fingerprint(docs: list[str]) -> str:
    h = hashlib.sha256()
    for doc in docs:
        h.update(doc.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


def python_version() -> str:
    return ".".join(map(str, sys.version_info[:3]))
