"""Attention forms (GPU): a decoder's grouped-query attention against its static KV cache, in each
form a TensorRT-RTX engine can take it, timed at a long prompt and at one token, and checked
against torch's `scaled_dot_product_attention`.

Each engine chains `--layers` attentions of TinyLlama's shape (32 query heads, 4 key/value heads,
head dim 64, a 1024-entry cache per layer), fp16, the query length dynamic with a one-token
profile (as `+experiment=llm_fp16` builds). Forms:

- `repeat`: K and V repeated to 32 heads, then q k^T, scale, mask, softmax, @ v (what the
  converters build from `transformers`' graph with `compile.share_kv_heads=false`);
- `stacked`: each K/V head's 8 query heads stacked into one product (`compile.share_kv_heads`);
- `IAttention, mask`: TensorRT's attention layer on the 4 K/V heads with the boolean mask;
- `IAttention, causal + lengths`: no mask; the valid cache length and a lower-right causal mask;
- `IAttention, stacked`: the attention layer on 4 heads, each K/V head's 8 query heads stacked
  along the tokens and the mask's rows repeated to match (what the `tensorrt::attention` converter
  builds).
(A conditional on the query length, `stacked` for one token and IAttention for more, does not
build: TensorRT-RTX 1.6 refuses an attention layer inside an `if`, "unknown input tensor".)

    python -m bench.experiments.attention_forms --layers 22 --out build/attention_forms
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.experiments.decode_products import add_row, graph_ms, save, timed_build
from pipeline.engine.trt_api import trt

HEADS, KV_HEADS, HEAD_DIM, CACHE = 32, 4, 64, 1024
GROUP = HEADS // KV_HEADS
SCALE = HEAD_DIM ** -0.5


class Net:
    def __init__(self, network: Any) -> None:
        self.network = network

    def shuffle(self, x: Any, dims: tuple[int, ...]) -> Any:
        layer = self.network.add_shuffle(x)
        layer.reshape_dims = dims
        return layer.get_output(0)

    def scaled(self, x: Any) -> Any:
        t = trt()
        scale = self.network.add_constant((1, 1, 1, 1), t.Weights(np.array([SCALE], dtype=np.float16))).get_output(0)
        return self.network.add_elementwise(x, scale, t.ElementWiseOperation.PROD).get_output(0)

    def softmax_of(self, scores: Any, mask: Any) -> Any:
        t, net = trt(), self.network
        neg = net.add_constant((1, 1, 1, 1), t.Weights(np.array([-np.inf], dtype=np.float16))).get_output(0)
        layer = net.add_softmax(net.add_select(mask, scores, neg).get_output(0))
        layer.axes = 1 << 3
        return layer.get_output(0)

    def attention(self, form: str, q: Any, k: Any, v: Any, mask: Any, kv_len: Any) -> Any:
        t, net = trt(), self.network
        mop = t.MatrixOperation
        if form == "repeat":
            def rep(x: Any) -> Any:
                x5 = self.shuffle(x, (1, KV_HEADS, 1, CACHE, HEAD_DIM))
                wide = net.add_slice(x5, (0, 0, 0, 0, 0), (1, KV_HEADS, GROUP, CACHE, HEAD_DIM), (1, 1, 0, 1, 1))
                return self.shuffle(wide.get_output(0), (1, HEADS, CACHE, HEAD_DIM))
            scores = net.add_matrix_multiply(self.scaled(q), mop.NONE, rep(k), mop.TRANSPOSE).get_output(0)
            probs = self.softmax_of(scores, mask)
            return net.add_matrix_multiply(probs, mop.NONE, rep(v), mop.NONE).get_output(0)
        if form == "stacked":
            grouped = self.shuffle(self.scaled(q), (1, KV_HEADS, -1, HEAD_DIM))
            scores = net.add_matrix_multiply(grouped, mop.NONE, k, mop.TRANSPOSE).get_output(0)
            probs = self.softmax_of(self.shuffle(scores, (1, HEADS, -1, CACHE)), mask)
            out = net.add_matrix_multiply(self.shuffle(probs, (1, KV_HEADS, -1, CACHE)), mop.NONE, v, mop.NONE)
            return self.shuffle(out.get_output(0), (1, HEADS, -1, HEAD_DIM))
        if form == "iattention_stacked":  # as the converter builds it: a K/V head's query heads stacked
            rows = net.add_slice(self.shuffle(mask, (1, 1, 1, -1, CACHE)), (0, 0, 0, 0, 0), (1, 1, GROUP, 1, CACHE),
                                 (1, 1, 0, 1, 1))
            shape = net.add_concatenation([
                net.add_constant((3,), t.Weights(np.array([1, 1, GROUP], dtype=np.int64))).get_output(0),
                net.add_slice(net.add_shape(mask).get_output(0), (2,), (2,), (1,)).get_output(0)]).get_output(0)
            rows.set_input(2, shape)
            layer = net.add_attention_v2(self.shuffle(self.scaled(q), (1, KV_HEADS, -1, HEAD_DIM)), k, v,
                                         t.AttentionNormalizationOp.SOFTMAX, t.CausalMaskKind.NONE)
            layer.mask = self.shuffle(rows.get_output(0), (1, 1, -1, CACHE))
            layer.decomposable = True
            return self.shuffle(layer.get_output(0), (1, HEADS, -1, HEAD_DIM))
        causal = form == "iattention_causal"
        layer = net.add_attention_v2(self.scaled(q), k, v, t.AttentionNormalizationOp.SOFTMAX,
                                     t.CausalMaskKind.LOWER_RIGHT if causal else t.CausalMaskKind.NONE)
        if causal:
            layer.key_value_lengths = kv_len
        else:
            layer.mask = mask
        layer.decomposable = True
        return layer.get_output(0)


def build(form: str, layers: int, opt: int) -> tuple[bytes, float]:
    t = trt()
    builder = t.Builder(t.Logger(t.Logger.WARNING))
    network = builder.create_network(0)
    q = network.add_input("q", t.DataType.HALF, (1, HEADS, -1, HEAD_DIM))
    mask = network.add_input("mask", t.DataType.BOOL, (1, 1, -1, CACHE))
    kv_len = network.add_input("kv_len", t.DataType.INT32, (1,)) if form == "iattention_causal" else None
    net, x = Net(network), q
    for i in range(layers):
        k = network.add_input(f"k{i}", t.DataType.HALF, (1, KV_HEADS, CACHE, HEAD_DIM))
        v = network.add_input(f"v{i}", t.DataType.HALF, (1, KV_HEADS, CACHE, HEAD_DIM))
        x = net.attention(form, x, k, v, mask, kv_len)
    x.name = "out"
    network.mark_output(x)
    config = builder.create_builder_config()
    for lo, mid, hi in ((1, opt, CACHE), (1, 1, 1)):
        profile = builder.create_optimization_profile()
        profile.set_shape("q", (1, HEADS, lo, HEAD_DIM), (1, HEADS, mid, HEAD_DIM), (1, HEADS, hi, HEAD_DIM))
        profile.set_shape("mask", (1, 1, lo, CACHE), (1, 1, mid, CACHE), (1, 1, hi, CACHE))
        config.add_optimization_profile(profile)
    return timed_build(builder, network, config, form)


def inputs(layers: int, tokens: int, position: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    data = {"q": torch.randn(1, HEADS, tokens, HEAD_DIM, generator=gen)}
    for i in range(layers):
        data[f"k{i}"] = torch.randn(1, KV_HEADS, CACHE, HEAD_DIM, generator=gen)
        data[f"v{i}"] = torch.randn(1, KV_HEADS, CACHE, HEAD_DIM, generator=gen)
    data = {k: t.half().cuda() for k, t in data.items()}
    rows = torch.arange(position, position + tokens)[:, None]
    data["mask"] = (torch.arange(CACHE)[None, :] <= rows)[None, None].cuda()
    data["kv_len"] = torch.tensor([position + tokens], dtype=torch.int32).cuda()
    return data


def reference(data: dict[str, torch.Tensor], layers: int) -> torch.Tensor:
    x = data["q"]
    for i in range(layers):
        k, v = (data[f"{n}{i}"].repeat_interleave(GROUP, 1) for n in "kv")
        x = torch.nn.functional.scaled_dot_product_attention(x.float(), k.float(), v.float(), attn_mask=data["mask"]).half()
    return x


def run_engine(plan: bytes, data: dict[str, torch.Tensor], profile: int, reps: int) -> tuple[float, torch.Tensor]:
    t = trt()
    engine = t.Runtime(t.Logger(t.Logger.WARNING)).deserialize_cuda_engine(plan)
    config = engine.create_runtime_config()
    config.dynamic_shapes_kernel_specialization_strategy = t.DynamicShapesKernelSpecializationStrategy.EAGER
    context = engine.create_execution_context(config)
    stream = torch.cuda.Stream()
    context.set_optimization_profile_async(profile, stream.cuda_stream)
    names = {engine.get_tensor_name(i) for i in range(engine.num_io_tensors)}
    for name in names - {"out"}:
        context.set_input_shape(name, tuple(data[name].shape))
        context.set_tensor_address(name, data[name].data_ptr())
    out = torch.empty_like(data["q"])
    context.set_tensor_address("out", out.data_ptr())
    with torch.cuda.stream(stream):
        for _ in range(3):
            context.execute_async_v3(stream.cuda_stream)
    stream.synchronize()
    return graph_ms(lambda: context.execute_async_v3(stream.cuda_stream), stream, reps), out


FORMS = ("repeat", "stacked", "iattention_mask", "iattention_stacked", "iattention_causal")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--position", type=int, default=600, help="cache entries already written at the decode step")
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    cases = {"prefill": inputs(args.layers, args.prefill, 0), "decode": inputs(args.layers, 1, args.position)}
    refs = {name: reference(data, args.layers) for name, data in cases.items()}
    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "layers": args.layers, "rows": []}
    for form in FORMS:
        if args.only and form not in args.only:
            continue

        def measure(row: dict[str, Any], form: str = form) -> None:
            plan, row["build_s"] = build(form, args.layers, 128)
            for (name, data), profile in zip(cases.items(), (0, 1)):
                ms, out = run_engine(plan, data, profile, 50)
                row[f"{name}_ms"], row[f"{name}_max_err"] = ms, (out.float() - refs[name].float()).abs().max().item()

        add_row(results, {"form": form}, measure)
    save(results, args.out, "attention_forms.json")

if __name__ == "__main__":
    main()
