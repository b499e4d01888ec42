// The decode step's products as kernels of this project: y[T, N] = x[T, K] @ W[N, K]^T (+ bias) for
// T = 1 to 8 tokens, W stored as fp16, int4 (groups along K) or fp8, read once at the memory's speed.
//
// One warp computes `rows` output rows (Format<F>::rows): its lanes stride over them in 16-byte chunks
// (8 fp16, 32 int4 or 16 fp8 values), read and convert each chunk's x once for those rows, and keep
// rows x T partial sums in float, which the warp then adds. Every format computes one row a warp: four
// rows a warp for int4 and fp8 (x's work shared between them) read their weights at 0.55-0.65x the
// speed of one row at one and two tokens on an H100 (fewer warps in flight; results/gpu-log.md,
// 2026-12-08), the same at four and eight. Weight layouts (pipeline/kernels/formats.py writes them):
//   fp16  W: [N, K] fp16.
//   int4  W: [N, K/2] bytes, k = 2j in byte j's low nibble and 2j+1 in its high one, each nibble
//         q + 8 for q in [-8, 7]; scales: [N, K/group] fp16 (group a multiple of 32).
//   fp8   W: [N, K] e4m3 bytes; scales: [N] float32 (one per row).
// x, bias and y are fp16; accumulation is float.
//
// Compiled after prelude.cuh (pipeline/kernels/ptx.py's SOURCES); `dp_host` runs the same lane code
// one lane at a time on the CPU (the tests' check of the layouts and the arithmetic).
enum { kFp16 = 0, kInt4 = 1, kFp8 = 2 };
enum { kWarp = 32, kWarpsPerBlock = 4 };

// Per format: values in a 16-byte chunk, bytes per value (num / den), rows a warp computes.
template <int F> struct Format;
template <> struct Format<kFp16> { enum { values = 8, row_bytes_num = 2, row_bytes_den = 1, rows = 1 }; };
template <> struct Format<kInt4> { enum { values = 32, row_bytes_num = 1, row_bytes_den = 2, rows = 1 }; };
template <> struct Format<kFp8> { enum { values = 16, row_bytes_num = 1, row_bytes_den = 1, rows = 1 }; };

struct Args {
  const u16* x;
  const unsigned char* w;
  const void* scales;
  const u16* bias;  // nullptr: none
  u16* y;
  int n, k, group;
};

// x[t, k0 .. k0 + 8) as float.
DP_INLINE void x8(const Args& a, int t, int k0, float out[8]) {
  Chunk c = load16(a.x + static_cast<long>(t) * a.k + k0);
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = h2f(static_cast<u16>(c.w[i] & 0xffffu));
    out[2 * i + 1] = h2f(static_cast<u16>(c.w[i] >> 16));
  }
}

// Part `part` (8 values) of one chunk's weights as float (before any scale).
template <int F>
DP_INLINE void weights8(const Chunk& c, int part, float v[8]) {
  if (F == kFp16) {
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = h2f(static_cast<u16>(c.w[i] & 0xffffu));
      v[2 * i + 1] = h2f(static_cast<u16>(c.w[i] >> 16));
    }
  } else if (F == kInt4) {
    // 2^23 + q as a float's bits (exact), less 2^23 + 8: q - 8 without an integer-to-float conversion.
    const u32 word = c.w[part];
    for (int j = 0; j < 8; ++j) v[j] = bits_float(0x4B000000u | ((word >> (4 * j)) & 0xfu)) - 8388616.0f;
  } else {
    // e4m3 byte -> the fp16 with the same sign, exponent and mantissa bits: the value times 2^-8
    // (normal and subnormal alike); the 2^8 goes into the row's scale.
    for (int i = 0; i < 2; ++i) {
      const u32 word = c.w[2 * part + i];
      for (int j = 0; j < 4; ++j) {
        u32 b = (word >> (8 * j)) & 0xffu;
        v[4 * i + j] = h2f(static_cast<u16>(((b & 0x80u) << 8) | ((b & 0x7fu) << 7)));
      }
    }
  }
}

