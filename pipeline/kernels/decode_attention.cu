// The decode step's attention as kernels of this project: o = softmax(q k^T * scale + mask) v for 1 to 8
// query tokens over a KV cache of S positions. Each K/V head serves its G = H / KVH query heads
// (grouped-query attention: the cache is read once and its heads never repeated), and the positions are
// split in chunks of kChunk, a block each, whose parts a second kernel combines:
//   q  [B, H, T, D], k and v [B, KVH, S, D] fp16, contiguous, D a multiple of 8.
//   o  [B, T, H, D] fp16: the heads merged, as the output product reads them (the compile step takes the
//      model's transpose and reshape into this layout).
//   mask  [MB, 1, T, S] fp16 added to the scores (MB is 1 or B), or none. A position whose mask is
//         -65504 or less (fp16's lowest, or -inf) is left out: a chunk of only such positions is never
//         read, so a decode step reads the cache up to its position, not all of it. A query with no
//         position left gives zeros.
//   ws    float32 [B, H, T, chunks, D + 2]: each chunk's largest score, its sum of exp(score - largest)
//         and its output before the division by that sum (what da_combine reads).
// da_split runs a block per (chunk, KV head, batch), da_combine a block per (batch, head, token). Every
// phase is a function of a thread's index (no shuffles), which da_host runs thread by thread on the CPU
// (the tests' check) as the GPU runs them between barriers. Compiled after prelude.cuh.
enum { kChunk = 64, kMaxQueries = 32, kMaxQueryValues = 4096, kAttnThreads = 128 };

struct Attn {
  const u16 *q, *k, *v, *mask;  // mask: nullptr for none
  float* ws;
  u16* o;
  int batch, heads, kv_heads, tokens, positions, dim, mask_batch;
  float scale;
};

struct AttnShared {
  // The block's queries, i = g * T + t (head h * G + g, token t), as float, D + 1 apart: the lanes that
  // read different queries at once read different banks.
  float q[kMaxQueryValues + kMaxQueries];
  float s[kMaxQueries][kChunk];  // their scores over the chunk, then exp(score - largest)
};

DP_INLINE int da_chunks(const Attn& a) { return (a.positions + kChunk - 1) / kChunk; }
DP_INLINE int da_queries(const Attn& a) { return a.heads / a.kv_heads * a.tokens; }
DP_INLINE int da_head(const Attn& a, int h, int i) { return h * (a.heads / a.kv_heads) + i / a.tokens; }
DP_INLINE bool da_kept(float mask) { return mask > -65504.0f; }

DP_INLINE float da_mask(const Attn& a, int b, int t, int pos) {
  if (a.mask == nullptr) return 0.0f;
  return h2f(a.mask[(static_cast<long>(a.mask_batch == 1 ? 0 : b) * a.tokens + t) * a.positions + pos]);
}

// A chunk's record of query i (head, token) in ws.
DP_INLINE float* da_record(const Attn& a, int b, int h, int i, int c) {
  return a.ws + (((static_cast<long>(b) * a.heads + da_head(a, h, i)) * a.tokens + i % a.tokens) * da_chunks(a) + c) *
                    (a.dim + 2);
}

// Thread tid's part of "the chunk holds a position some token keeps".
DP_INLINE bool da_live(const Attn& a, int b, int c, int tid) {
  bool live = false;
  for (int e = tid; e < a.tokens * kChunk; e += kAttnThreads) {
    const int t = e / kChunk, pos = c * kChunk + e % kChunk;
    if (pos < a.positions && da_kept(da_mask(a, b, t, pos))) live = true;
  }
  return live;
}

DP_INLINE void da_empty(const Attn& a, int b, int h, int c, int tid) {
  for (int i = tid; i < da_queries(a); i += kAttnThreads) {
    float* r = da_record(a, b, h, i, c);
    r[0] = DP_NEG_INF;
    r[1] = 0.0f;
  }
}

