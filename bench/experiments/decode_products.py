"""Decode-step products (GPU): how fast TensorRT-RTX engines read a decoder's weights at one token,
by how the product is written and built, against cuBLAS (torch) on the same weights.

Each engine holds `--layers` layers of TinyLlama-sized products (q, k, v, o: hidden 2048, 4 of 32
heads for k and v; gate, up, down: 5632), chained as in a decoder, in fp16. Per variant: weight
GB/s at one token (weights read / time of one call, as a CUDA graph), TFLOP/s at `--prefill`
tokens where the engine takes them, device memory the engine holds against its weights, and the
build seconds. The decode step of `bench/llm.py` is bound by these products; this says which form
reads weights fastest.

    python -m bench.experiments.decode_products --layers 4 --out build/decode_products
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.engine.trt_api import trt

HIDDEN, KV, FFN = 2048, 256, 5632
SHAPES = {"q": (HIDDEN, HIDDEN), "k": (KV, HIDDEN), "v": (KV, HIDDEN), "o": (HIDDEN, HIDDEN),
          "gate": (FFN, HIDDEN), "up": (FFN, HIDDEN), "down": (HIDDEN, FFN)}  # [out, in], as nn.Linear


def weights(layers: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [{k: (rng.standard_normal(s, dtype=np.float32) * 0.02).astype(np.float16) for k, s in SHAPES.items()}
            for _ in range(layers)]


class Net:
    """Builds the chain into a TensorRT network in one product form."""

    def __init__(self, network: Any, form: str) -> None:
        self.network, self.form = network, form
        self.keep: list[np.ndarray] = []  # TensorRT reads weights at build time: keep them alive

    def const(self, array: np.ndarray) -> Any:
        self.keep.append(np.ascontiguousarray(array))
        return self.network.add_constant(array.shape, trt().Weights(self.keep[-1])).get_output(0)

    def linear(self, x: Any, w: np.ndarray) -> Any:
        t, net = trt(), self.network
        mop = t.MatrixOperation
        if self.form == "pretransposed":  # W^T stored [in, out]
            return net.add_matrix_multiply(x, mop.NONE, self.const(w.T[None]), mop.NONE).get_output(0)
        if self.form == "reduce":  # sum over the input dim of x * W: an elementwise kernel over the weights
            xs = net.add_shuffle(x)
            xs.reshape_dims = (1, 0, 1, w.shape[1])  # [1, T, 1, in]
            prod = net.add_elementwise(xs.get_output(0), self.const(w[None, None]), t.ElementWiseOperation.PROD)
            red = net.add_reduce(prod.get_output(0), t.ReduceOperation.SUM, 1 << 3, False)
            return red.get_output(0)
        return net.add_matrix_multiply(x, mop.NONE, self.const(w[None]), mop.TRANSPOSE).get_output(0)

    def group(self, x: Any, ws: list[np.ndarray]) -> list[Any]:
        """Products of one input: one each, or (form "stacked") one over the weights stacked, sliced apart."""
        if self.form != "stacked":
            return [self.linear(x, w) for w in ws]
        whole = self.linear(x, np.concatenate(ws))
        out, begin = [], 0
        for w in ws:
            size = self.network.add_shape(whole).get_output(0)  # [1, T, N]: T from the input
            piece = self.network.add_slice(whole, (0, 0, begin), (1, 1, w.shape[0]), (1, 1, 1))
            shape = self.network.add_concatenation([
                self.network.add_slice(size, (0,), (2,), (1,)).get_output(0),
                self.network.add_constant((1,), trt().Weights(np.array([w.shape[0]], dtype=np.int64))).get_output(0)])
            piece.set_input(2, shape.get_output(0))
            out.append(piece.get_output(0))
            begin += w.shape[0]
        return out

    def chain(self, x: Any, layers: list[dict[str, np.ndarray]]) -> tuple[Any, Any]:
        t, net = trt(), self.network
        add, mul = t.ElementWiseOperation.SUM, t.ElementWiseOperation.PROD
        acc = None
        for w in layers:  # attention's products on x, the MLP's on x + o: two groups, as in a decoder layer
            q, k, v = self.group(x, [w["q"], w["k"], w["v"]])
            kv = net.add_elementwise(k, v, add).get_output(0)
            acc = kv if acc is None else net.add_elementwise(acc, kv, add).get_output(0)
            h = net.add_elementwise(x, self.linear(q, w["o"]), add).get_output(0)
            g, u = self.group(h, [w["gate"], w["up"]])
            d = self.linear(net.add_elementwise(g, u, mul).get_output(0), w["down"])
            x = net.add_elementwise(h, d, add).get_output(0)
        return x, acc


def build(layers: list[dict[str, np.ndarray]], form: str, tokens: tuple[int, int] | None, extra: tuple[int, ...],
          opt_level: int = 3, tiling: str | None = None, opt: int = 128) -> tuple[bytes, float]:
    """A serialized engine: x [1, T, hidden] with T static at `tokens[0]` (tokens None: dynamic 1..tokens[1]),
    optimization profiles for T in (1..max, tuned for `opt`) and each `extra` T fixed."""
    t = trt()
    logger = t.Logger(t.Logger.WARNING)
    builder = t.Builder(logger)
    network = builder.create_network(0)
    dynamic = tokens is None
    x = network.add_input("x", t.DataType.HALF, (1, -1 if dynamic else tokens[0], HIDDEN))
    out, acc = Net(network, form).chain(x, layers)
    out.name, acc.name = "out", "acc"
    network.mark_output(out)
    network.mark_output(acc)
    config = builder.create_builder_config()
    config.builder_optimization_level = opt_level
    if tiling:
        config.tiling_optimization_level = getattr(t.TilingOptimizationLevel, tiling)
    if dynamic:
        for lo, mid, hi in [(1, opt, 1024)] + [(n, n, n) for n in extra]:
            profile = builder.create_optimization_profile()
            profile.set_shape("x", (1, lo, HIDDEN), (1, mid, HIDDEN), (1, hi, HIDDEN))
            config.add_optimization_profile(profile)
    return timed_build(builder, network, config, form)


def timed_build(builder: Any, network: Any, config: Any, what: str) -> tuple[bytes, float]:
    """The serialized engine and the seconds its build took."""
    start = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError(f"build failed ({what})")
    return bytes(plan), time.perf_counter() - start


def time_engine(plan: bytes, tokens: int, profile: int, reps: int = 50) -> dict[str, float]:
    """Milliseconds of one call at `tokens` tokens (CUDA-graph replays), and device GB the engine holds."""
    t = trt()
    torch.cuda.synchronize()
    free = torch.cuda.mem_get_info()[0]
    runtime = t.Runtime(t.Logger(t.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(plan)
    config = engine.create_runtime_config()
    config.dynamic_shapes_kernel_specialization_strategy = t.DynamicShapesKernelSpecializationStrategy.EAGER
    context = engine.create_execution_context(config)
    stream = torch.cuda.Stream()
    if engine.num_optimization_profiles > 1:
        context.set_optimization_profile_async(profile, stream.cuda_stream)
    x = torch.randn(1, tokens, HIDDEN, dtype=torch.float16, device="cuda") * 0.1
    context.set_input_shape("x", tuple(x.shape))
    out, acc = torch.empty_like(x), torch.empty(1, tokens, KV, dtype=torch.float16, device="cuda")
    for name, tensor in (("x", x), ("out", out), ("acc", acc)):
        context.set_tensor_address(name, tensor.data_ptr())
    with torch.cuda.stream(stream):
        for _ in range(3):
            context.execute_async_v3(stream.cuda_stream)
    stream.synchronize()
    held = (free - torch.cuda.mem_get_info()[0]) / 1e9
    ms = graph_ms(lambda: context.execute_async_v3(stream.cuda_stream), stream, reps)
    return {"ms": ms, "device_GB": held}


def graph_ms(call: Callable[[], Any], stream: torch.cuda.Stream, reps: int) -> float:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            call()
    for _ in range(3):
        graph.replay()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / reps


def cublas_ms(layers: list[dict[str, np.ndarray]], tokens: int) -> float:
    ws = [{k: torch.from_numpy(v).cuda() for k, v in w.items()} for w in layers]
    x0 = torch.randn(1, tokens, HIDDEN, dtype=torch.float16, device="cuda") * 0.1
    lin = torch.nn.functional.linear

    def run() -> None:
        x, acc = x0, None
        for w in ws:
            kv = lin(x, w["k"]) + lin(x, w["v"])
            acc = kv if acc is None else acc + kv
            x = x + lin(lin(x, w["q"]), w["o"]) + lin(lin(x, w["gate"]) * lin(x, w["up"]), w["down"])

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run()
    stream.synchronize()
    return graph_ms(run, stream, 50)


VARIANTS: dict[str, dict[str, Any]] = {
    "x @ W^T, T dynamic + one-token profile (ours)": {"form": "transposed", "tokens": None, "extra": (1,)},
    "x @ W^T, T dynamic, no one-token profile": {"form": "transposed", "tokens": None, "extra": ()},
    "x @ W^T, T dynamic tuned for 1 token, no one-token profile": {"form": "transposed", "tokens": None, "extra": (),
                                                                   "opt": 1},
    "x @ W^T, T = 1 static": {"form": "transposed", "tokens": (1, 1), "extra": ()},
    "x @ W^T, T = 1 static, opt level 5": {"form": "transposed", "tokens": (1, 1), "extra": (), "opt_level": 5},
    "x @ W^T, T = 1 static, tiling FULL": {"form": "transposed", "tokens": (1, 1), "extra": (), "tiling": "FULL"},
    "x @ (W^T stored), T = 1 static": {"form": "pretransposed", "tokens": (1, 1), "extra": ()},
    "x @ (W^T stored), T dynamic + one-token profile": {"form": "pretransposed", "tokens": None, "extra": (1,)},
    "stacked q|k|v and gate|up, T dynamic + one-token profile": {"form": "stacked", "tokens": None, "extra": (1,)},
    "stacked q|k|v and gate|up, T = 1 static": {"form": "stacked", "tokens": (1, 1), "extra": ()},
    "sum(x * W), T = 1 static": {"form": "reduce", "tokens": (1, 1), "extra": ()},
    "x @ W^T, T = 512 static": {"form": "transposed", "tokens": (512, 512), "extra": ()},
    "x @ W^T, T = 512 static, opt level 5": {"form": "transposed", "tokens": (512, 512), "extra": (), "opt_level": 5},
    "x @ W^T, T = 512 static, tiling FULL": {"form": "transposed", "tokens": (512, 512), "extra": (), "tiling": "FULL"},
    "stacked q|k|v and gate|up, T = 512 static": {"form": "stacked", "tokens": (512, 512), "extra": ()},
    "x @ W^T, T dynamic tuned for 512, no one-token profile": {"form": "transposed", "tokens": None, "extra": (),
                                                               "opt": 512},
    "x @ W^T, T dynamic tuned for 512 + one-token profile": {"form": "transposed", "tokens": None, "extra": (1,),
                                                             "opt": 512},
    "x @ W^T, T dynamic + one-token + 512-token profiles": {"form": "transposed", "tokens": None, "extra": (1, 512),
                                                            "prefill_profile": 2},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--only", nargs="*", default=None, help="variant names (default: all)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    layers = weights(args.layers)
    weight_bytes = sum(w.nbytes for layer in layers for w in layer.values())
    flops = 2 * weight_bytes / 2 * args.prefill
    results: dict[str, Any] = {"weights_GB": weight_bytes / 1e9, "gpu": torch.cuda.get_device_name(), "rows": []}
    ms = cublas_ms(layers, 1)
    prefill = cublas_ms(layers, args.prefill)
    results["rows"].append({"variant": "cuBLAS (torch F.linear), CUDA graph", "decode_ms": ms,
                            "weight_GBs": weight_bytes / ms / 1e6, "prefill_ms": prefill,
                            "prefill_TFLOPs": flops / prefill / 1e9})
    print(json.dumps(results["rows"][-1]), flush=True)
    for name, v in VARIANTS.items():
        if args.only and name not in args.only:
            continue

        def measure(row: dict[str, Any], v: dict[str, Any] = v) -> None:
            plan, row["build_s"] = build(layers, v["form"], v["tokens"], v["extra"], v.get("opt_level", 3), v.get("tiling"),
                                          v.get("opt", 128))
            row["plan_over_weights"] = round(len(plan) / weight_bytes, 3)
            if v["tokens"] is None or v["tokens"][0] == 1:
                one = time_engine(plan, 1, profile=1 if v["extra"] else 0)
                row.update(decode_ms=one["ms"], weight_GBs=weight_bytes / one["ms"] / 1e6, device_GB=one["device_GB"])
            if v["tokens"] is None or v["tokens"][0] == args.prefill:
                many = time_engine(plan, args.prefill, profile=v.get("prefill_profile", 0))
                row.update(prefill_ms=many["ms"], prefill_TFLOPs=flops / many["ms"] / 1e9)

        add_row(results, {"variant": name}, measure)
    save(results, args.out, "decode_products.json")


def add_row(results: dict[str, Any], row: dict[str, Any], measure: Callable[[dict[str, Any]], None]) -> None:
    """`measure` fills `row`; a failure is noted in it instead (one form failing must not cost the
    others' numbers). The row is kept in `results["rows"]` and printed."""
    try:
        measure(row)
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
    results["rows"].append(row)
    print(json.dumps(row), flush=True)


def save(results: dict[str, Any], out: Path | None, name: str) -> None:
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(json.dumps(results, indent=1))

if __name__ == "__main__":
    main()
