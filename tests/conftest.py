"""Test-run wiring: `gpu`-marked tests skip cleanly without CUDA and TensorRT."""

import pytest

from tests.helpers import GPU


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU and TensorRT")
    for item in items:
        if "gpu" in item.keywords and not GPU:
            item.add_marker(skip)