DP_INLINE void da_load_q(const Attn& a, AttnShared& sh, int b, int h, int tid) {
  for (int e = tid; e < da_queries(a) * a.dim; e += kAttnThreads) {
    const int i = e / a.dim;
    const long row = (static_cast<long>(b) * a.heads + da_head(a, h, i)) * a.tokens + i % a.tokens;
    sh.q[i * (a.dim + 1) + e % a.dim] = h2f(a.q[row * a.dim + e % a.dim]);
  }
}

// Pair e is (position e / Q, query e % Q): the lanes of a warp share K rows.
DP_INLINE void da_scores(const Attn& a, AttnShared& sh, int b, int h, int c, int tid) {
  const int queries = da_queries(a);
  for (int e = tid; e < queries * kChunk; e += kAttnThreads) {
    const int p = e / queries, i = e % queries, pos = c * kChunk + p;
    float score = DP_NEG_INF;
    const float mask = pos < a.positions ? da_mask(a, b, i % a.tokens, pos) : DP_NEG_INF;
    if (da_kept(mask)) {
      const u16* key = a.k + ((static_cast<long>(b) * a.kv_heads + h) * a.positions + pos) * a.dim;
      const float* query = sh.q + i * (a.dim + 1);
      float dot = 0.0f;
#ifdef __CUDACC_RTC__
#pragma unroll 4
#endif
      for (int d = 0; d < a.dim; d += 8) {
        const Chunk ch = load16(key + d);
        for (int j = 0; j < 4; ++j)
          dot += h2f(static_cast<u16>(ch.w[j] & 0xffffu)) * query[d + 2 * j] + h2f(static_cast<u16>(ch.w[j] >> 16)) * query[d + 2 * j + 1];
      }
      score = dot * a.scale + mask;
    }
    sh.s[i][p] = score;
  }
}

// Query i's largest score in the chunk, exp(score - largest) in place, and their sum: into its record.
DP_INLINE void da_softmax_part(const Attn& a, AttnShared& sh, int b, int h, int c, int i) {
  float largest = DP_NEG_INF, sum = 0.0f;
  for (int p = 0; p < kChunk; ++p) largest = fmaxf(largest, sh.s[i][p]);
  for (int p = 0; p < kChunk; ++p) {
    const float e = sh.s[i][p] == DP_NEG_INF ? 0.0f : expf(sh.s[i][p] - largest);
    sh.s[i][p] = e;
    sum += e;
  }
  float* r = da_record(a, b, h, i, c);
  r[0] = largest;
  r[1] = sum;
}

// Pair e is (query e / D, value e % D): the chunk's weighted values, left-out positions never read.
DP_INLINE void da_values(const Attn& a, const AttnShared& sh, int b, int h, int c, int tid) {
  const int c0 = c * kChunk, live = a.positions - c0 < kChunk ? a.positions - c0 : kChunk;
  const u16* values = a.v + ((static_cast<long>(b) * a.kv_heads + h) * a.positions + c0) * a.dim;
  for (int e = tid; e < da_queries(a) * a.dim; e += kAttnThreads) {
    const int i = e / a.dim, d = e % a.dim;
    float acc = 0.0f;
#ifdef __CUDACC_RTC__
#pragma unroll 8  // the loads of several positions in flight (each predicated on its weight)
#endif
    for (int p = 0; p < live; ++p)
      if (sh.s[i][p] != 0.0f) acc += sh.s[i][p] * h2f(values[static_cast<long>(p) * a.dim + d]);
    da_record(a, b, h, i, c)[2 + d] = acc;
  }
}

