"""`compile.decode_kernels`: a decoder's one-token decode step runs its products and its attention in the
project's kernels between engines. On the CPU: the rewritten graph computes what the model does (its products by the
kernels' reference, int4 with the engines' rounding), every engine between is checked by the reference
executor, and the program carries the kernels' PTX and the packed weights; on a GPU, the program's
decode steps give transformers' logits and greedy tokens."""

import copy
import json
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.delegate import plan, pte
from pipeline.engine import quantize
from pipeline.engine.compile_spec import QuantizeSpec, TensorRTCompileSpec
from pipeline.kernels import formats, ptx
from pipeline.kernels.attention_op import is_decode_attention
from pipeline.kernels.product_op import is_decode_product
from pipeline.lowering.compile import export_method
from pipeline.lowering.constant_fold import fold_constants, written_buffers
from pipeline.lowering.decode_attention import take_attention
from pipeline.lowering.decode_products import take_products
from pipeline.lowering.fused_attention import fuse_attention
from pipeline.models.hf import decoder
from pipeline.steps import run_all
from tests.helpers import assert_engines_checked, gpu

SIZE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256}
# +experiment=llm_decode_kernels at llama_tiny's size: prefill one engine over a token range, decode one token.
BUILD = ["+experiment=llm_decode_kernels", "cache=off", "serialize=default", "compile.per_method.prefill.profiles=[{tokens:[16,16,16]}]",
         *(f"model.kwargs.{k}={v}" for k, v in SIZE.items()), "model.kwargs.max_cache_len=64",
         "model.methods.prefill.dims.tokens.max=64", "model.methods.prefill.inputs.0.shape=[1,16]",
         "model.methods.prefill.inputs.0.high=256", "model.methods.decode.inputs.0.high=256"]


def _decode_graph(mode: str, tokens: int = 1, architecture: str = "llama") -> tuple[torch.fx.GraphModule, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)  # the model's random weights
    model = decoder(architecture=architecture, max_cache_len=32, dtype="float16", **SIZE)  # type: ignore[arg-type]
    inputs = (torch.randint(0, 256, (1, tokens), generator=torch.Generator().manual_seed(0)), torch.tensor([3]))
    gm = export_method(model, inputs).module()
    fold_constants(gm, written_buffers(gm))
    return gm, inputs


@pytest.mark.parametrize("mode, tokens, architecture", [("none", 1, "llama"), ("int4_weight_only", 1, "llama"),
                                                       ("fp8", 1, "llama"), ("none", 3, "llama"), ("int4_weight_only", 1, "qwen2")])
def test_the_rewritten_step_computes_the_models_logits_on_the_cpu(mode: str, tokens: int, architecture: str) -> None:
    """The products go to `decode_product` calls (q, k and v as one, gate and up as one), each attention
    (found whole) to a `decode_attention` call that feeds the output product directly (the model's
    transpose and reshape taken in), and the step gives the model's logits: fp16 at fp16's rounding, int4
    and fp8 those of the model with its weights rounded as the engines store them; Qwen2's q, k and v
    carry biases."""
    gm, inputs = _decode_graph(mode, tokens, architecture)
    spec = TensorRTCompileSpec(precision="fp16", decode_kernels=True, quantize={"mode": mode, "group_size": 32})
    want_gm = copy.deepcopy(gm)
    if mode != "none":  # the model as its weights are stored
        scheme = quantize.scheme(spec.quantize, quantize.SLOTS_BY_LAYER["linear"], "")
        for node in want_gm.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default):
            weight = node.args[1]
            owner, name = want_gm.get_submodule(".".join(str(weight.target).split(".")[:-1])), str(weight.target).split(".")[-1]
            setattr(owner, name, torch.nn.Parameter(quantize.simulated(getattr(owner, name).data, scheme), requires_grad=False))
    state = written_buffers(gm)
    assert fuse_attention(gm) == SIZE["num_hidden_layers"]
    assert take_products(gm, spec, state, "decode") == 7 * SIZE["num_hidden_layers"] + 1
    assert take_attention(gm, spec, "decode") == SIZE["num_hidden_layers"]
    calls = [n for n in gm.graph.nodes if is_decode_product(n)]
    assert len(calls) == 4 * SIZE["num_hidden_layers"] + 1  # qkv, o, gate-up, down a layer; the head
    assert not gm.graph.find_nodes(op="call_function", target=torch.ops.aten.linear.default)
    attention = [n for n in gm.graph.nodes if is_decode_attention(n)]
    assert len(attention) == SIZE["num_hidden_layers"] and all(
        [is_decode_product(u) for u in a.users] == [True] for a in attention)  # [B, T, H * D], as the o product reads
    with torch.no_grad():
        got = gm(*[t.clone() for t in inputs])
        want = want_gm(*[t.clone() for t in inputs])
    got, want = (torch.utils._pytree.tree_leaves(v)[0].float() for v in (got, want))
    assert want.abs().max() > 1e-2
    assert (got - want).abs().max() <= 2e-3 * want.abs().max(), ((got - want).abs().max(), want.abs().max())


