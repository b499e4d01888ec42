"""Test-run wiring: `gpu`-marked tests skip cleanly without CUDA and TensorRT; the engine cache of
the run (and of the commands it starts) is a fresh folder of its own; the longest file starts first."""

import os
import tempfile

import pytest

from tests.helpers import GPU

os.environ["PIPELINE_ENGINE_CACHE"] = tempfile.mkdtemp(prefix="engine-cache-")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The end-to-end DVC tests run in order on one worker and take longest: start them first, so
    # the other worker takes the rest meanwhile (`--dist loadfile` hands out files in this order).
    items.sort(key=lambda item: "test_dvc_pipeline.py" not in item.nodeid)
    skip = pytest.mark.skip(reason="needs a CUDA GPU and TensorRT")
    for item in items:
        if "gpu" in item.keywords and not GPU:
            item.add_marker(skip)
