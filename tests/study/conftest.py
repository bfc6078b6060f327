"""Fixtures of the study's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    """A data root holding the prepared embedded corpus, for the studies that run train.py."""
    from mars.data import DataConfig, ensure_prepared

    root = tmp_path_factory.mktemp("data")
    ensure_prepared(DataConfig(root=str(root)))
    return root
