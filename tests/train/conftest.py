"""Fixtures of the training tests."""

from __future__ import annotations

import logging
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
def restore_logging():
    """Hydra configures the root logger (a handler on the test's captured stdout): undo it after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for h in root.handlers[:]:
        if h not in handlers:
            root.removeHandler(h)
            h.close()
    root.setLevel(level)


@pytest.fixture
def one_thread():
    """Tiny models run several times faster on one thread (and the CPU is shared)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