// A lane's partial sums of rows row0 .. row0 + rows - 1 (those below n) for every token: chunks lane,
// lane + 32, ...; each chunk's x read and converted once for all of them.
template <int T, int F>
DP_INLINE void lane_sums(const Args& a, int row0, int lane, float acc[Format<F>::rows][T]) {
  const int R = Format<F>::rows, values = Format<F>::values;
  const long row_bytes = static_cast<long>(a.k) * Format<F>::row_bytes_num / Format<F>::row_bytes_den;
  const int chunks = a.k / values, live = a.n - row0 < R ? a.n - row0 : R;
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;
#ifdef __CUDACC_RTC__
#pragma unroll(4 / Format<F>::rows)
#endif
  for (int c = lane; c < chunks; c += kWarp) {
    Chunk w[R];
    float scale[R], sums[R][T];
    for (int r = 0; r < R; ++r) {
      if (r < live) w[r] = load16(a.w + (row0 + r) * row_bytes + c * 16);
      scale[r] = F == kInt4 && r < live
                     ? h2f(static_cast<const u16*>(a.scales)[static_cast<long>(row0 + r) * (a.k / a.group) + c * values / a.group])
                     : 1.0f;
      for (int t = 0; t < T; ++t) sums[r][t] = 0.0f;
    }
    DP_UNROLL for (int part = 0; part < values / 8; ++part) {
      float xs[T][8];
      DP_UNROLL for (int t = 0; t < T; ++t) x8(a, t, c * values + part * 8, xs[t]);
      DP_UNROLL for (int r = 0; r < R; ++r) {
        if (r < live) {
          float v[8];
          weights8<F>(w[r], part, v);
          DP_UNROLL for (int t = 0; t < T; ++t)
            DP_UNROLL for (int i = 0; i < 8; ++i) sums[r][t] += v[i] * xs[t][i];
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] += scale[r] * sums[r][t];
  }
}

template <int T, int F>
DP_INLINE void finish(const Args& a, int row, const float acc[T]) {
  float scale = F == kFp8 ? static_cast<const float*>(a.scales)[row] * 256.0f : 1.0f;
  for (int t = 0; t < T; ++t) {
    float v = acc[t] * scale;
    if (a.bias) v += h2f(a.bias[row]);
    a.y[static_cast<long>(t) * a.n + row] = f2h(v);
  }
}

#ifdef __CUDACC_RTC__
template <int T, int F>
__device__ void product(const Args& a) {
  const int R = Format<F>::rows;
  const int lane = threadIdx.x % kWarp;
  const int row0 = (blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarp) * R;
  if (row0 >= a.n) return;
  float acc[R][T];
  lane_sums<T, F>(a, row0, lane, acc);
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      for (int offset = kWarp / 2; offset > 0; offset /= 2) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], offset);
  if (lane == 0)
    for (int r = 0; r < R && row0 + r < a.n; ++r) finish<T, F>(a, row0 + r, acc[r]);
}

#define DP_KERNEL(NAME, T, F)                                                                        \
  extern "C" __global__ void __launch_bounds__(kWarp * kWarpsPerBlock)                              \
  NAME(const u16* x, const unsigned char* w, const void* scales, const u16* bias, u16* y, int n,     \
       int k, int group) {                                                                          \
    Args a = {x, w, scales, bias, y, n, k, group};                                                  \
    product<T, F>(a);                                                                               \
  }
#define DP_TOKENS(PREFIX, F)                                                                         \
  DP_KERNEL(PREFIX##_t1, 1, F) DP_KERNEL(PREFIX##_t2, 2, F) DP_KERNEL(PREFIX##_t3, 3, F)            \
  DP_KERNEL(PREFIX##_t4, 4, F) DP_KERNEL(PREFIX##_t5, 5, F) DP_KERNEL(PREFIX##_t6, 6, F)            \
  DP_KERNEL(PREFIX##_t7, 7, F) DP_KERNEL(PREFIX##_t8, 8, F)
DP_TOKENS(dp_fp16, kFp16)
DP_TOKENS(dp_int4, kInt4)
DP_TOKENS(dp_fp8, kFp8)
#else
template <int T, int F>
void host_product(const Args& a) {
  const int R = Format<F>::rows;
  for (int row0 = 0; row0 < a.n; row0 += R) {
    float total[R][T] = {};
    for (int lane = 0; lane < kWarp; ++lane) {
      float acc[R][T];
      lane_sums<T, F>(a, row0, lane, acc);
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) total[r][t] += acc[r][t];
    }
    for (int r = 0; r < R && row0 + r < a.n; ++r) finish<T, F>(a, row0 + r, total[r]);
  }
}

template <int F>
int host_tokens(const Args& a, int tokens) {
  switch (tokens) {
    case 1: host_product<1, F>(a); return 0;
    case 2: host_product<2, F>(a); return 0;
    case 3: host_product<3, F>(a); return 0;
    case 4: host_product<4, F>(a); return 0;
    case 5: host_product<5, F>(a); return 0;
    case 6: host_product<6, F>(a); return 0;
    case 7: host_product<7, F>(a); return 0;
    case 8: host_product<8, F>(a); return 0;
  }
  return -1;
}

// The kernels' arithmetic on the CPU, lane by lane (the tests' check): 0, or -1 for an unknown format
// or token count.
// Rows one warp computes in a format (the launch's grid follows it: pipeline/kernels/formats.py).
extern "C" int dp_rows(int format) {
  return format == kFp16 ? Format<kFp16>::rows : format == kInt4 ? Format<kInt4>::rows : format == kFp8 ? Format<kFp8>::rows : -1;
}

extern "C" int dp_host(int format, int tokens, const u16* x, const unsigned char* w, const void* scales,
                       const u16* bias, u16* y, int n, int k, int group) {
  Args a = {x, w, scales, bias, y, n, k, group};
  if (format == kFp16) return host_tokens<kFp16>(a, tokens);
  if (format == kInt4) return host_tokens<kInt4>(a, tokens);
  if (format == kFp8) return host_tokens<kFp8>(a, tokens);
  return -1;
}
#endif
