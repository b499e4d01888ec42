"""Inputs are checked against the program, never stretched or cast to fit: count, dtype and every
dim against the range the program (and each engine) was built for; one `InputError` naming the
method, the input, the dim, the value and the allowed range."""

from pathlib import Path

import pytest
import torch

from pipeline.delegate import blob, pte
from pipeline.errors import InputError
from pipeline.runtime import load
from tests.helpers import GPU
from tests.reliability.conftest import linear


@pytest.mark.parametrize("batch", [17, 20, 32, 64])
def test_dynamic_dim_past_its_range_is_refused(portable_files: dict[str, Path], batch: int) -> None:
    method = load(portable_files["pte"], portable_files["ptd"]).method("forward")
    with pytest.raises(InputError, match=rf"method 'forward' input 0 dim 0 is {batch}, but the program was built for 1\.\.16"):
        method.execute([torch.randn(batch, 8)])


def test_in_range_inputs_run_and_match_eager(portable_files: dict[str, Path]) -> None:
    method = load(portable_files["pte"], portable_files["ptd"]).method("forward")
    for batch in (1, 16, 3):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(method.execute([x])[0], linear(0)(x))
    with pytest.raises(InputError):  # a refused call leaves the method usable
        method.execute([torch.randn(17, 8)])
    torch.testing.assert_close(method.execute([torch.ones(2, 8)])[0], linear(0)(torch.ones(2, 8)))


@pytest.mark.parametrize("value, message", [
    (torch.randn(2, 8, dtype=torch.float64), r"dtype float64, but the program takes float32\[1\.\.16, 8\]"),
    (torch.randint(0, 5, (2, 8)), r"dtype int64, but the program takes float32"),
    (torch.randn(2, 8).half(), r"dtype float16"),
    (torch.randn(0, 8), r"dim 0 is 0, but the program was built for 1\.\.16"),
    (torch.randn(2, 9), r"dim 1 is 9, but the program was built for exactly 8"),
    (torch.randn(2, 8, 1), r"has 3 dims \[2, 8, 1\]"),
    (torch.randn(8), r"has 1 dims \[8\]"),
    (3.0, r"must be a tensor float32\[1\.\.16, 8\], got a float"),
])
def test_wrong_dtype_rank_or_static_dim_is_refused(portable_files: dict[str, Path], value: object, message: str) -> None:
    method = load(portable_files["pte"], portable_files["ptd"]).method("forward")
    with pytest.raises(InputError, match=message):
        method.execute([value])


@pytest.mark.parametrize("count", [0, 2])
def test_wrong_input_count_is_refused(portable_files: dict[str, Path], count: int) -> None:
    method = load(portable_files["pte"], portable_files["ptd"]).method("forward")
    with pytest.raises(InputError, match=f"method 'forward' takes 1 inputs, got {count}"):
        method.execute([torch.randn(2, 8)] * count)


def test_planned_memory_never_grows(portable_files: dict[str, Path]) -> None:
    method = load(portable_files["pte"], portable_files["ptd"]).method("forward")
    arenas = [v.untyped_storage().nbytes() for v in method._values if isinstance(v, torch.Tensor)]
    method.execute([torch.randn(16, 8)])
    with pytest.raises(InputError):
        method.execute([torch.randn(64, 8)])
    assert [v.untyped_storage().nbytes() for v in method._values if isinstance(v, torch.Tensor)] == arenas


def test_engine_blobs_carry_their_profile_range(trt_files: dict[str, Path]) -> None:
    (call,) = pte.delegate_calls(pte.read(trt_files["pte"]).program)
    meta, _ = blob.decode(call.payload)
    (binding,) = meta.inputs
    assert (binding.spec.min, binding.spec.max) == ((1, 8), (16, 8))
    binding.spec.check("engine input", torch.randn(16, 8))
    with pytest.raises(InputError, match=r"engine input dim 0 is 17, but the program was built for 1\.\.16"):
        binding.spec.check("engine input", torch.randn(17, 8))


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [17, 20, 32, 64])
def test_tensorrt_method_refuses_batches_past_its_range_on_gpu(trt_files: dict[str, Path], batch: int) -> None:
    assert GPU
    method = load(trt_files["pte"]).method("forward")
    with pytest.raises(InputError, match=f"dim 0 is {batch}"):
        method.execute([torch.randn(batch, 8, device="cuda")])
    with pytest.raises(InputError, match="dtype float64"):
        method.execute([torch.randn(2, 8, dtype=torch.float64, device="cuda")])
    x = torch.randn(16, 8, device="cuda")
    torch.testing.assert_close(method.execute([x])[0].cpu(), linear(0)(x.cpu()), atol=2e-2, rtol=2e-2)


def test_an_input_that_requires_grad_leaves_no_autograd_behind(portable_files: dict[str, Path]) -> None:
    method = load(portable_files["pte"], portable_files["ptd"]).method("forward")
    x = torch.randn(4, 8, requires_grad=True)
    out = method.execute([x])[0]
    assert not out.requires_grad and out.grad_fn is None
    again = method.execute([torch.randn(2, 8)])[0]  # another shape: planned memory is resized, no autograd in the way
    assert again.shape == (2, 4) and not again.requires_grad
