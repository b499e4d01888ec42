"""index_select, gather, advanced indexing, constant padding and repeat converters; fp16 and a
dynamic batch dim where the op allows."""

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from tests.helpers import Fn, check_converter, refusal

torch.manual_seed(0)
X = torch.randn(2, 5, 6)
LONG = torch.int64

CASES = {
    "index_select_constant": (lambda m, x: torch.index_select(x, 1, m.idx) * 2, {"idx": torch.tensor([0, 3, 1])}, ()),
    "index_select_input": (lambda m, x, i: torch.index_select(x, 2, i), {}, (torch.tensor([5, 0, 1]),)),
    "gather": (lambda m, x, i: torch.gather(x, 2, i), {}, (torch.randint(0, 6, (2, 5, 3)),)),
    "gather_smaller_index": (lambda m, x, i: torch.gather(x, 1, i), {}, (torch.randint(0, 5, (1, 3, 2)),)),
    "index_one_dim": (lambda m, x, i: x[:, i], {}, (torch.tensor([0, 2, -1, 4]),)),
    "index_first_dim_2d_index": (lambda m, x, i: x[i], {}, (torch.tensor([[1, 0], [0, 1]]),)),
    "index_two_dims": (lambda m, x, i, j: x[:, i, j], {}, (torch.tensor([0, 1, 4]), torch.tensor([5, -2, 0]))),
    "index_broadcast": (lambda m, x, i, j: x[i, j], {}, (torch.tensor([[0], [1]]), torch.tensor([4, 2, 0]))),
    "pad": (lambda m, x: F.pad(x, (1, 2, 0, 3), value=0.5), {}, ()),
    "pad_crop": (lambda m, x: F.pad(x, (-1, 2)), {}, ()),
    "repeat": (lambda m, x: x.repeat(2, 1, 3), {}, ()),
    "repeat_adds_dims": (lambda m, x: x.repeat(2, 1, 1, 3), {}, ()),
}


def _module(name: str) -> Fn:
    fn, buffers, _ = CASES[name]
    module = Fn(fn)
    for key, value in buffers.items():
        module.register_buffer(key, value)
    return module


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_engine(name: str) -> None:
    check_converter(_module(name), (X, *CASES[name][2]))


@pytest.mark.parametrize("name", ["index_select_input", "gather", "index_two_dims", "pad", "repeat"])
def test_fp16(name: str) -> None:
    check_converter(_module(name), (X, *CASES[name][2]), precision="fp16")


@pytest.mark.parametrize("name", ["index_select_constant", "index_one_dim", "pad", "repeat"])
def test_dynamic_batch(name: str) -> None:
    batch = Dim("batch", min=2, max=16)
    extra = CASES[name][2]
    check_converter(_module(name), (X, *extra), dynamic_shapes=(({0: batch}, *({} for _ in extra)),))


def test_refuses_boolean_mask() -> None:
    reasons = refusal(Fn(lambda m, x: x[x > 0] * 2), (X,))
    assert "boolean-mask" in reasons.get("aten.index.Tensor", "") or any("data-dependent" in r for r in reasons.values())
