"""Reading .pte files: TensorRT delegates parse and their bindings match the program's tensors."""

import dataclasses

import pytest
import torch

from pipeline.delegate import blob, pte
from pipeline.errors import BlobFormatError
from tests.helpers import Fn, lower


def test_delegate_bindings_match_program() -> None:
    edge, _ = lower(Fn(lambda m, x, y: (torch.relu(x) + y, (x * 2).to(torch.float16))), (torch.randn(2, 5), torch.randn(5)))
    program = pte.load_program(edge.to_executorch().buffer)
    assert pte.check_tensorrt_io(program) == 1
    (call,) = pte.delegate_calls(program)
    meta, _ = blob.decode(call.payload)
    assert [b.dtype for b in meta.io_bindings] == ["float32", "float32", "float32", "float16"]


def test_mismatch_is_reported() -> None:
    edge, _ = lower(Fn(lambda m, x: x * 2), (torch.randn(2, 5),))
    program = pte.load_program(edge.to_executorch().buffer)
    (call,) = pte.delegate_calls(program)
    meta, engine = blob.decode(call.payload)
    wrong = dataclasses.replace(meta, io_bindings=(dataclasses.replace(meta.io_bindings[0], shape=(2, 6)), *meta.io_bindings[1:]))
    plan = program.execution_plan[0]
    program.backend_delegate_data[plan.delegates[0].processed.index].data = blob.encode(engine, wrong)
    with pytest.raises(BlobFormatError, match=r"shape \[2, 6\] but the program's tensor is \[2, 5\]"):
        pte.check_tensorrt_io(program)
