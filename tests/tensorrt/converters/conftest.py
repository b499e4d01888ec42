"""Every converter test runs twice: its numbers checked by the CPU reference executor ([cpu]), and by
the engine itself on a GPU ([gpu]: a test of its own, marked `gpu`, skipped visibly without one)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import helpers


@pytest.fixture(autouse=True, params=["cpu", pytest.param("gpu", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not helpers.GPU, reason="needs CUDA and TensorRT")])])
def checked_on(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(helpers, "CHECK_ON", request.param)
    yield request.param
