// What the TensorRT delegate and the plan delegate share (backend.cpp, plan_delegate.cpp): settings
// and refusals, device memory, state kept on the device across delegates, and one engine's delegate
// with its calls (bind, profile, launch, as a CUDA graph).
#pragma once

#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/span.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "blob.h"
#include "cuda_driver.h"
#include "engine.h"

namespace pipeline_trt {

using Error = ::executorch::runtime::Error;
using EValue = ::executorch::runtime::EValue;
using Tensor = ::executorch::aten::Tensor;

// ---- options, counters and the last refusal ------------------------------------------------------
struct Settings {
  std::mutex mutex;
  ContextOptions context;      // for delegates initialized from now on
  cuda::Stream stream = nullptr;  // the one stream every delegate runs on (nullptr: made when first needed)
  std::string last_error;
};

// ---- device memory -------------------------------------------------------------------------------
struct DeviceBuffer {
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), capacity(o.capacity) { o.ptr = 0, o.capacity = 0; }
  cuda::DevicePtr ptr = 0;
  size_t capacity = 0;
  ~DeviceBuffer() {
    std::string ignored;
    if (ptr != 0)
      if (const cuda::Driver* d = cuda::driver(ignored)) d->mem_free(ptr);
  }
  bool reserve(const cuda::Driver* d, size_t bytes, std::string& error) {
    bytes = bytes == 0 ? 256 : bytes;
    if (bytes <= capacity) return true;
    if (ptr != 0) d->mem_free(ptr);
    ptr = 0;
    capacity = 0;
    cuda::Status s = d->mem_alloc(&ptr, bytes);
    if (s != 0) {
      error = cuda::describe("cuMemAlloc", s) + " for " + std::to_string(bytes) + " bytes";
      return false;
    }
    capacity = bytes;
    return true;
  }
};

// A state buffer's device copy, shared by every delegate handed the same host memory.
struct State {
  DeviceBuffer device;
  const void* host = nullptr;  // the planned memory it stands for
  size_t bytes = 0;
};

struct StateRegistry {
  std::mutex mutex;
  std::map<const void*, std::weak_ptr<State>> by_host;
};

// ---- one engine call as a CUDA graph (Graphs::kCall) -----------------------------------------------
// What a captured call depends on: the profile, the input shapes and every binding's address.
struct CallKey {
  int profile = -1;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<void*> bound;
  bool operator==(const CallKey& o) const { return profile == o.profile && shapes == o.shapes && bound == o.bound; }
};

struct CallGraph {
  cuda::GraphExec exec = nullptr;
  CallKey captured;   // what `exec` was captured for
  CallKey last;       // the last call's (a call repeating it is captured: the first ran uncaptured, warm)
  bool refused = false;  // TensorRT's call could not be captured: always run it directly

  void drop() {
    std::string error;
    const cuda::Driver* drv = exec != nullptr ? cuda::driver(error) : nullptr;
    if (drv != nullptr) drv->graph_exec_destroy(exec);
    exec = nullptr;
  }
};

// ---- one engine's delegate ------------------------------------------------------------------------
// What ExecuTorch holds for a delegate: an engine's (Delegate) or a plan's (plan_delegate.cpp).
struct Handle {
  bool is_plan = false;
  virtual ~Handle() = default;
};

struct Delegate : Handle {
  BlobInfo info;
  std::string where;  // "method 'decode', TensorRT engine 1a2b3c4d5e6f"
  std::vector<const Binding*> inputs, outputs;
  std::vector<int> alias_of;  // per output: the input position it updates in place, or -1
  std::vector<bool> written;  // per input: an output updates it in place
  std::vector<std::string> input_names;
  std::shared_ptr<Engine> engine;
  ContextOptions options;  // the settings when the delegate was initialized
  void* context = nullptr;
  void* config = nullptr;  // the runtime config the context was made from (it keeps using it)
  int profile = -1;
  std::vector<std::vector<int64_t>> shapes;  // per input: the shape TensorRT last got
  std::vector<std::vector<int64_t>> out_shapes;  // per output: its shape for those (empty: not asked yet)
  std::vector<DeviceBuffer> in_buffers, out_buffers;
  std::vector<std::shared_ptr<State>> state;  // per input: its device copy while it is state
  std::vector<void*> bound;                   // per binding (inputs, then outputs): the address last set
  CallGraph graph;                            // Graphs::kCall: the engine call as a CUDA graph

  ~Delegate() override {
    graph.drop();
    destroy_object(context);
    destroy_object(config);
  }
};

Settings& settings();
extern std::atomic<uint64_t> g_to_device, g_to_host;
// Keep `message` as the last refusal, log it, and return `code`.
Error refuse(Error code, const std::string& message);
std::string shape_text(const std::vector<int64_t>& shape);
StateRegistry& states();
bool scalar_type_is(const Tensor& t, const Binding& b);
// The input check: dtype, rank, and each dim equal to a static one or within the built range.
Error check_input(const Delegate& d, size_t k, const EValue* arg);
Error ensure_context(Delegate& d);
Error select_profile(Delegate& d, const std::vector<std::vector<int64_t>>& shapes, cuda::Stream stream);
Error bind(Delegate& d, size_t slot, const std::string& name, void* address);
cuda::Stream the_stream(const cuda::Driver* drv, std::string& error);
std::shared_ptr<State> shared_state(const Tensor& t);
// The device memory of the state in `t`'s host memory: the copy every delegate handed this host
// memory shares, made from the host's contents the first time (kept in `mine`).
Error state_for(Delegate& d, size_t k, const Tensor& t, const cuda::Driver* drv, cuda::Stream stream, void** out);
Error state_for(std::shared_ptr<State>& mine, const std::string& where, const Tensor& t, const cuda::Driver* drv,
                cuda::Stream stream, void** out);
Error launch(Delegate& d, const cuda::Driver* drv, cuda::Stream stream);

// Per output binding: the position of the input its `aliases` names (written in place), or -1.
std::vector<int> alias_positions(const std::vector<const Binding*>& inputs, const std::vector<const Binding*>& outputs);

// Which inputs of a call are state (write_back.py: an output's argument is that input's memory):
// `in_place` per input, one an aliased output updates where it lives or an output writes anew; `into`
// per output, the input its new value is copied into on the device (-1: none).
struct StateUse {
  std::vector<bool> in_place;
  std::vector<int> into;
};
StateUse state_use(::executorch::runtime::Span<EValue*> args, size_t n_in, const std::vector<int>& alias_of);

}  // namespace pipeline_trt
