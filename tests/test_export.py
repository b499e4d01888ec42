"""The staged export API: TensorRT claims engine calls first, the caller's partitioners follow,
the caller's programs are never modified, and bad input gets a clear error."""

from pathlib import Path

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir.pass_base import ExportPass
from torch.export import Dim

from pipeline.delegate import blob, pte
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.errors import ExportError
from pipeline.lowering.compile import compile_method
from pipeline.lowering.export import export
from pipeline.lowering.partitioner import TensorRTPartitioner
from pipeline.lowering.serialize import save
from pipeline.models.decoder import MethodView, tiny_decoder
from tests.helpers import MIXED_INPUT as X
from tests.helpers import MIXED_SPEC, Mixed


@pytest.fixture(scope="module")
def mixed() -> torch.export.ExportedProgram:
    return compile_method(Mixed(), (X,), MIXED_SPEC)


@pytest.fixture(scope="module")
def decoder_methods() -> dict[str, torch.export.ExportedProgram]:
    model = tiny_decoder()
    tokens = torch.randint(0, 256, (1, 8))
    _, keys, values = model.prefill(tokens)
    cache = Dim("cache", min=1, max=100)
    return {
        "prefill": compile_method(MethodView(model, "prefill"), (tokens,), method="prefill"),
        "decode": compile_method(MethodView(model, "decode"), (tokens[:, :1], torch.tensor([8]), keys, values),
                                 dynamic_shapes=(({}, {}, {3: cache}, {3: cache}),), method="decode"),
    }


def _backends(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for call in pte.delegate_calls(pte.load_program(path)):
        out.setdefault(call.method, []).append(call.backend)
    return out


def test_tensorrt_then_xnnpack(mixed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    files = save(mixed, tmp_path / "mixed.pte", partitioners=[XnnpackPartitioner()])
    backends = _backends(files["pte"])["forward"]
    assert backends.count("TensorRTBackend") == 3 and "XnnpackBackend" in backends
    assert pte.check_tensorrt_io(pte.load_program(files["pte"])) == 3
    assert "ptd" not in files


def test_external_tensor_data(mixed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Without XNNPACK the conv1d stays portable and its weight becomes external tensor data.
    files = save(mixed, tmp_path / "mixed.pte", external_data=True)
    assert files["ptd"].stat().st_size > 4 * 4 * 3 * 4 and files["ptd"] == tmp_path / "mixed.ptd"
    trt_only = save(compile_method(torch.nn.Linear(8, 8), (torch.randn(2, 8),)), tmp_path / "lin.pte", external_data=True)
    assert _backends(trt_only["pte"]) == {"forward": ["TensorRTBackend"]}
    (engine,) = pte.named_entries(pte.read(trt_only["pte"], trt_only["ptd"]))  # the weights live in the engine
    assert engine["file"] == "ptd" and blob.is_engine_key(engine["key"])
    written = save(compile_method(torch.nn.Linear(8, 8), (torch.randn(2, 8),)), tmp_path / "lin.pte")
    assert "ptd" not in written and not (tmp_path / "lin.ptd").exists()  # a stale .ptd goes


def test_prefill_and_decode_keep_their_engines(decoder_methods, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    lowered = export(decoder_methods, constant_methods={"max_seq_len": 100, "vocab_size": 256})
    manager = lowered.manager
    decode = manager.exported_program("decode")
    keys, values = (n for n in decode.graph.nodes if n.op == "placeholder" and n.name in decode.graph_signature.user_inputs[2:])
    assert str(keys.meta["val"].shape[3]) == str(values.meta["val"].shape[3])  # the shared Dim is still shared
    path = tmp_path / "decoder.pte"
    path.write_bytes(manager.to_executorch().buffer)
    assert _backends(path) == {"prefill": ["TensorRTBackend"], "decode": ["TensorRTBackend"]}
    plans = {p.name: p for p in pte.load_program(path).execution_plan}
    assert {"max_seq_len", "vocab_size"} <= set(plans)
    assert lowered.report["decode"]["num_engines"] == 1


def test_etrecord_is_written(mixed, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    files = save(mixed, tmp_path / "m.pte", etrecord=True)
    assert files["etrecord"].stat().st_size > 0 and files["etrecord"].name == "m_etrecord.bin"


def _snapshot(program: torch.export.ExportedProgram) -> tuple:
    return (str(program.graph), str(program.graph_signature), tuple(program.state_dict),
            tuple(id(t) for t in program.state_dict.values()), tuple(program.constants))


class Boom(ExportPass):
    def call(self, graph_module):  # type: ignore[no-untyped-def]
        raise RuntimeError("injected failure")


def test_caller_program_unchanged_after_success_and_failure(mixed) -> None:  # type: ignore[no-untyped-def]
    before = _snapshot(mixed)
    gm = mixed.module()
    gm_code = gm.code
    export(mixed, partitioners=[XnnpackPartitioner()])
    assert _snapshot(mixed) == before
    with pytest.raises(Exception, match="'Boom' pass"):
        export(mixed, transform_passes=[Boom()])
    assert _snapshot(mixed) == before
    export(gm, inputs=(X,))
    assert gm.code == gm_code


def test_graph_module_source_needs_inputs(mixed) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ExportError, match="needs example `inputs=`"):
        export(mixed.module())


@pytest.mark.parametrize("call, message", [
    (lambda p: export(Mixed()), "plain Mixed; compile it first"),
    (lambda p: export({"a": p, "b": p}), "same ExportedProgram object"),
    (lambda p: export({"forward": p}, partitioners={"fwd": []}), r"unknown method\(s\) \['fwd'\]"),
    (lambda p: export({"forward": p}, compile_specs={"decode": TensorRTCompileSpec()}), r"unknown method\(s\) \['decode'\]"),
    (lambda p: export({"forward": p}, constant_methods={"forward": 1}), "has the name of a program method"),
    (lambda p: export(p, constant_methods={"max-len": 1}), "'max-len' is not a Python identifier"),
    (lambda p: export(p, partitioners=[TensorRTPartitioner(TensorRTCompileSpec(method="decode"))]), "name method 'decode'"),
])
def test_clear_errors(mixed, call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ExportError, match=message):
        call(mixed)


def test_calls_sharing_an_engine_share_one_payload() -> None:
    import operator

    from pipeline.runtime.engine_op import is_engine_call

    x = torch.randn(2, 4)
    gm = compile_method(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), (x,)).module()
    call = next(n for n in gm.graph.nodes if is_engine_call(n))
    output = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(output):  # run the same engine a second time on its own result
        again = gm.graph.call_function(call.target, ([next(iter(call.users))], call.args[1], call.args[2]))
        result = gm.graph.call_function(operator.getitem, (again, 0))
    output.args = ((result,),)
    gm.recompile()
    buffer = export(gm, inputs=(x,)).manager.to_executorch().buffer
    program, named = pte.parse(buffer)
    first, second = (bytes(d.data) for d in program.backend_delegate_data)
    assert len(program.execution_plan[0].delegates) == 2 and first == second
    (engine,) = named.values()  # the file stores the shared engine once
    assert len(buffer) < 1.5 * len(engine)
