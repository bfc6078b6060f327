"""Fixtures of the training tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    """A data root holding the prepared embedded corpus (prepared once per test session)."""
    from mars.data import DataConfig, ensure_prepared

    root = tmp_path_factory.mktemp("data")
    ensure_prepared(DataConfig(root=str(root)))
    return root


@pytest.fixture
def one_thread():
    """Tiny models run several times faster on one thread (and the CPU is shared)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
