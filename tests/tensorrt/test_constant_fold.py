"""Constant folding in the compile step: what models compute from constants in `forward` (position
ids, masks, relative-position tables, standardized weights) becomes a constant before partitioning."""

import torch

from pipeline.compile import compile_method
from pipeline.tensorrt.constant_fold import fold_constants
from pipeline.tensorrt.engine_op import is_engine_call
from tests.helpers import GPU, assert_close


class Tables(torch.nn.Module):
    """A relative-position table indexed through a mask built from zeros with ops TensorRT lacks."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(9, 4), requires_grad=False)
        coords = torch.stack(torch.meshgrid(torch.arange(3), torch.arange(3), indexing="ij")).flatten(1)
        self.register_buffer("index", (coords[:, :, None] - coords[:, None, :]).abs().sum(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.table[self.index.flatten()].view(9, 9, 4).permute(2, 0, 1)  # [4, 9, 9]
        mask = torch.zeros(9, 9).index_put_((torch.arange(9), torch.arange(9)), torch.tensor(-1.0))
        return torch.softmax(x + bias + torch.atan2(mask, mask + 2), dim=-1)


def test_constant_subgraphs_fold_away() -> None:
    model = Tables()
    gm = torch.export.export(model, (torch.randn(1, 4, 9, 9),)).run_decompositions().module()
    assert any("atan2" in str(n.target) for n in gm.graph.nodes)
    assert fold_constants(gm) >= 1
    ops = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not any(name in op for op in ops for name in ("atan2", "index_put", "index.Tensor", "arange"))
    x = torch.randn(1, 4, 9, 9)
    torch.testing.assert_close(gm(x), model(x))


def test_folded_model_lowers_to_one_engine() -> None:
    model = Tables()
    x = torch.randn(1, 4, 9, 9)
    program = compile_method(model, (x,))
    calls = [n for n in program.graph.nodes if is_engine_call(n)]
    left = [n for n in program.graph.nodes if n.op == "call_function" and not is_engine_call(n) and "getitem" not in str(n.target)]
    assert len(calls) == 1 and left == []
    if GPU:
        assert_close(program.module()(x.cuda()), model(x), "fp32")


def test_large_results_stay_operators() -> None:
    class Expand(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("row", torch.randn(1, 4096))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.row.expand(8192, 4096).sum(0)  # 128 MiB if folded step by step

    gm = torch.export.export(Expand(), (torch.randn(4096),)).module()
    fold_constants(gm)
    sizes = [getattr(gm, n.target).numel() for n in gm.graph.nodes if n.op == "get_attr"]
    assert max(sizes) <= 1 << 24
