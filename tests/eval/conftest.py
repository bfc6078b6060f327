"""Fixtures of the eval tests."""

import pytest
from eval_fixtures import tiny_gpt, write_checkpoint


@pytest.fixture
def run_dir(tmp_path):
    """A run dir with two checkpoints (steps 5 and 10; 10 is the latest) of different weights."""
    run = tmp_path / "tiny_run"
    write_checkpoint(run, tiny_gpt(1), step=5, tokens=5 * 512)
    write_checkpoint(run, tiny_gpt(2), step=10, tokens=10 * 512)
    return run
