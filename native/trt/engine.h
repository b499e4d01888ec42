// TensorRT engines for the delegate: the TensorRT library (TensorRT-RTX, or standard TensorRT 11)
// loaded once per process, each engine deserialized once per process however many delegates or
// methods name it, and execution contexts made from them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "abi.h"
#include "blob.h"

namespace pipeline_trt {

// One optimization profile: per input (in the order asked for), the [min, max] extents.
struct Profile {
  int index = 0;
  std::vector<std::vector<int64_t>> min, max;
  double width = 0;  // how much it takes (narrower profiles are preferred)
  bool fits(const std::vector<std::vector<int64_t>>& shapes) const;
};

// Which CUDA graphs a delegate's engine calls run as: none; TensorRT-RTX's whole-graph capture;
// or each call captured by the delegate and replayed while its input shapes and addresses stay
// the same (`runtime.method_graph`: a call is one launch).
enum class Graphs : int { kNone = 0, kTensorRT = 1, kCall = 2 };

// How a context runs, set when it is made (TensorRT-RTX only; standard TensorRT ignores them).
struct ContextOptions {
  Graphs graphs = Graphs::kNone;
  abi::KernelSpecialization kernels = abi::KernelSpecialization::kLazy;  // eager under Graphs::kCall
};

class Engine {
 public:
  ~Engine();
  void* handle() const { return engine_; }
  const std::vector<Profile>& profiles() const { return profiles_; }
  // A new execution context made from a runtime config set to `options`, which it uses for as long
  // as it lives: the caller destroys the context, then `config`. nullptr with `error` set.
  void* make_context(const ContextOptions& options, void*& config, std::string& error) const;

 private:
  friend std::shared_ptr<Engine> load_engine(const std::string&, const void*, size_t,
                                             const std::vector<std::string>&, std::string&);
  void* engine_ = nullptr;
  std::vector<Profile> profiles_;
};

// The engine with this digest: the one already loaded in this process, else `data` deserialized
// (`inputs`: the input binding names, for its profiles); nullptr with `error` set.
std::shared_ptr<Engine> load_engine(const std::string& digest, const void* data, size_t size,
                                    const std::vector<std::string>& inputs, std::string& error);

// Whether the engine's own I/O tensors are the blob's bindings: the same names, each an input or an
// output as bound, of the bound dtype and rank, with the bound extent wherever the engine's is
// fixed. The blob's metadata is not covered by the engine's digest, so buffers are sized only from
// metadata checked so; false with `error` naming the first difference.
bool check_io(const Engine& engine, const std::vector<Binding>& bindings, std::string& error);

// Use the TensorRT library at `path` instead of the default search (before the first engine).
void set_library(const std::string& path);
// Which library is in use ("" before the first engine).
std::string library_in_use();
// The last error TensorRT logged (to name it in a refusal).
std::string last_tensorrt_error();

// Context calls.
bool set_input_shape(void* context, const std::string& name, const std::vector<int64_t>& shape);
std::vector<int64_t> context_shape(void* context, const std::string& name);
bool set_address(void* context, const std::string& name, void* address);
bool set_profile(void* context, int profile, void* stream);
bool enqueue(void* context, void* stream);
void destroy_object(void* object);

}  // namespace pipeline_trt