def test_products_the_kernels_cannot_take_stay_in_tensorrt() -> None:
    """A prompt of 9 tokens is more than the kernels take; int8 weights are no format of theirs."""
    gm, _ = _decode_graph("none", tokens=9)
    spec = TensorRTCompileSpec(precision="fp16", decode_kernels=True)
    assert take_products(gm, spec, written_buffers(gm), "prefill") == 0
    gm, _ = _decode_graph("none")
    int8 = TensorRTCompileSpec(precision="fp16", decode_kernels=True, quantize={"mode": "int8_weight_only"})
    assert take_products(gm, int8, written_buffers(gm), "decode") == 0
    assert take_products(gm, TensorRTCompileSpec(precision="fp16"), written_buffers(gm), "decode") == 0


def test_attention_the_kernels_do_not_take_stays_in_tensorrt_and_the_log_says_why(caplog: pytest.LogCaptureFixture) -> None:
    """Nine tokens are more than the attention kernels take; an attention left as written
    (compile.attention=as_written) is not found whole, and the log names the setting that hands it over."""
    spec = TensorRTCompileSpec(precision="fp16", decode_kernels=True)
    gm, _ = _decode_graph("none", tokens=9)
    assert fuse_attention(gm) == SIZE["num_hidden_layers"]
    with caplog.at_level("INFO", logger="pipeline.lowering.compile"):
        assert take_attention(gm, spec, "prefill") == 0
    assert "2 attention(s) stay in TensorRT" in caplog.text and "is not 1 to 8 tokens" in caplog.text
    gm, _ = _decode_graph("none")
    as_written = TensorRTCompileSpec(precision="fp16", decode_kernels=True, attention="as_written")
    take_products(gm, as_written, written_buffers(gm), "decode")
    with caplog.at_level("INFO", logger="pipeline.lowering.compile"):
        assert take_attention(gm, as_written, "decode") == 0
    assert "compile.attention=as_written, so attention stays in TensorRT" in caplog.text


class Built(NamedTuple):
    out: Path
    mode: str  # compile.quantize.mode
    overrides: list[str]


@pytest.fixture(scope="module", params=list(formats.FORMAT_OF_MODE))
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The decoder built with each weight format the kernels read (int4 in groups of 32)."""
    overrides = [*BUILD, f"compile.quantize.mode={request.param}", "compile.quantize.group_size=32"]
    out = tmp_path_factory.mktemp("decode_kernels")
    run_all(typed(compose(overrides)), out)  # type: ignore[arg-type]
    return Built(out, request.param, overrides)


def test_the_decode_method_is_one_plan_of_engines_and_our_kernels(built: Built) -> None:
    """Decode: one delegate, a plan of engines with the kernels' calls between them (each engine checked
    by the reference executor when built, fp16's), nothing left outside; prefill: one engine."""
    report = json.loads((built.out / "report.json").read_text())
    assert (report["prefill"]["num_engines"], report["prefill"]["left_over"]) == (1, [])
    assert (report["decode"]["num_engines"], report["decode"]["left_over"]) == (1, [])
    layers = SIZE["num_hidden_layers"]
    (delegate,) = report["decode"]["engines"]
    assert {k: delegate["plan"][k] for k in ("engines", "kernels", "attention_kernels", "plan_steps")} == {
        "engines": 4 * layers + 1, "kernels": 5 * layers + 1, "attention_kernels": layers, "plan_steps": 9 * layers + 2}
    compiled = torch.export.load(built.out / "compiled" / "decode.pt2")
    if built.mode == "none":  # the reference executor takes no int4 or fp8 constants (tests/tensorrt/test_quantize.py)
        assert_engines_checked(compiled, "fp16")
    assert sum(is_decode_product(n) for n in compiled.graph.nodes) == 4 * layers + 1
    assert sum(is_decode_attention(n) for n in compiled.graph.nodes) == layers


