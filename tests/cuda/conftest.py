"""The CUDA tests: every test marked `cuda` skips when the device it needs is not there, and the
optimizers pick their compiled kernels by default (tests/conftest.py makes the multi-tensor path the
default for the rest of the suite)."""

import pytest
import torch
from cuda_helpers import ON_CUDA


def pytest_collection_modifyitems(config, items):
    if ON_CUDA and not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if item.get_closest_marker("cuda"):
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _compiled_kernels_by_default(monkeypatch):
    monkeypatch.setenv("MARS_OPTIM_FUSED", "auto")


@pytest.fixture
def record(record_property):
    """record(key=value, ...): measured values into the JUnit XML, one record_property each (values
    that are None are left out). scripts/gpu_check.py puts them in its report."""

    def record_values(**values):
        for key, value in values.items():
            if value is not None:
                record_property(key, value)

    return record_values
