"""Fixtures of the data tests: the embedded corpus prepared once per session, small local corpora."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_helpers import make_docs

from mars.data.config import DataConfig


@pytest.fixture(scope="session")
def embedded_dir(tmp_path_factory) -> Path:
    """The real embedded corpus, prepared once per test session (in-process tokenization)."""
    from mars.data.prepare import prepare

    root = tmp_path_factory.mktemp("embedded_root")
    return prepare(DataConfig(root=str(root), num_workers=1), progress_bar=False)


@pytest.fixture(scope="session")
def embedded_cfg(embedded_dir) -> DataConfig:
    return DataConfig(root=str(embedded_dir.parent), num_workers=1)


@pytest.fixture
def docs() -> list[str]:
    return make_docs(60)
