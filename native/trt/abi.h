// The part of the TensorRT runtime interface the native delegate calls, declared by this project.
//
// TensorRT's C++ API is a set of wrapper objects (IRuntime, ICudaEngine, IExecutionContext,
// IRuntimeConfig: a virtual-destructor table, then a pointer to an implementation object) whose
// inline methods call the implementation's virtual functions. Only the factory
// `createInferRuntime_INTERNAL` is a C symbol. This header states, for each method the delegate
// uses, its slot in the implementation's virtual table and its C++ signature, laid out as
// TensorRT 11 and TensorRT-RTX 1.6 lay them out (TensorRT 10 does not match). The slots are
// checked against NVIDIA's own TensorRT-RTX Python bindings by tests/native/test_trt_abi.py, so a
// TensorRT upgrade that moves one fails in CI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pipeline_trt {
namespace abi {

// ---- values ---------------------------------------------------------------------------------------
constexpr int kMaxDims = 8;

// A tensor shape: rank, then up to eight extents (-1: dynamic). 72 bytes, returned through a
// hidden result pointer (larger than two registers).
struct Dims {
  int32_t rank;
  int64_t d[kMaxDims];
};
static_assert(sizeof(Dims) == 72, "TensorRT's Dims64 is 72 bytes");

// TensorRT's element types (DataType), by value.
enum class DataType : int32_t {
  kFloat = 0, kHalf = 1, kInt8 = 2, kInt32 = 3, kBool = 4, kUInt8 = 5, kFp8 = 6, kBf16 = 7, kInt64 = 8, kInt4 = 9,
};

enum class IOMode : int32_t { kNone = 0, kInput = 1, kOutput = 2 };
enum class ProfileSelector : int32_t { kMin = 0, kOpt = 1, kMax = 2 };
enum class Severity : int32_t { kInternalError = 0, kError = 1, kWarning = 2, kInfo = 3, kVerbose = 4 };
enum class CudaGraphStrategy : int32_t { kDisabled = 0, kWholeGraphCapture = 1 };  // TensorRT-RTX
// When TensorRT-RTX compiles kernels specialized to a new input shape: in the background, running
// generic kernels until then (lazy); before the call returns (eager); never (none).
enum class KernelSpecialization : int32_t { kLazy = 0, kEager = 1, kNone = 2 };  // TensorRT-RTX

// ---- the logger TensorRT calls ---------------------------------------------------------------------
// A versioned interface: language, interface info, destructor, then log().
struct InterfaceInfo {
  const char* kind;
  int32_t major;
  int32_t minor;
};

class Logger {
 public:
  virtual int32_t api_language() const noexcept { return 0; }  // C++
  virtual InterfaceInfo interface_info() const noexcept { return {"ILogger", 1, 0}; }
  virtual ~Logger() noexcept = default;
  virtual void log(Severity severity, const char* message) noexcept = 0;
};

// ---- virtual-table slots of the implementation objects ----------------------------------------------
namespace runtime_slot {
constexpr int kDeserializeCudaEngine = 3;  // ICudaEngine* (const void* blob, size_t size)
}
namespace engine_slot {
constexpr int kNbOptimizationProfiles = 8;    // int32_t ()
constexpr int kTensorShape = 15;              // Dims (const char* name)
constexpr int kTensorDataType = 16;           // DataType (const char* name)
constexpr int kTensorIOMode = 19;             // IOMode (const char* name)
constexpr int kProfileShape = 25;             // Dims (const char* name, int32_t profile, ProfileSelector)
constexpr int kNbIOTensors = 26;              // int32_t ()
constexpr int kIOTensorName = 27;             // const char* (int32_t index)
constexpr int kCreateContextWithConfig = 47;  // IExecutionContext* (IRuntimeConfig*)
constexpr int kCreateRuntimeConfig = 48;      // IRuntimeConfig* ()
}  // namespace engine_slot
namespace context_slot {
constexpr int kAllInputDimensionsSpecified = 12;  // bool ()
constexpr int kSetOptimizationProfileAsync = 16;  // bool (int32_t profile, cudaStream_t)
constexpr int kSetInputShape = 20;                // bool (const char* name, const Dims&)
constexpr int kTensorShape = 21;                  // Dims (const char* name)
constexpr int kSetTensorAddress = 23;             // bool (const char* name, void* address)
constexpr int kEnqueueV3 = 36;                    // bool (cudaStream_t)
}  // namespace context_slot
namespace config_slot {  // TensorRT-RTX
constexpr int kSetKernelSpecialization = 8;  // void (KernelSpecialization)
constexpr int kSetCudaGraphStrategy = 10;    // bool (CudaGraphStrategy)
}  // namespace config_slot

// The C factory every TensorRT library exports; `version` is the library's own
// (getInferLibVersion), which it checks.
using CreateRuntimeFn = void* (*)(void* logger, int32_t version);
using LibVersionFn = int32_t (*)();
constexpr const char* kCreateRuntimeSymbol = "createInferRuntime_INTERNAL";
constexpr const char* kLibVersionSymbol = "getInferLibVersion";

// The library versions (getInferLibVersion: major * 10000 + minor * 100 + patch) whose slots
// tests/native/test_trt_abi.py verified against NVIDIA's bindings: TensorRT-RTX 1.6. A library of
// any other version is refused before a slot is called; adding one here takes that test run on it.
struct VersionRange {
  const char* name;
  int32_t first, last;
};
constexpr VersionRange kVerified[] = {{"TensorRT-RTX 1.6", 10600, 10699}};

inline bool verified(int32_t version) {
  for (const auto& r : kVerified)
    if (version >= r.first && version <= r.last) return true;
  return false;
}
inline std::string version_text(int32_t v) {
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}
inline std::string verified_text() {
  std::string out;
  for (const auto& r : kVerified) out += (out.empty() ? "" : ", ") + std::string(r.name);
  return out;
}

// ---- calls ---------------------------------------------------------------------------------------
// A wrapper object: its own table (destructors at 0 and 1), then the implementation pointer.
struct Wrapper {
  void** vtable;
  void* impl;
};

inline void* impl_of(void* wrapper) { return static_cast<Wrapper*>(wrapper)->impl; }

// Call slot `Slot` of `wrapper`'s implementation as `R f(Args...)` (a member function: the
// implementation object is the first argument).
template <int Slot, typename R, typename... Args>
inline R call(void* wrapper, Args... args) {
  void* impl = impl_of(wrapper);
  using Fn = R (*)(void*, Args...);
  return reinterpret_cast<Fn>((*static_cast<void***>(impl))[Slot])(impl, args...);
}

// The same for a method returning Dims: the result pointer comes before the object.
template <int Slot, typename... Args>
inline Dims call_dims(void* wrapper, Args... args) {
  void* impl = impl_of(wrapper);
  Dims out{};
  using Fn = Dims* (*)(Dims*, void*, Args...);
  reinterpret_cast<Fn>((*static_cast<void***>(impl))[Slot])(&out, impl, args...);
  return out;
}

// Destroy a wrapper object (its deleting destructor, slot 1 of its own table).
inline void destroy(void* wrapper) {
  if (wrapper == nullptr) return;
  using Fn = void (*)(void*);
  reinterpret_cast<Fn>(static_cast<Wrapper*>(wrapper)->vtable[1])(wrapper);
}

}  // namespace abi
}  // namespace pipeline_trt
