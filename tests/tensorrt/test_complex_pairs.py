"""Complex rotary embeddings (Llama 4's and Meta's reference Llama's: `torch.polar`,
`view_as_complex`, a complex product, `view_as_real`) become real pairs: the graph computes the same
without a complex value, and the method lowers into one engine over a variable number of tokens."""

import torch
from torch.export import Dim

from pipeline.lowering.compile import compile_method, drop_metadata_asserts, export_method
from pipeline.lowering.complex_pairs import complex_as_pairs
from pipeline.runtime.engine_op import is_engine_call
from tests.helpers import assert_close, assert_engines_checked, assert_not_degenerate, gpu


class ComplexRotary(torch.nn.Module):
    """Queries and keys rotated by complex frequencies over positions start..start+T-1."""

    def __init__(self, head_dim: int = 8) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.proj = torch.nn.Linear(16, 2 * 2 * head_dim)

    def forward(self, x: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        positions = (torch.arange(x.shape[1]) + start).float()
        angles = positions[:, None] * self.inv_freq[None, :]
        freqs = torch.polar(torch.ones_like(angles), angles)  # [T, D/2] complex
        q, k = self.proj(x).view(x.shape[0], x.shape[1], 2, 2, -1).unbind(2)  # [B, T, H, D] each
        rotated = []
        for t in (q, k):
            pairs = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
            rotated.append(torch.view_as_real(pairs * freqs[None, :, None, :]).flatten(3))
        q, k = rotated
        return (q * k).sum(-1) + (0.5 * freqs.unsqueeze(0) * freqs.unsqueeze(0)).real.sum(-1, keepdim=True)


INPUTS = (torch.randn(1, 6, 16), torch.tensor([3]))
DYNAMIC = ({1: Dim("tokens", min=1, max=32)}, None)


def _complex_nodes(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if getattr(n.meta.get("val"), "is_complex", lambda: False)()]


def test_the_rewritten_graph_computes_the_same_without_complex_values() -> None:
    module = ComplexRotary().eval()
    gm = export_method(module, INPUTS, DYNAMIC).module()
    drop_metadata_asserts(gm)
    assert _complex_nodes(gm)
    assert complex_as_pairs(gm) == 3
    assert _complex_nodes(gm) == []
    for call in (INPUTS, (torch.randn(1, 11, 16), torch.tensor([0]))):
        want = module(*call)
        assert_not_degenerate(want)
        torch.testing.assert_close(gm(*call), want, rtol=1e-5, atol=1e-5)


def test_a_complex_rotary_embedding_lowers_into_one_engine() -> None:
    module = ComplexRotary().eval()
    program = compile_method(module, INPUTS, dynamic_shapes=DYNAMIC)
    left = [str(n.target) for n in program.graph.nodes
            if n.op == "call_function" and not is_engine_call(n) and "getitem" not in str(n.target)]
    assert sum(is_engine_call(n) for n in program.graph.nodes) == 1 and left == []
    assert_engines_checked(program)


@gpu
def test_a_complex_rotary_embedding_runs_on_the_gpu() -> None:
    module = ComplexRotary().eval()
    program = compile_method(module, INPUTS, dynamic_shapes=DYNAMIC)
    x, start = torch.randn(1, 9, 16), torch.tensor([2])
    assert_close(program.module()(x.cuda(), start.cuda()), module(x, start), "fp32")
