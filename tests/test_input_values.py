"""Integer inputs that index carry the values they may hold into the program, and the runtime
refuses a call outside them before anything runs, so the program's state stays as it was."""

import pytest
import torch
from torch.export import Dim

from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.delegate import pte
from pipeline.delegate.input_values import Bounds, value_bounds
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.errors import InputError, RuntimeUnavailableError
from pipeline.lowering.compile import compile_method, export_method
from pipeline.lowering.serialize import save
from pipeline.runtime import load
from pipeline.runtime.generate import parse_prompt

TOKENS = Dim("tokens", min=1, max=8)


class Cached(torch.nn.Module):
    """Writes the embeddings of T tokens at positions start..start+T-1 of a 16-position cache (as a
    decoder's static cache does) and returns what the cache holds; a class id picks an offset."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 4)
        self.register_buffer("cache", torch.zeros(16, 4))

    def forward(self, tokens: torch.Tensor, start: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1]) + start
        self.cache.index_put_((positions,), self.embed(tokens[0]))
        return self.cache * 1.0 + label.to(torch.float32)


def _example() -> tuple[torch.Tensor, ...]:
    return torch.tensor([[1, 2, 3]]), torch.tensor([0]), torch.tensor([2])


def test_bounds_come_from_the_tables_the_inputs_index() -> None:
    program = export_method(Cached().eval(), _example(), ({1: TOKENS}, None, None))
    tokens, start, label = value_bounds(program, [None, None, (0, 9)])
    assert tokens == Bounds(0, 31)
    assert start == Bounds(0, 15, (0, 1, 16))  # start + T <= 16
    assert label == Bounds(0, 9)  # no table: the declared range


def test_decoder_configs_bound_token_ids_and_positions() -> None:
    cfg = typed(compose(["model=llama_tiny"]))
    spec = cfg.model.methods["prefill"]
    program = export_method(objects.method_module(objects.model(cfg), spec), objects.example_inputs(spec, 0),
                            objects.dynamic_shapes(spec))
    assert value_bounds(program, objects.declared_values(spec)) == [Bounds(0, 255), Bounds(0, 63, (0, 1, 64))]


@pytest.fixture(scope="module")
def cached(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The model as a program of portable kernels (nothing for TensorRT: it runs on the CPU here)."""
    program = compile_method(Cached().eval().requires_grad_(False), _example(), TensorRTCompileSpec(min_block_size=1000),
                             dynamic_shapes=({1: TOKENS}, None, None), input_values=[None, None, (0, 9)])
    return save(program, tmp_path_factory.mktemp("cached") / "cached.pte")


def test_the_record_carries_the_bounds(cached: dict[str, object]) -> None:
    specs = pte.read(cached["pte"]).record.inputs["forward"]  # type: ignore[arg-type, union-attr]
    assert [(s.values, s.end) for s in specs] == [((0, 31), None), ((0, 15), (0, 1, 16)), ((0, 9), None)]


@pytest.mark.parametrize("tokens, start, label, message", [
    ([[1, 300, 3]], [0], [2], "input 0 holds 300, but the program takes values 0..31"),
    ([[1, -5, 3]], [0], [2], "input 0 holds -5"),
    ([[10**9]], [0], [2], "input 0 holds 1000000000"),
    ([[1, 2, 3]], [1000], [2], r"input 1 holds 1000, but the program takes values 0..13 with 3 positions from it"),
    ([[1, 2, 3]], [-7], [2], "input 1 holds -7"),
    ([[1, 2, 3]], [14], [2], r"input 1 holds 14, but the program takes values 0..13"),
    ([[1, 2, 3]], [0], [10], "input 2 holds 10, but the program takes values 0..9"),
])
def test_values_outside_are_refused_and_the_state_stays(cached: dict[str, object], tokens: list[list[int]],
                                                        start: list[int], label: list[int], message: str) -> None:
    method = load(cached["pte"]).method("forward")  # type: ignore[arg-type]
    good = [torch.tensor([[4, 5]]), torch.tensor([3]), torch.tensor([1])]
    first = method.execute(good)[0]
    with pytest.raises(InputError, match=message):
        method.execute([torch.tensor(tokens), torch.tensor(start), torch.tensor(label)])
    fresh = load(cached["pte"]).method("forward")  # type: ignore[arg-type]
    fresh.execute(good)
    after = [torch.tensor([[6]]), torch.tensor([13]), torch.tensor([1])]
    assert torch.equal(method.execute(after)[0], fresh.execute(after)[0])  # the refused call wrote nothing
    assert not torch.equal(first, method.execute(after)[0])


def test_the_last_positions_are_taken(cached: dict[str, object]) -> None:
    method = load(cached["pte"]).method("forward")  # type: ignore[arg-type]
    out = method.execute([torch.tensor([[7, 8, 9]]), torch.tensor([13]), torch.tensor([0])])[0]
    assert out[13:].abs().sum() > 0 and out[:13].abs().sum() == 0


def test_a_call_that_fails_midway_refuses_every_later_call(cached: dict[str, object]) -> None:
    program = load(cached["pte"])  # type: ignore[arg-type]
    method = program.method("forward")
    method._steps.insert(len(method._steps) - 1, lambda values: (_ for _ in ()).throw(RuntimeError("device lost")))
    with pytest.raises(RuntimeError, match="device lost"):
        method.execute([torch.tensor([[1]]), torch.tensor([0]), torch.tensor([0])])
    with pytest.raises(RuntimeUnavailableError, match="may be half-written; load the program again"):
        method.execute([torch.tensor([[1]]), torch.tensor([0]), torch.tensor([0])])


@pytest.mark.parametrize("text", ["1 256 9", "1 5 9"])
def test_prompts_of_ascii_ids_parse(text: str) -> None:
    assert parse_prompt(text).tolist() == [[int(t) for t in text.split()]]


@pytest.mark.parametrize("text", ["1 ٥ 9", "1 -5", "", "1 5x", "99999999999999999999", "१२"])
def test_other_prompts_are_refused(text: str) -> None:
    with pytest.raises(InputError, match="token ids in ASCII digits"):
        parse_prompt(text)
