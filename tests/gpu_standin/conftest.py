"""Fixtures of the stand-in tests."""

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """A data root holding the prepared embedded corpus."""
    from mars.data import DataConfig, ensure_prepared

    root = tmp_path_factory.mktemp("data")
    ensure_prepared(DataConfig(root=str(root)))
    return root
