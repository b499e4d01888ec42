"""What a program needs from ExecuTorch's runtime besides its delegates: the operators it leaves to
kernels (the portable library's and its prim ops), checked against the kernels ExecuTorch's runtime
library registers. A program that calls one the library lacks runs in `pipeline.runtime` only, so
the serialize step names each such operator (a warning, or an error with
`serialize.runtime_kernels=error`) and records them in the manifest."""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Mapping
from typing import Any

CHOICES = ("warn", "error")  # serialize.runtime_kernels: what a missing kernel is


def kernel_calls(program: Any) -> dict[str, list[str]]:
    """The operators each method of a parsed program calls as kernels (`aten::sort.values`), in the
    order they are first called."""
    out: dict[str, list[str]] = {}
    for plan in program.execution_plan:
        names = [f"{op.name}.{op.overload}" if op.overload else op.name for op in plan.operators]
        calls = out.setdefault(plan.name, [])
        for chain in plan.chains:
            for instr in chain.instructions:
                if type(instr.instr_args).__name__ == "KernelCall" and names[instr.instr_args.op_index] not in calls:
                    calls.append(names[instr.instr_args.op_index])
    return out


@functools.cache
def registered() -> tuple[frozenset[str] | None, str]:
    """The operators ExecuTorch's runtime library has kernels for, and what was asked: its Python
    runtime's registry (`None` with the reason when that library does not load here)."""
    version = importlib.metadata.version("executorch")
    try:
        from pipeline.executorch_api import operator_names

        names = operator_names()
    except Exception as exc:  # an ExecuTorch built for another torch fails in its own ways
        return None, f"ExecuTorch {version}'s runtime library does not load here ({type(exc).__name__}: {exc})"
    return frozenset(names), f"the kernels ExecuTorch {version}'s runtime library registers"


def report(program: Any) -> dict[str, Any]:
    """`{"missing": {method: [operator, ...]}, "checked_against": ...}`: the kernel calls of each
    method that ExecuTorch's runtime library lacks (methods without any are left out); `missing` is
    None when the library could not be asked."""
    known, against = registered()
    if known is None:
        return {"missing": None, "checked_against": against}
    missing = {m: [op for op in ops if op not in known] for m, ops in kernel_calls(program).items()}
    return {"missing": {m: ops for m, ops in missing.items() if ops}, "checked_against": against}


def summary(found: Mapping[str, Any]) -> str | None:
    """One line naming what `report` found missing, or None when nothing is."""
    missing = found.get("missing")
    if missing is None:
        return f"could not check which kernels the program needs: {found['checked_against']}"
    if not missing:
        return None
    named = "; ".join(f"{method}: {', '.join(ops)}" for method, ops in missing.items())
    return (f"the program calls kernels ExecuTorch's runtime library lacks ({named}), so only pipeline.runtime runs "
            "it: let TensorRT take those ops (a converter; check compile.torch_executed_ops) or accept it")
