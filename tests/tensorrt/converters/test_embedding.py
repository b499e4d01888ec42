"""Embedding converter."""

import pytest
import torch

from tests.helpers import check_converter, refusal

torch.manual_seed(0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_builds_engine(dtype: torch.dtype) -> None:
    check_converter(torch.nn.Embedding(50, 16), (torch.randint(0, 50, (2, 7), dtype=dtype),))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_honours_precision(precision: str) -> None:
    check_converter(torch.nn.Embedding(50, 16), (torch.randint(0, 50, (2, 7)),), precision=precision)


def test_refuses_integer_table() -> None:
    class IntTable(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", torch.arange(20).reshape(10, 2))

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.embedding(idx, self.table)

    reasons = refusal(IntTable(), (torch.randint(0, 10, (3,)),))
    assert any("not floating point" in r for r in reasons.values()), reasons
