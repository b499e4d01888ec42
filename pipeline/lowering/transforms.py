"""Edge transform passes the configs can name (any ExportPass from trusted modules works too)."""

from __future__ import annotations

import torch
from executorch.exir.pass_base import ExportPass, PassResult


class RemoveDeadCode(ExportPass):
    """Drop nodes whose results nobody uses."""

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        changed = graph_module.graph.eliminate_dead_code()
        graph_module.recompile()
        return PassResult(graph_module, changed)
