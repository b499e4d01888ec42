// Greedy choice over logits where a method wrote them (float32, float16, bfloat16): the first of the
// highest, a NaN never chosen; and token arrays for a method's inputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "program.h"

namespace pipeline_runner {

// A 16-bit float's bits (float16 or bfloat16: sign, then magnitude) as an integer ordered as the
// values are, -0 as +0; a NaN (magnitude above `inf`) lowest, so it never wins. Branch-free 16-bit
// arithmetic, so the loops over it run as vector instructions.
inline int16_t half_key(uint16_t bits, int16_t inf) {
  const auto h = static_cast<int16_t>(bits);
  const auto magnitude = static_cast<int16_t>(h & 0x7fff), sign = static_cast<int16_t>(h >> 15);
  return magnitude > inf ? INT16_MIN : static_cast<int16_t>((magnitude ^ sign) - sign);
}
inline float float_key(float x) { return x != x ? -INFINITY : x; }  // a NaN never wins

template <typename T, typename Key>
auto block_max(const T* p, int64_t n, Key key) {
  auto top = key(p[0]);
#pragma omp simd reduction(max : top)
  for (int64_t v = 0; v < n; ++v) top = std::max(top, key(p[v]));
  return top;
}

// The first index of the largest of `n` values as `key` orders them: the maximum block by block
// (vector instructions), then the first match from the block that holds it. 5 us for 32000 float16
// logits where a plain loop took 21 (2-core development machine).
template <typename T, typename Key>
int64_t first_max(const T* p, int64_t n, Key key) {
  constexpr int64_t kBlock = 512;
  auto top = key(p[0]);
  int64_t from = 0;
  for (int64_t b = 0; b < n; b += kBlock)
    if (auto m = block_max(p + b, std::min(kBlock, n - b), key); m > top) top = m, from = b;
  for (int64_t v = from; v < n; ++v)
    if (key(p[v]) == top) return v;
  return 0;
}

// The first index of the highest of the `n` logits from element `offset` of `t` (float32, float16 or
// bfloat16, read where the method wrote them); a NaN never wins.
inline int64_t argmax_at(const executorch::aten::Tensor& t, int64_t offset, int64_t n) {
  const std::string dtype = pipeline_trt::dtype_of_scalar_type(static_cast<int>(t.scalar_type()));
  const auto* base = static_cast<const uint8_t*>(t.const_data_ptr());
  if (dtype == "float32") return first_max(reinterpret_cast<const float*>(base) + offset, n, float_key);
  if (dtype != "float16" && dtype != "bfloat16") refuse("the logits are " + dtype + "; the runner reads float32, float16 or bfloat16");
  const int16_t inf = dtype == "float16" ? 0x7c00 : 0x7f80;
  return first_max(reinterpret_cast<const uint16_t*>(base) + offset, n, [inf](uint16_t h) { return half_key(h, inf); });
}

// The last position's highest logit (logits [1, T, V]), the first of equal ones. This runs every
// decode step, over the whole vocabulary.
inline int64_t argmax_last(const et::EValue& out) {
  if (!out.isTensor() || out.toTensor().dim() != 3) refuse("the prefill/decode output is not logits [1, T, vocab]");
  const auto& t = out.toTensor();
  const int64_t vocab = t.size(2), row = t.size(1) - 1;
  if (vocab < 1 || row < 0) refuse("the prefill/decode output holds no logits");
  return argmax_at(t, row * vocab, vocab);
}

inline Array ints(const std::vector<int64_t>& values, std::vector<int64_t> shape) {
  Array a;
  a.dtype = "int64";
  a.shape = std::move(shape);
  a.data.resize(values.size() * 8);
  std::memcpy(a.data.data(), values.data(), a.data.size());
  return a;
}

}  // namespace pipeline_runner
