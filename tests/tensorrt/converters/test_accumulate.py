"""Converters that add values into indexed positions (repeats add up): scatter_add, scatter_reduce's
sum, index_add / index_put with accumulate, embedding bags (sum, mean, max); fp16 and dynamic dims."""

import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

from tests.helpers import Fn, check_converter, refusal

torch.manual_seed(0)
X = torch.randn(2, 5, 6)
INDEX = torch.randint(0, 6, (2, 5, 4))  # repeated positions along the last dim
TABLE = torch.randn(20, 8)
IDS = torch.tensor([3, 0, 7, 7, 19, 2, 5, 11, 0, 4])
OFFSETS = torch.tensor([0, 3, 3, 7])  # the second bag is empty

CASES = {
    "scatter_add": (lambda m, x, i, s: torch.scatter_add(x, 2, i, s), (INDEX, torch.randn(2, 5, 4))),
    "scatter_add_dim1": (lambda m, x, i, s: torch.scatter_add(x, 1, i, s) * 2,
                         (torch.randint(0, 5, (2, 9, 6)), torch.randn(2, 9, 6))),
    "scatter_add_larger_src": (lambda m, x, i, s: torch.scatter_add(x, 2, i, s), (INDEX, torch.randn(2, 5, 7))),
    "scatter_reduce_sum": (lambda m, x, i, s: torch.scatter_reduce(x, 2, i, s, "sum"), (INDEX, torch.randn(2, 5, 4))),
    "scatter_reduce_sum_without_self": (lambda m, x, i, s: torch.scatter_reduce(x, 2, i, s, "sum", include_self=False),
                                        (INDEX, torch.randn(2, 5, 4))),
    "index_add": (lambda m, x, i, s: x.index_add(1, i, s), (torch.tensor([0, 2, 2, 4]), torch.randn(2, 4, 6))),
    "index_put_accumulate": (lambda m, x, i, v: torch.index_put(x, (i,), v, accumulate=True),
                             (torch.tensor([1, -1, 1]), torch.randn(3, 5, 6))),
    "index_put_accumulate_broadcast": (lambda m, x, i: torch.ops.aten.index_put(x, [None, i], torch.tensor(0.5), True),
                                       (torch.tensor([4, 0, 4, 4]),)),
}
BAGS = {
    "sum": {"mode": "sum"},
    "mean": {"mode": "mean"},
    "max": {"mode": "max"},
    "weighted": {"mode": "sum", "per_sample_weights": torch.rand(10)},
    "padding": {"mode": "mean", "padding_idx": 7},
    "last_offset": {"mode": "sum", "include_last_offset": True},
}


def _bag(name: str) -> Fn:
    options = dict(BAGS[name])
    weights = options.pop("per_sample_weights", None)
    module = Fn(lambda m, ids, offsets: F.embedding_bag(ids, m.table, offsets, per_sample_weights=m.weights, **options)
                if weights is not None else F.embedding_bag(ids, m.table, offsets, **options))
    module.register_buffer("table", TABLE)
    module.register_buffer("weights", weights)
    return module


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_engine(name: str) -> None:
    fn, extra = CASES[name]
    check_converter(Fn(fn), (X, *extra))


@pytest.mark.parametrize("name", ["scatter_add", "index_add", "index_put_accumulate"])
def test_fp16(name: str) -> None:
    fn, extra = CASES[name]
    check_converter(Fn(fn), (X, *extra), precision="fp16")


def test_dynamic_batch() -> None:
    batch = Dim("batch", min=2, max=16)
    fn, extra = CASES["scatter_add"]
    check_converter(Fn(fn), (X, *extra), dynamic_shapes=(({0: batch}, {0: batch}, {0: batch}),))
    fn, extra = CASES["index_add"]
    check_converter(Fn(fn), (X, *extra), dynamic_shapes=(({0: batch}, {}, {0: batch}),))


@pytest.mark.parametrize("name", sorted(BAGS))
def test_embedding_bag(name: str) -> None:
    offsets = torch.cat([OFFSETS, torch.tensor([10])]) if BAGS[name].get("include_last_offset") else OFFSETS
    check_converter(_bag(name), (IDS, offsets))


def test_embedding_bag_fp16_and_dynamic_index_count() -> None:
    check_converter(_bag("mean"), (IDS, OFFSETS), precision="fp16")
    check_converter(_bag("max"), (IDS, OFFSETS), dynamic_shapes=(({0: Dim("ids", min=4, max=64)}, {}),))


@pytest.mark.parametrize("fn, inputs, reason", [
    (lambda m, x, i, s: torch.scatter_add(x, 1, i, s), (torch.randint(0, 9, (2, 9)), torch.randint(0, 5, (2, 3)),
                                                      torch.randint(0, 5, (2, 3))), "a sum into int64"),
    (lambda m, x, i, s: torch.scatter_reduce(x, 2, i, s, "amax"), (X, INDEX, torch.randn(2, 5, 4)), "reduce='amax'"),
    (lambda m, x, i, s: torch.scatter_add(x, 2, i, s), (X, INDEX[:, :3], torch.randn(2, 3, 4)), "smaller than the input"),
    (lambda m, x, i, s: torch.scatter_add(x, 1, i, s), (torch.randn(1, 20000, 8), torch.randint(0, 20000, (1, 20000, 8)),
                                                      torch.randn(1, 20000, 8)), "one-hot matrix of"),
])
def test_refusals_say_why(fn, inputs, reason: str) -> None:  # noqa: ANN001 - a lambda
    reasons = refusal(Fn(fn), inputs)
    assert any(reason in r for r in reasons.values()), reasons
