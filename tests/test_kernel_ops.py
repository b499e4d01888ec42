"""Fewer kernels between engines: the copies an Edge decomposition makes of its scalar constants
become constants at build, and a clamp below then above becomes one clamp; the values stay the
same in ExecuTorch's runtime."""

import torch
from executorch.exir import to_edge
from executorch.runtime import Runtime

from pipeline.lowering.kernel_ops import fewer_kernels


class Gates(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("bias", torch.arange(16, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        clipped = torch.clamp(torch.clamp(x, min=-1.0), max=0.5)
        return torch.nn.functional.hardsigmoid(x) * 2 + self.bias.float() + clipped


def _calls(program: torch.export.ExportedProgram) -> list[str]:
    return [n.target.__name__ for n in program.graph.nodes if n.op == "call_function"]


def test_constant_casts_fold_and_clamps_merge_with_the_same_values() -> None:
    x = torch.randn(1, 16, 1, 1) * 5
    edge = to_edge(torch.export.export(Gates(), (x,)))
    program = edge.exported_program()
    before = _calls(program)
    assert before.count("dim_order_ops._to_dim_order_copy.default") == 4 and before.count("aten.clamp.default") == 4
    assert fewer_kernels(program) == 6
    after = _calls(program)
    assert "dim_order_ops._to_dim_order_copy.default" not in after and after.count("aten.clamp.default") == 2
    assert len(after) == len(before) - 6
    assert all(n.name.startswith("_folded_") or n.name == "x" for n in program.graph.find_nodes(op="placeholder"))
    buffer = edge.to_executorch().buffer
    loaded = Runtime.get().load_program(buffer)  # the method reads the program: both stay referenced
    method = loaded.load_method("forward")
    for value in (x, torch.full_like(x, float("nan")), torch.linspace(-8, 8, 16).reshape(1, 16, 1, 1)):
        torch.testing.assert_close(method.execute([value])[0], Gates()(value), equal_nan=True)
