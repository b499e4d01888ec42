"""Program state: buffers a program's methods write (a KV cache, a step counter) are the program's,
never constants. They reach engines as inputs at run time, are kept once for all methods in the
`.pte` (what prefill writes, decode reads), and persist across calls in `pipeline.runtime`."""

from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.delegate.blob import decode_op_metadata
from pipeline.delegate.pte import read
from pipeline.errors import ExportError
from pipeline.lowering.compile import compile_method, compile_program, export_method, written_state
from pipeline.lowering.export import export
from pipeline.lowering.serialize import save
from pipeline.models.decoder import MethodView
from pipeline.runtime import load
from pipeline.runtime.values import state_values
from tests.helpers import GPU


class Accumulator(torch.nn.Module):
    """`add` writes the state; `peek` only reads it."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__()
        self.register_buffer("total", torch.full((4,), start))

    def add(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x)
        return self.total * 1.0

    def peek(self, x: torch.Tensor) -> torch.Tensor:
        return self.total + 0.0 * x


class Cache(torch.nn.Module):
    """A KV-cache-like state: `write` puts rows at positions, `read` attends over all of them."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, 2, 8, 4))
        self.proj = torch.nn.Linear(4, 4)

    def write(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(2, positions, self.proj(x))
        return self.cache.sum(dim=2)

    def append(self, x: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Rows at start, start + 1, ... (as transformers' static cache writes): updated in place."""
        self.cache.index_copy_(2, torch.arange(x.shape[2]) + start, self.proj(x))
        return self.cache.sum(dim=2)

    def read(self, q: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ self.cache.transpose(-1, -2), dim=-1) @ self.cache


def _programs(module: torch.nn.Module, calls: dict[str, tuple[torch.Tensor, ...]], engines: bool) -> dict[str, Any]:
    exported = {m: export_method(MethodView(module, m), args) for m, args in calls.items()}
    if not engines:
        return exported
    state = written_state(exported.values())
    return {m: compile_program(exported[m], calls[m], method=m, state=state) for m in calls}


@pytest.mark.parametrize("external", [False, True])
def test_state_is_shared_by_the_methods_and_kept_across_calls(external: bool, tmp_path: Path) -> None:
    """With data external too: a method that only reads the state reads it, not a constant in the .ptd."""
    calls = {"add": (torch.ones(4),), "peek": (torch.ones(4),)}
    files = save(_programs(Accumulator(), calls, engines=False), tmp_path / "acc.pte", external_data=external)
    path = files["pte"]
    program = load(path, files.get("ptd"), device="cpu")
    add, peek = program.method("add"), program.method("peek")
    step = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert torch.equal(peek.execute([step])[0], torch.zeros(4))
    add.execute([step])
    add.execute([step])
    assert torch.equal(peek.execute([torch.zeros(4)])[0], 2 * step)  # what add wrote, peek reads
    assert torch.equal(load(path, files.get("ptd"), device="cpu").method("peek").execute([step])[0], torch.zeros(4))  # a fresh load starts over
    # Programs start their state at zero: state that would start elsewhere is refused in one line.
    with pytest.raises(ExportError, match="buffer 'module.total', which method 'add' writes, does not start at zero"):
        save(_programs(Accumulator(start=5.0), calls, engines=False), tmp_path / "acc5.pte")
    assert not (tmp_path / "acc5.pte").exists()


def test_written_buffers_reach_engines_as_inputs_and_are_never_folded() -> None:
    module = Cache().eval()
    calls = {"write": (torch.randn(1, 2, 3, 4), torch.tensor([0, 1, 2])), "read": (torch.randn(1, 2, 1, 4),)}
    programs = _programs(module, calls, engines=True)
    for name, program in programs.items():
        (engine,) = [n for n in program.graph.nodes if n.op == "call_function" and "execute_engine" in str(n.target)]
        state = program.graph_signature.inputs_to_buffers
        fed = {state[a.name] for a in engine.args[0] if a.name in state}
        assert fed == {"module.cache"}, (name, fed)  # the cache comes in at run time, not built into the engine
        assert not any("folded" in b for b in program.graph_signature.buffers), program.graph_signature.buffers
    lowered = export(programs)
    manager = lowered.manager
    assert all(not r["left_over"] for r in lowered.report.values()), lowered.report
    assert set(manager.exported_program("write").graph_signature.buffers_to_mutate.values()) == {"module.cache"}


def test_compiled_alone_a_reading_method_builds_state_into_its_engine() -> None:
    """Why the compile step passes `state`: a method compiled on its own cannot know another writes."""
    module = Cache().eval()
    alone = compile_method(MethodView(module, "read"), (torch.randn(1, 2, 1, 4),), method="read")
    assert "module.cache" not in alone.graph_signature.inputs_to_buffers.values()  # inside the engine
    told = compile_method(MethodView(module, "read"), (torch.randn(1, 2, 1, 4),), method="read", state={"module.cache"})
    assert "module.cache" in told.graph_signature.inputs_to_buffers.values()


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
def test_engines_read_what_the_other_method_wrote(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = Cache().eval()
    x, q = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 1, 4)
    calls = {"write": (x, torch.tensor([0, 1, 2])), "read": (q,)}
    path = save(_programs(module, calls, engines=True), tmp_path / "cache.pte")["pte"]
    program = load(path)
    with torch.no_grad():
        program.method("write").execute([x.cuda(), torch.tensor([0, 1, 2]).cuda()])
        program.method("write").execute([x.cuda() * 2, torch.tensor([5, 6, 7]).cuda()])
        got = program.method("read").execute([q.cuda()])[0].cpu()
        module.write(x, torch.tensor([0, 1, 2]))
        module.write(x * 2, torch.tensor([5, 6, 7]))
        want = module.read(q)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


def _aliases(program: Any) -> dict[str, str]:
    """Engine output -> the engine input it updates in place, from the engine call's bindings."""
    (engine,) = [n for n in program.graph.nodes if n.op == "call_function" and "execute_engine" in str(n.target)]
    meta, _ = decode_op_metadata(engine.args[2])
    return {b.name: b.aliases for b in meta.outputs if b.aliases}


def test_a_cache_written_at_consecutive_positions_is_updated_in_place() -> None:
    """A run of positions (one position, or `arange + start`) on a state input is TensorRT's KV cache
    update, whose output is the input's memory; any other index writes a new tensor (a scatter)."""
    module = Cache().eval()
    calls = {"append": (torch.randn(1, 2, 3, 4), torch.tensor([2])), "write": (torch.randn(1, 2, 3, 4), torch.tensor([0, 4, 2])),
             "read": (torch.randn(1, 2, 1, 4),)}
    programs = _programs(module, calls, engines=True)
    assert list(_aliases(programs["append"]).values()) == ["module_cache"]
    assert _aliases(programs["write"]) == {}


def test_the_program_has_the_engine_write_the_cache_where_it_lives(tmp_path: Path) -> None:
    """The engine's in-place output is the state's own value and ExecuTorch's write-back copy is gone
    (`write_back.py`): any runtime hands the engine one tensor, and a step never copies the cache."""
    module = Cache().eval()
    calls = {"append": (torch.randn(1, 2, 3, 4), torch.tensor([2])), "read": (torch.randn(1, 2, 1, 4),)}
    program = read(save(_programs(module, calls, engines=True), tmp_path / "cache.pte")["pte"]).program
    _assert_the_engine_writes_the_state(program, "append", "cache")


def test_a_new_value_of_state_the_engine_reads_is_written_into_the_state(tmp_path: Path) -> None:
    """A state buffer the engine reads and writes as a separate output (`total = total + x`, as
    transformers' cache counters) gets the engine's output argument too, and its write-back goes:
    a runtime keeps such state where it lives (the native delegate: on the device) as well."""
    calls = {"add": (torch.ones(4),), "peek": (torch.ones(4),)}
    program = read(save(_programs(Accumulator(), calls, engines=True), tmp_path / "acc.pte")["pte"]).program
    _assert_the_engine_writes_the_state(program, "add", "total")


def _assert_the_engine_writes_the_state(program: Any, method: str, buffer: str) -> None:
    """`method` is one engine call (no write-back copy) that takes the state `buffer` and whose output
    argument for its new value is the state's own value; the method's inputs and outputs are not state."""
    plan = next(p for p in program.execution_plan if p.name == method)
    (instruction,) = [i.instr_args for c in plan.chains for i in c.instructions]  # the engine alone
    assert type(instruction).__name__ == "DelegateCall"
    (state,) = [i for i, name in state_values(plan).items() if name.endswith(buffer)]
    outputs = len(plan.outputs) + 1  # the method's output and the state's new value
    inputs, written = instruction.args[:-outputs], instruction.args[-outputs:]
    assert state in inputs and state in written
    assert state not in plan.inputs and state not in plan.outputs


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
def test_engines_keep_a_new_value_of_state_across_calls_and_methods(tmp_path: Path) -> None:
    calls = {"add": (torch.ones(4),), "peek": (torch.ones(4),)}
    program = load(save(_programs(Accumulator(), calls, engines=True), tmp_path / "acc.pte")["pte"])
    step = torch.tensor([1.0, 2.0, 3.0, 4.0]).cuda()
    for _ in range(2):
        program.method("add").execute([step])
    assert torch.equal(program.method("peek").execute([torch.zeros(4).cuda()])[0].cpu(), 2 * step.cpu())


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs CUDA and TensorRT")
def test_in_place_updates_chain_across_calls(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = Cache().eval()
    x, q = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 1, 4)
    calls = {"append": (x, torch.tensor([0])), "read": (q,)}
    program = load(save(_programs(module, calls, engines=True), tmp_path / "cache.pte")["pte"])
    (state,) = program.state.values()
    before = state.data_ptr()
    with torch.no_grad():
        for start in (0, 3, 5):  # the last one is clamped into the cache: rows 5..7
            program.method("append").execute([x.cuda() * (start + 1), torch.tensor([start]).cuda()])
            module.append(x * (start + 1), torch.tensor([start]))
        got = program.method("read").execute([q.cuda()])[0].cpu()
        want = module.read(q)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    (delegate,) = [s for s in program.method("append")._steps if hasattr(s, "donated")]
    assert delegate.donated and state.data_ptr() == before  # the engine wrote the program's own state