def test_the_program_carries_the_ptx_and_the_packed_weights(built: Built) -> None:
    """The PTX once (every kernel step names it), each packed weight (and int4's and fp8's scales) by its
    digest, all checked when read; each step's launch covers its rows (the plan's own check, both readers)."""
    (path,) = (built.out / "program").glob("*.pte")
    file = pte.read(path)
    keys = [e["key"] for e in pte.named_entries(file)]
    (module,) = [k for k in keys if k.startswith(plan.KERNELS_PREFIX)]
    assert bytes(file.named[module]) == ptx.kernels_ptx()
    (call,) = [c for c in pte.delegate_calls(file.program) if c.method == "decode"]
    decoded = plan.decode(call.payload)
    kernels = [s for s in decoded.steps if isinstance(s, plan.KernelStep)]
    assert {s.module.key for s in kernels} == {module} and {s.kernel for s in kernels} == {formats.kernel_name(formats.FORMAT_OF_MODE[built.mode], 1)}
    assert {s.weight.key for s in kernels} <= set(keys) and len({s.weight.key for s in kernels}) == len(kernels)
    assert [s.n for s in kernels[:4]] == [SIZE["hidden_size"] * 2, SIZE["hidden_size"], SIZE["intermediate_size"] * 2,
                                          SIZE["hidden_size"]]  # q with k and v; o; gate with up; down
    scales = [s.scales.key for s in kernels if s.scales is not None]
    assert len(scales) == (0 if built.mode == "none" else len(kernels)) and set(scales) <= set(keys)
    format = formats.FORMAT_OF_MODE[built.mode]
    rows = formats.FORMATS[format].rows
    assert all(s.grid == formats.grid(s.n, format) and s.grid * s.block // 32 * rows >= s.n for s in kernels)
    attention = [s for s in decoded.steps if isinstance(s, plan.AttentionStep)]
    head_dim = SIZE["hidden_size"] // SIZE["num_attention_heads"]
    assert len(attention) == SIZE["num_hidden_layers"] and {s.module.key for s in attention} == {module}
    assert {s.scale for s in attention} == {head_dim ** -0.5} and all(len(s.inputs) == 4 for s in attention)  # q, k, v, mask


@gpu
def test_the_tensorrt_program_decodes_as_the_model_does(built: Built) -> None:
    """On the GPU: prefill, then decode steps through engines and our kernels, teacher-forced against the
    model eager on the GPU (fp16; int4 with its weights rounded as the program stores them)."""
    from bench.quantized import rounded_model
    from pipeline.runtime import load

    if built.mode == "fp8":  # the runner test and tests/kernels check fp8's plan and kernels
        pytest.skip("fp8's prefill engine also rounds each product's input to fp8 (calibrated scales), which the "
                    "model with rounded weights does not: no reference for its teacher-forced logits here")

    (path,) = (built.out / "program").glob("*.pte")
    program = load(path)
    cfg = typed(compose(built.overrides))
    model = rounded_model(objects.model(cfg), QuantizeSpec.of(cfg.compile.quantize)).cuda()  # the program's weights
    tokens = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model.step(tokens[:, :16].cuda(), torch.tensor([0]).cuda())
        got = program.method("prefill").execute([tokens[:, :16], torch.tensor([0])])[0]
        assert (got.float().cpu() - want.float().cpu()).abs().max() <= 2e-2 * want.abs().max().item()
        for i in range(16, 24):
            want = model.step(tokens[:, i:i + 1].cuda(), torch.tensor([i]).cuda())
            got = program.method("decode").execute([tokens[:, i:i + 1], torch.tensor([i])])[0]
            error = (got.float().cpu() - want.float().cpu()).abs().max() / want.abs().max()
            assert error <= 2e-2, (i, error)


@gpu
def test_the_runner_runs_the_plan_as_pipeline_runtime_does(built: Built) -> None:
    """The native delegate runs the same plan (engines, then our kernels, in turn) with and without the
    plan as one CUDA graph: the greedy tokens pipeline.runtime gives, a step copying its token and
    position in and its logits out (the cache and the values between steps stay on the device)."""
    from pipeline.runtime import load
    from pipeline.runtime.generate import generate
    from pipeline.runtime.native_library import run_runner

    (path,) = (built.out / "program").glob("*.pte")
    prompt = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(3))
    new = generate(load(path), prompt, 12)[0, prompt.shape[1]:].tolist()
    for graph in ([], ["--method-graph"]):
        done = run_runner("generate", path, "--prompt", " ".join(map(str, prompt[0].tolist())), "--max-new-tokens", 12, *graph)
        assert done.returncode == 0, done.stderr
        assert [int(t) for t in done.stdout.splitlines()[0].split()] == new
        assert f"per step the delegate copied 16 bytes in and {256 * 2} out" in done.stdout


def test_the_native_delegate_reads_the_plan_and_says_what_it_needs(built: Built) -> None:
    """ExecuTorch's runtime with the native delegate reads the program's plan (all its steps) and, on a
    machine without a GPU, refuses in one line."""
    from pipeline.errors import RuntimeUnavailableError
    from pipeline.runtime import executorch_runtime
    from pipeline.runtime.native_library import load_backend
    from tests.helpers import GPU

    if GPU:
        pytest.skip("the GPU runs it (the tests above)")
    load_backend()
    (path,) = (built.out / "program").glob("*.pte")
    program = executorch_runtime.load(path)
    steps = 9 * SIZE["num_hidden_layers"] + 2
    with pytest.raises(RuntimeUnavailableError, match=rf"^method 'decode', TensorRT plan of {steps} steps: this machine has no "
                                                      r"CUDA driver \(libcuda.so.1 does not load\); TensorRT programs run on an "
                                                      r"NVIDIA GPU$"):
        program.method("decode").execute([torch.tensor([[1]]), torch.tensor([0])])


def test_kernels_asked_for_where_no_product_fits_is_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """llama_tiny as configured (float32, prefill and decode one token range): no product is the kernels',
    and the build says so instead of quietly building the engines alone."""
    from pipeline.steps.compile import run_compile

    with caplog.at_level("WARNING", logger="pipeline"):
        run_compile(typed(compose(["model=llama_tiny", "cache=off", "compile.decode_kernels=true"])), tmp_path / "compiled")  # type: ignore[arg-type]
    assert "compile.decode_kernels is on, but no method has a product the project's kernels take" in caplog.text
