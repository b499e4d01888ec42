#include "engine.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

namespace pipeline_trt {
namespace {

// TensorRT-RTX first (it builds the engines this project makes on any machine), then standard
// TensorRT 11, whose interface is laid out alike (TensorRT 10's is not). Either loads only in a
// version abi.h's allowlist names (the ones the ABI test verified).
const char* const kLibraries[] = {"libtensorrt_rtx.so.1", "libnvinfer.so.11"};

class Log final : public abi::Logger {
 public:
  void log(abi::Severity severity, const char* message) noexcept override {
    if (severity > abi::Severity::kWarning) return;
    std::lock_guard<std::mutex> lock(mutex);
    std::fprintf(stderr, "[TensorRT] %s\n", message);
    if (severity <= abi::Severity::kError) last = message;
  }
  std::mutex mutex;
  std::string last;
};

struct Library {
  std::mutex mutex;
  std::string requested;  // set_library
  std::string path;       // what loaded
  void* runtime = nullptr;
  std::map<std::string, std::weak_ptr<Engine>> engines;
};

Library& library() {
  static Library* lib = new Library;  // lives as long as the process: engines may outlive statics
  return *lib;
}

Log& logger() {
  static Log* log = new Log;
  return *log;
}

bool open_runtime(Library& lib, std::string& error) {
  if (lib.runtime != nullptr) return true;
  std::vector<std::string> tried;
  if (!lib.requested.empty()) tried.push_back(lib.requested);
  else if (const char* env = std::getenv("PIPELINE_TENSORRT_LIBRARY"); env != nullptr && *env) tried.push_back(env);
  else tried.assign(std::begin(kLibraries), std::end(kLibraries));
  void* handle = nullptr;
  std::string errors;
  for (const auto& name : tried) {
    handle = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (handle != nullptr) {
      lib.path = name;
      break;
    }
    errors += std::string(errors.empty() ? "" : "; ") + dlerror();
  }
  if (handle == nullptr) {
    error = "the TensorRT library does not load (" + errors +
            "): install TensorRT-RTX (pip install tensorrt-rtx-cu13) and put its libs on LD_LIBRARY_PATH, or set "
            "PIPELINE_TENSORRT_LIBRARY to libtensorrt_rtx.so.1 or libnvinfer.so.11";
    return false;
  }
  auto create = reinterpret_cast<abi::CreateRuntimeFn>(dlsym(handle, abi::kCreateRuntimeSymbol));
  auto version = reinterpret_cast<abi::LibVersionFn>(dlsym(handle, abi::kLibVersionSymbol));
  if (create == nullptr || version == nullptr) {
    error = lib.path + " is not a TensorRT library (it lacks " + abi::kCreateRuntimeSymbol + ")";
    return false;
  }
  const int32_t v = version();
  if (!abi::verified(v)) {
    error = lib.path + " is version " + abi::version_text(v) + ", whose C++ interface the delegate's declarations were "
            "not verified against (" + abi::verified_text() + " were): install one of those";
    return false;
  }
  lib.runtime = create(&logger(), v);
  if (lib.runtime == nullptr) {
    error = lib.path + " made no TensorRT runtime (" + last_tensorrt_error() + ")";
    return false;
  }
  return true;
}

}  // namespace

bool Profile::fits(const std::vector<std::vector<int64_t>>& shapes) const {
  for (size_t k = 0; k < shapes.size() && k < min.size(); ++k) {
    if (min[k].size() != shapes[k].size()) return false;
    for (size_t d = 0; d < shapes[k].size(); ++d)
      if (shapes[k][d] < min[k][d] || shapes[k][d] > max[k][d]) return false;
  }
  return true;
}

Engine::~Engine() { destroy_object(engine_); }

void* Engine::make_context(const ContextOptions& options, void*& config, std::string& error) const {
  config = abi::call<abi::engine_slot::kCreateRuntimeConfig, void*>(engine_);
  if (config == nullptr) {
    error = "TensorRT made no runtime config (" + last_tensorrt_error() + ")";
    return nullptr;
  }
  if (library_in_use().find("rtx") != std::string::npos) {
    // a call's graph would keep the generic kernels it captured: specialize them first
    abi::call<abi::config_slot::kSetKernelSpecialization, void>(
        config, options.graphs == Graphs::kCall ? abi::KernelSpecialization::kEager : options.kernels);
    if (options.graphs == Graphs::kTensorRT)
      abi::call<abi::config_slot::kSetCudaGraphStrategy, bool>(config, abi::CudaGraphStrategy::kWholeGraphCapture);
  }
  void* context = abi::call<abi::engine_slot::kCreateContextWithConfig, void*>(engine_, config);
  if (context == nullptr) {
    error = "TensorRT made no execution context (" + last_tensorrt_error() + ")";
    destroy_object(config);
    config = nullptr;
  }
  return context;
}

std::shared_ptr<Engine> load_engine(const std::string& digest, const void* data, size_t size,
                                    const std::vector<std::string>& inputs, std::string& error) {
  Library& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  if (auto found = lib.engines[digest].lock()) return found;
  if (!open_runtime(lib, error)) return nullptr;
  {
    std::lock_guard<std::mutex> lock(logger().mutex);
    logger().last.clear();
  }
  void* handle = abi::call<abi::runtime_slot::kDeserializeCudaEngine, void*>(lib.runtime, data, size);
  if (handle == nullptr) {
    error = "TensorRT (" + lib.path + ") could not deserialize engine " + digest.substr(0, 12) + " (" +
            last_tensorrt_error() + "): it was built by another TensorRT version or for another GPU; rebuild the program "
            "with this toolchain for this GPU";
    return nullptr;
  }
  auto engine = std::shared_ptr<Engine>(new Engine);
  engine->engine_ = handle;
  const int n = abi::call<abi::engine_slot::kNbOptimizationProfiles, int32_t>(handle);
  for (int p = 0; p < n; ++p) {
    Profile profile;
    profile.index = p;
    for (const auto& name : inputs) {
      abi::Dims lo = abi::call_dims<abi::engine_slot::kProfileShape>(handle, name.c_str(), int32_t{p},
                                                                     abi::ProfileSelector::kMin);
      abi::Dims hi = abi::call_dims<abi::engine_slot::kProfileShape>(handle, name.c_str(), int32_t{p},
                                                                     abi::ProfileSelector::kMax);
      std::vector<int64_t> low, high;
      for (int d = 0; d < lo.rank && d < abi::kMaxDims; ++d) {
        low.push_back(lo.d[d]);
        high.push_back(hi.d[d]);
        profile.width += static_cast<double>(hi.d[d] - lo.d[d]);
      }
      profile.min.push_back(low);
      profile.max.push_back(high);
    }
    engine->profiles_.push_back(profile);
  }
  lib.engines[digest] = engine;
  return engine;
}

namespace {
const char* io_dtype(abi::DataType t) {
  switch (t) {
    case abi::DataType::kFloat: return "float32";
    case abi::DataType::kHalf: return "float16";
    case abi::DataType::kBf16: return "bfloat16";
    case abi::DataType::kInt8: return "int8";
    case abi::DataType::kUInt8: return "uint8";
    case abi::DataType::kInt32: return "int32";
    case abi::DataType::kInt64: return "int64";
    case abi::DataType::kBool: return "bool";
    default: return "";  // fp8, int4: never an I/O tensor of ours
  }
}
}  // namespace

bool check_io(const Engine& engine, const std::vector<Binding>& bindings, std::string& error) {
  void* handle = engine.handle();
  const int32_t n = abi::call<abi::engine_slot::kNbIOTensors, int32_t>(handle);
  if (n != static_cast<int32_t>(bindings.size()))
    return error = "the engine has " + std::to_string(n) + " I/O tensors, its blob binds " +
                   std::to_string(bindings.size()) + " (the blob's metadata is not this engine's)", false;
  for (int32_t i = 0; i < n; ++i) {
    const char* name = abi::call<abi::engine_slot::kIOTensorName, const char*>(handle, i);
    const Binding* b = nullptr;
    for (const auto& x : bindings)
      if (name != nullptr && x.name == name) b = &x;
    if (b == nullptr)
      return error = "the engine's I/O tensor '" + std::string(name ? name : "?").substr(0, 64) +
                     "' is not in its blob (the blob's metadata is not this engine's)", false;
    const auto mode = abi::call<abi::engine_slot::kTensorIOMode, abi::IOMode>(handle, name);
    const auto dtype = abi::call<abi::engine_slot::kTensorDataType, abi::DataType>(handle, name);
    const abi::Dims dims = abi::call_dims<abi::engine_slot::kTensorShape>(handle, name);
    bool same = mode == (b->is_input ? abi::IOMode::kInput : abi::IOMode::kOutput) && b->dtype == io_dtype(dtype) &&
                dims.rank == static_cast<int32_t>(b->shape.size());
    for (int d = 0; same && d < dims.rank && d < abi::kMaxDims; ++d)
      same = dims.d[d] < 0 || dims.d[d] == b->shape[d];
    if (!same)
      return error = "the engine's I/O tensor '" + b->name + "' is not what its blob binds (input or output, dtype " +
                     b->dtype + ", rank " + std::to_string(b->shape.size()) + ", static dims): the blob's metadata is "
                     "not this engine's", false;
  }
  return true;
}

void set_library(const std::string& path) {
  std::lock_guard<std::mutex> lock(library().mutex);
  library().requested = path;
}

std::string library_in_use() { return library().path; }

std::string last_tensorrt_error() {
  std::lock_guard<std::mutex> lock(logger().mutex);
  return logger().last.empty() ? std::string("no error logged") : logger().last;
}

namespace {
abi::Dims to_dims(const std::vector<int64_t>& shape) {
  abi::Dims dims{};
  dims.rank = static_cast<int32_t>(shape.size());
  for (size_t d = 0; d < shape.size() && d < abi::kMaxDims; ++d) dims.d[d] = shape[d];
  return dims;
}
}  // namespace

bool set_input_shape(void* context, const std::string& name, const std::vector<int64_t>& shape) {
  abi::Dims dims = to_dims(shape);
  return abi::call<abi::context_slot::kSetInputShape, bool>(context, name.c_str(), static_cast<const abi::Dims*>(&dims));
}

std::vector<int64_t> context_shape(void* context, const std::string& name) {
  abi::Dims dims = abi::call_dims<abi::context_slot::kTensorShape>(context, name.c_str());
  std::vector<int64_t> out;
  for (int d = 0; d < dims.rank && d < abi::kMaxDims; ++d) out.push_back(dims.d[d]);
  return out;
}

bool set_address(void* context, const std::string& name, void* address) {
  return abi::call<abi::context_slot::kSetTensorAddress, bool>(context, name.c_str(), address);
}

bool set_profile(void* context, int profile, void* stream) {
  return abi::call<abi::context_slot::kSetOptimizationProfileAsync, bool>(context, int32_t{profile}, stream);
}

bool enqueue(void* context, void* stream) { return abi::call<abi::context_slot::kEnqueueV3, bool>(context, stream); }

void destroy_object(void* object) { abi::destroy(object); }

}  // namespace pipeline_trt
