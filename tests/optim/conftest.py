"""tests/optim checks the compiled kernels: here the default implementation is the automatic choice
(compiled where a compiler exists), not the multi-tensor path the rest of the suite defaults to."""

import pytest


@pytest.fixture(autouse=True)
def _compiled_kernels_by_default(monkeypatch):
    monkeypatch.setenv("MARS_OPTIM_FUSED", "auto")