// Query row (b * H + head) * T + t: its chunks' parts rescaled to the largest score and divided by the
// sum, into o[b, t, head].
DP_INLINE void da_combine_row(const Attn& a, int row, int tid) {
  const int chunks = da_chunks(a), stride = a.dim + 2;
  const float* r = a.ws + static_cast<long>(row) * chunks * stride;
  float largest = DP_NEG_INF, sum = 0.0f;
  for (int c = 0; c < chunks; ++c)
    if (r[c * stride + 1] > 0.0f) largest = fmaxf(largest, r[c * stride]);
  for (int c = 0; c < chunks; ++c)
    if (r[c * stride + 1] > 0.0f) sum += r[c * stride + 1] * expf(r[c * stride] - largest);
  for (int d = tid; d < a.dim; d += kAttnThreads) {
    float acc = 0.0f;
    for (int c = 0; c < chunks; ++c)
      if (r[c * stride + 1] > 0.0f) acc += r[c * stride + 2 + d] * expf(r[c * stride] - largest);
    const int b = row / (a.heads * a.tokens), head = row / a.tokens % a.heads, t = row % a.tokens;
    a.o[((static_cast<long>(b) * a.tokens + t) * a.heads + head) * a.dim + d] = f2h(sum > 0.0f ? acc / sum : 0.0f);
  }
}

#define DA_PARAMS                                                                                      \
  const u16 *q, const u16 *k, const u16 *v, const u16 *mask, float *ws, u16 *o, int batch, int heads, \
      int kv_heads, int tokens, int positions, int dim, int mask_batch, float scale
#define DA_ARGS {q, k, v, mask, ws, o, batch, heads, kv_heads, tokens, positions, dim, mask_batch, scale}

#ifdef __CUDACC_RTC__
extern "C" __global__ void __launch_bounds__(kAttnThreads) da_split(DA_PARAMS) {
  const Attn a = DA_ARGS;
  __shared__ AttnShared sh;
  const int c = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  if (!__syncthreads_or(da_live(a, b, c, tid))) {
    da_empty(a, b, h, c, tid);
    return;
  }
  da_load_q(a, sh, b, h, tid);
  __syncthreads();
  da_scores(a, sh, b, h, c, tid);
  __syncthreads();
  for (int i = tid; i < da_queries(a); i += kAttnThreads) da_softmax_part(a, sh, b, h, c, i);
  __syncthreads();
  da_values(a, sh, b, h, c, tid);
}

extern "C" __global__ void __launch_bounds__(kAttnThreads) da_combine(DA_PARAMS) {
  const Attn a = DA_ARGS;
  da_combine_row(a, blockIdx.x, threadIdx.x);
}
#else
// The limits the kernels are written for (pipeline/kernels/decode_attention.py states them too): 0
// positions a chunk, 1 queries a block (G * T), 2 their values (G * T * D), 3 threads a block.
extern "C" int da_limit(int which) {
  const int limits[] = {kChunk, kMaxQueries, kMaxQueryValues, kAttnThreads};
  return which >= 0 && which < 4 ? limits[which] : -1;
}

// Both kernels on the CPU, block by block and thread by thread between the barriers: 0, or -1 for
// sizes the kernels do not take.
extern "C" int da_host(DA_PARAMS) {
  const Attn a = DA_ARGS;
  if (kv_heads <= 0 || heads % kv_heads || dim % 8 || da_queries(a) > kMaxQueries || da_queries(a) * dim > kMaxQueryValues)
    return -1;
  static AttnShared sh;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < kv_heads; ++h)
      for (int c = 0; c < da_chunks(a); ++c) {
        bool live = false;
        for (int tid = 0; tid < kAttnThreads; ++tid) live = da_live(a, b, c, tid) || live;
        if (!live) {
          for (int tid = 0; tid < kAttnThreads; ++tid) da_empty(a, b, h, c, tid);
          continue;
        }
        for (int tid = 0; tid < kAttnThreads; ++tid) da_load_q(a, sh, b, h, tid);
        for (int tid = 0; tid < kAttnThreads; ++tid) da_scores(a, sh, b, h, c, tid);
        for (int i = 0; i < da_queries(a); ++i) da_softmax_part(a, sh, b, h, c, i);
        for (int tid = 0; tid < kAttnThreads; ++tid) da_values(a, sh, b, h, c, tid);
      }
  for (int row = 0; row < batch * heads * tokens; ++row)
    for (int tid = 0; tid < kAttnThreads; ++tid) da_combine_row(a, row, tid);
  return 0;
}
#endif
