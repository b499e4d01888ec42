"""State updated where it lives: a program's TensorRT engine that updates a state buffer in place (a
KV cache, through TensorRT's KV-cache update; the output `aliases` an input in its blob) writes its
output into the buffer's own value, and the write-back copy ExecuTorch emits after it goes. So does
an engine that reads a state buffer and writes its new value as a separate output (transformers'
cache counters, `new = old + T`): the output argument is the buffer's value too, which the runtimes
take as "this output is that state input's new value" (TensorRT writes it elsewhere, and it is
copied into the state where the state lives: on the device).

ExecuTorch emits a method that mutates a buffer as "delegate writes a new tensor, then
`aten::copy_(buffer, new)`". An engine whose output is its input's memory makes that copy a full
pass over the cache on every decode step (under ExecuTorch's runtime, a host copy of the whole
cache). With the delegate's output argument set to the buffer, any runtime hands the engine one
tensor for both (what in-place means), and the cache never moves: `pipeline.runtime` binds the
state where it lives, and the native delegate keeps it on the device, where every TensorRT delegate
handed that buffer (of any method) reads it.

So a buffer is rewritten only when TensorRT delegates are all that touch it, in every method: each
write-back of it goes (its new value read by nothing else, the buffer read by nothing between), and
no kernel, other delegate, method input or output sees it; otherwise it stays as ExecuTorch
emitted it. Chains with jumps are left alone (removing an instruction would move their targets).
"""

from __future__ import annotations

from typing import Any

from pipeline.delegate import blob
from pipeline.delegate.plan import delegate_view
from pipeline.runtime.values import state_values


def write_in_place(program: Any) -> int:
    """Rewrite `program` (ExecuTorch's emitted `Program`) as above; returns how many write-backs went."""
    found: list[tuple[str, Any, Any, int, int, int]] = []  # (buffer, chain, delegate call, output arg, buffer, copy at)
    barred: set[str] = set()
    for plan in program.execution_plan:
        names = state_values(plan)
        barred |= {names[i] for i in [*plan.inputs, *plan.outputs] if i in names}
        for chain in plan.chains:
            calls = [i.instr_args for i in chain.instructions]
            if any(type(c).__name__ == "JumpFalseCall" for c in calls):
                barred |= set(names.values())
                continue
            writes = _write_backs(program, plan, calls)
            for n, call in enumerate(calls):
                if n not in writes and not _is_tensorrt(plan, call):
                    barred |= {names[a] for a in _values(call) if a in names}
            found += [(names.get(state, ""), chain, call, arg, state, n) for n, (call, arg, state) in writes.items()]
    gone: dict[int, tuple[Any, set[int]]] = {}
    for name, chain, call, arg, state, n in found:
        if name and name not in barred:
            call.args[arg] = state
            gone.setdefault(id(chain), (chain, set()))[1].add(n)
    for chain, positions in gone.values():
        chain.instructions = [i for n, i in enumerate(chain.instructions) if n not in positions]
    return sum(len(p) for _, p in gone.values())


def _is_tensorrt(plan: Any, call: Any) -> bool:
    return type(call).__name__ == "DelegateCall" and plan.delegates[call.delegate_index].id == blob.BACKEND_ID


def _values(call: Any) -> list[Any]:
    """The values an instruction names (reads or writes)."""
    return [*getattr(call, "args", ()), getattr(call, "move_from", None), getattr(call, "move_to", None),
            getattr(call, "value_index", None)]


def _write_backs(program: Any, plan: Any, calls: list[Any]) -> dict[int, tuple[Any, int, int]]:
    """The write-backs that can go: copy position -> (TensorRT delegate call, its in-place output's
    argument position, the buffer it updates)."""
    out = {}
    for at, call in enumerate(calls):
        if not _is_tensorrt(plan, call):
            continue
        meta, _ = delegate_view(bytes(program.backend_delegate_data[plan.delegates[call.delegate_index].processed.index].data))
        inputs = {b.name: k for k, b in enumerate(meta.inputs)}
        for o, binding in enumerate(meta.outputs):
            arg = len(meta.inputs) + o
            new = call.args[arg]
            if binding.aliases in inputs:
                state = call.args[inputs[binding.aliases]]
            else:  # a new value of state the engine reads (a step counter): the same tensor, or left alone
                state = _copied_into(plan, calls[at + 1:], new)
                if state not in call.args[: len(meta.inputs)]:
                    continue
            copy = _write_back(calls, at, plan, state, new)
            if copy is not None:
                out[copy] = (call, arg, state)
    return out


def _copied_into(plan: Any, calls: list[Any], new: int) -> int | None:
    """The value the first `copy_(value, new)` in `calls` writes, when it has `new`'s dtype and sizes."""
    for call in calls:
        if type(call).__name__ == "KernelCall" and plan.operators[call.op_index].name == "aten::copy_":
            state, source = call.args[:2]
            if source == new:
                a, b = plan.values[state].val, plan.values[new].val
                same = type(a).__name__ == type(b).__name__ == "Tensor" and (a.scalar_type, list(a.sizes)) == (
                    b.scalar_type, list(b.sizes))
                return state if same else None
    return None


def _write_back(calls: list[Any], at: int, plan: Any, state: int, new: int) -> int | None:
    """The position of `copy_(state, new)` after `at`, when it is `new`'s one use and nothing before it
    names `state`; else None."""
    if new in plan.outputs:
        return None
    found = None
    for n, call in enumerate(calls[at + 1:], start=at + 1):
        values = _values(call)
        is_copy = (type(call).__name__ == "KernelCall" and plan.operators[call.op_index].name == "aten::copy_"
                   and values[:2] == [state, new])
        if is_copy and found is None:
            found = n
        elif new in values or (found is None and state in values):
            return None
    return found
