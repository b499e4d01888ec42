// What every kernel source of this project starts with (pipeline/kernels/ptx.py compiles them after it,
// as one text): the half-precision conversions and 16-byte loads, for NVRTC (`__CUDACC_RTC__`: the PTX a
// program carries) and for the host's C++ compiler (the tests run the kernels' code on the CPU).
#ifdef __CUDACC_RTC__
#include <cuda_fp16.h>
#define DP_INLINE __device__ __forceinline__
#define DP_UNROLL _Pragma("unroll")  // every loop of constant count in a chunk: its arrays stay in registers
typedef unsigned int u32;
typedef unsigned short u16;
DP_INLINE float h2f(u16 bits) { return __half2float(__ushort_as_half(bits)); }
DP_INLINE u16 f2h(float v) { return __half_as_ushort(__float2half_rn(v)); }
DP_INLINE float bits_float(u32 bits) { return __uint_as_float(bits); }
struct Chunk { u32 w[4]; };
DP_INLINE Chunk load16(const void* p) {
  uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  Chunk c = {{v.x, v.y, v.z, v.w}};
  return c;
}
#else
#include <cmath>
#include <cstring>
#define DP_INLINE inline
#define DP_UNROLL
typedef unsigned int u32;
typedef unsigned short u16;
inline float h2f(u16 bits) { _Float16 h; std::memcpy(&h, &bits, 2); return static_cast<float>(h); }
inline u16 f2h(float v) { _Float16 h = static_cast<_Float16>(v); u16 b; std::memcpy(&b, &h, 2); return b; }
inline float bits_float(u32 bits) { float f; std::memcpy(&f, &bits, 4); return f; }
struct Chunk { u32 w[4]; };
inline Chunk load16(const void* p) { Chunk c; std::memcpy(c.w, p, 16); return c; }
#endif
#define DP_NEG_INF (bits_float(0xff800000u))
