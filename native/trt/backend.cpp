// TensorRTBackend for ExecuTorch's runtime: runs the delegate blobs this project writes (blob.h)
// through TensorRT (engine.h) on one CUDA stream.
//
// init    reads the blob, fetches a TR03 engine from the program's named data (the .pte or its
//         .ptd) and checks it against its digest, checks NVIDIA_TF32_OVERRIDE against the build's,
//         and takes the engine from the process's engines (deserialized once per digest).
// execute checks every input against its binding (dtype, rank, dims within the built range)
//         before anything runs, copies inputs to the device, runs the engine and copies outputs
//         back (under Graphs::kCall the engine call is a CUDA graph once a call repeats the last
//         one's shapes and addresses, replayed while they hold). State stays on the device: an input whose new value is written into the input
//         itself (the output argument is the input's: write_back.py; the engine updates it in place,
//         or writes it elsewhere and the delegate copies it over on the device) lives in device
//         memory the delegate keeps for as long as the host memory ExecuTorch planned for it
//         exists: every delegate that is handed that memory (another method's, when the program
//         shares it; one that only reads it too) uses the same device copy, so a decode step moves
//         tokens in and logits out, never the cache or its counters. write_back.py rewrites a
//         program so only when TensorRT delegates alone touch that state, so the host copy
//         ExecuTorch planned is never read stale.
// A refusal is an ExecuTorch error with one log line naming the input or file and the fix; the
// line is also kept for callers (pipeline_trt_last_error) and nothing has run or changed.
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/core/named_data_map.h>
#include <executorch/runtime/platform/log.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "blob.h"
#include "cuda_driver.h"
#include "engine.h"
#include "sha256.h"

namespace et = ::executorch::runtime;
using et::ArrayRef;
using et::BackendExecutionContext;
using et::BackendInitContext;
using et::CompileSpec;
using et::DelegateHandle;
using et::Error;
using et::EValue;
using et::FreeableBuffer;
using et::Result;
using et::Span;
using Tensor = ::executorch::aten::Tensor;

namespace pipeline_trt {
namespace {

// ---- options, counters and the last refusal ------------------------------------------------------
struct Settings {
  std::mutex mutex;
  ContextOptions context;      // for delegates initialized from now on
  cuda::Stream stream = nullptr;  // the one stream every delegate runs on (nullptr: made when first needed)
  std::string last_error;
};
Settings& settings() {
  static Settings* s = new Settings;
  return *s;
}
std::atomic<uint64_t> g_to_device{0}, g_to_host{0};

Error refuse(Error code, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(settings().mutex);
    settings().last_error = message;
  }
  ET_LOG(Error, "%s", message.c_str());
  return code;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}

// ---- device memory -------------------------------------------------------------------------------
struct DeviceBuffer {
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
StateRegistry& states() {
  static StateRegistry* r = new StateRegistry;
  return *r;
}

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

// ---- one delegate --------------------------------------------------------------------------------
struct Delegate {
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

  ~Delegate() {
    graph.drop();
    destroy_object(context);
    destroy_object(config);
  }
};

bool scalar_type_is(const Tensor& t, const Binding& b) {
  return static_cast<int>(t.scalar_type()) == dtype_scalar_type(b.dtype);
}

// The input check: dtype, rank, and each dim equal to a static one or within the built range.
Error check_input(const Delegate& d, size_t k, const EValue* arg) {
  const Binding& b = *d.inputs[k];
  if (!arg->isTensor())
    return refuse(Error::InvalidArgument, d.where + ": input '" + b.name + "' is not a tensor; pass a " + b.dtype +
                                              " tensor of shape " + shape_text(b.shape));
  const Tensor& t = arg->toTensor();
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  bool ok = scalar_type_is(t, b) && shape.size() == b.shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) {
    if (b.shape[i] >= 0) ok = shape[i] == b.shape[i];
    else if (!b.min_shape.empty()) ok = shape[i] >= b.min_shape[i] && shape[i] <= b.max_shape[i];
  }
  if (ok) return Error::Ok;
  std::string range = b.min_shape.empty() ? "" : " (from " + shape_text(b.min_shape) + " to " + shape_text(b.max_shape) + ")";
  return refuse(Error::InvalidArgument,
                d.where + ": input '" + b.name + "' is " + dtype_of_scalar_type(static_cast<int>(t.scalar_type())) +
                    " of shape " + shape_text(shape) + "; the engine was built for " + b.dtype + " " +
                    shape_text(b.shape) + range + ": pass that, or rebuild the program for this input");
}

// The context, made when first run (a context takes an optimization profile, which another
// context may hold: made late, contexts leave profiles free until they run).
Error ensure_context(Delegate& d) {
  if (d.context != nullptr) return Error::Ok;
  std::string error;
  d.context = d.engine->make_context(d.options, d.config, error);
  if (d.context == nullptr) {
    const char* tf32 = std::getenv("NVIDIA_TF32_OVERRIDE");
    return refuse(Error::DelegateInvalidCompatibility,
                  d.where + ": " + error + "; NVIDIA_TF32_OVERRIDE is " + (tf32 ? tf32 : "unset") + " here");
  }
  return Error::Ok;
}

// Select the narrowest profile that takes these shapes (decode's one token, a prompt's range).
Error select_profile(Delegate& d, const std::vector<std::vector<int64_t>>& shapes, cuda::Stream stream) {
  const auto& profiles = d.engine->profiles();
  if (profiles.size() <= 1) return Error::Ok;
  std::vector<const Profile*> fits;
  for (const auto& p : profiles)
    if (p.fits(shapes)) fits.push_back(&p);
  std::sort(fits.begin(), fits.end(), [](const Profile* a, const Profile* b) { return a->width < b->width; });
  for (const Profile* p : fits) {
    if (p->index == d.profile) return Error::Ok;
    if (set_profile(d.context, p->index, stream)) {
      d.profile = p->index;
      for (auto& s : d.shapes) s.clear();  // a new profile forgets shapes and addresses
      d.out_shapes.clear();
      for (auto& a : d.bound) a = nullptr;
      return Error::Ok;
    }
  }
  return refuse(Error::InvalidArgument, d.where + ": no optimization profile of the engine takes input shapes " +
                                            [&] {
                                              std::string s;
                                              for (const auto& x : shapes) s += shape_text(x);
                                              return s;
                                            }() +
                                            " (another context may hold the one that does); pass shapes in the "
                                            "built range");
}

Error bind(Delegate& d, size_t slot, const std::string& name, void* address) {
  if (d.bound[slot] == address) return Error::Ok;
  if (!set_address(d.context, name, address))
    return refuse(Error::Internal, d.where + ": TensorRT refused the address of '" + name + "' (" +
                                       last_tensorrt_error() + ")");
  d.bound[slot] = address;
  return Error::Ok;
}

cuda::Stream the_stream(const cuda::Driver* drv, std::string& error) {
  std::lock_guard<std::mutex> lock(settings().mutex);
  if (settings().stream == nullptr) {
    cuda::Status s = drv->stream_create(&settings().stream, cuda::kStreamNonBlocking);
    if (s != 0) error = cuda::describe("cuStreamCreate", s);
  }
  return settings().stream;
}

// The device copy of the state in `t`'s host memory, where a delegate that updates it in place
// keeps one (then the host memory is stale: only TensorRT delegates touch such state, write_back.py).
std::shared_ptr<State> shared_state(const Tensor& t) {
  std::lock_guard<std::mutex> lock(states().mutex);
  auto found = states().by_host.find(t.const_data_ptr());
  std::shared_ptr<State> state = found == states().by_host.end() ? nullptr : found->second.lock();
  return state && state->bytes == t.nbytes() ? state : nullptr;
}

// The device memory of state input k: the copy every delegate handed this host memory shares,
// made from the host's contents the first time.
Error state_for(Delegate& d, size_t k, const Tensor& t, const cuda::Driver* drv, cuda::Stream stream, void** out) {
  const void* host = t.const_data_ptr();
  const size_t bytes = t.nbytes();
  std::shared_ptr<State>& mine = d.state[k];
  if (!mine || mine->host != host || mine->bytes != bytes) {
    std::lock_guard<std::mutex> lock(states().mutex);
    auto& by_host = states().by_host;
    for (auto it = by_host.begin(); it != by_host.end();)  // memory no delegate holds any more
      it = it->second.expired() ? by_host.erase(it) : std::next(it);
    std::weak_ptr<State>& entry = by_host[host];
    std::shared_ptr<State> found = entry.lock();
    if (!found || found->bytes != bytes) {
      found = std::make_shared<State>();
      found->host = host;
      std::string error;
      if (!found->device.reserve(drv, bytes, error)) return refuse(Error::MemoryAllocationFailed, d.where + ": " + error);
      found->bytes = bytes;
      cuda::Status s = drv->copy_to_device(found->device.ptr, host, bytes, stream);
      if (s != 0) return refuse(Error::Internal, d.where + ": " + cuda::describe("cuMemcpyHtoDAsync", s));
      g_to_device += bytes;
      entry = found;
    }
    mine = found;
  }
  *out = reinterpret_cast<void*>(mine->device.ptr);
  return Error::Ok;
}

// Capture TensorRT's call on `stream` as a graph; false (nothing captured, nothing run) when it
// cannot be: TensorRT then runs the call directly from now on.
bool capture(Delegate& d, const cuda::Driver* drv, cuda::Stream stream) {
  if (drv->begin_capture(stream, cuda::kCaptureThreadLocal) != 0) return false;
  bool ran = enqueue(d.context, stream);
  cuda::Graph graph = nullptr;
  bool ok = drv->end_capture(stream, &graph) == 0 && ran && graph != nullptr;
  cuda::GraphExec exec = nullptr;
  ok = ok && drv->graph_instantiate(&exec, graph, 0) == 0;
  if (graph != nullptr) drv->graph_destroy(graph);
  if (!ok) return false;
  d.graph.drop();
  d.graph.exec = exec;
  return true;
}

// Run the engine on the bound addresses: its call's graph while the shapes and addresses it was
// captured for hold; else TensorRT's call, captured when it repeats the last call's.
Error launch(Delegate& d, const cuda::Driver* drv, cuda::Stream stream) {
  if (d.options.graphs == Graphs::kCall && !d.graph.refused) {
    CallKey now{d.profile, d.shapes, d.bound};
    bool replay = d.graph.exec != nullptr && d.graph.captured == now;
    if (!replay && d.graph.last == now) {
      replay = capture(d, drv, stream);
      d.graph.refused = !replay;
      if (!replay) ET_LOG(Info, "%s: its TensorRT call cannot be captured as a CUDA graph; it runs uncaptured", d.where.c_str());
      if (replay) d.graph.captured = now;
    }
    if (replay) {
      cuda::Status s = drv->graph_launch(d.graph.exec, stream);
      if (s != 0) return refuse(Error::Internal, d.where + ": " + cuda::describe("cuGraphLaunch", s));
      d.graph.last = std::move(now);
      return Error::Ok;
    }
    if (!enqueue(d.context, stream))
      return refuse(Error::Internal, d.where + ": TensorRT failed to run the engine (" + last_tensorrt_error() + ")");
    d.graph.last = std::move(now);  // a call that ran: the next one repeating it is captured
    return Error::Ok;
  }
  if (!enqueue(d.context, stream))
    return refuse(Error::Internal, d.where + ": TensorRT failed to run the engine (" + last_tensorrt_error() + ")");
  return Error::Ok;
}

Error run(Delegate& d, Span<EValue*> args) {
  const size_t n_in = d.inputs.size(), n_out = d.outputs.size();
  if (args.size() != n_in + n_out)
    return refuse(Error::InvalidProgram, d.where + ": the program passes " + std::to_string(args.size()) +
                                             " values to a delegate of " + std::to_string(n_in + n_out) +
                                             " bindings; the program is damaged: rebuild it");
  for (size_t k = 0; k < n_in; ++k)
    if (Error e = check_input(d, k, args[k]); e != Error::Ok) return e;
  for (size_t o = 0; o < n_out; ++o)
    if (!args[n_in + o]->isTensor() || !scalar_type_is(args[n_in + o]->toTensor(), *d.outputs[o]))
      return refuse(Error::InvalidProgram, d.where + ": output '" + d.outputs[o]->name + "' is not a " +
                                               d.outputs[o]->dtype + " tensor in the program; rebuild it");
  std::string error;
  const cuda::Driver* drv = cuda::driver(error);
  if (drv == nullptr) return refuse(Error::NotSupported, d.where + ": " + error);
  cuda::Stream stream = the_stream(drv, error);
  if (stream == nullptr) return refuse(Error::Internal, d.where + ": " + error);
  if (Error e = ensure_context(d); e != Error::Ok) return e;
  std::vector<std::vector<int64_t>> shapes(n_in);
  for (size_t k = 0; k < n_in; ++k) {
    const Tensor& t = args[k]->toTensor();
    shapes[k].assign(t.sizes().begin(), t.sizes().end());
  }
  if (Error e = select_profile(d, shapes, stream); e != Error::Ok) return e;
  bool reshaped = d.out_shapes.empty() || shapes != d.shapes;
  // The outputs' shapes are forgotten until every input shape is set and they are asked again: a
  // call refused half way leaves nothing a later call could take for its own.
  if (reshaped) d.out_shapes.clear();
  for (size_t k = 0; k < n_in; ++k) {
    if (shapes[k] == d.shapes[k]) continue;
    d.shapes[k].clear();  // unknown until TensorRT takes the new one
    if (!set_input_shape(d.context, d.inputs[k]->name, shapes[k]))
      return refuse(Error::InvalidArgument, d.where + ": input '" + d.inputs[k]->name + "' has shape " +
                                                shape_text(shapes[k]) + ", which the engine's optimization profile " +
                                                std::to_string(d.profile < 0 ? 0 : d.profile) + " does not take (" +
                                                last_tensorrt_error() + "); pass a shape in the built range");
    d.shapes[k] = shapes[k];
  }
  // Outputs first: which write state (their argument is an input's memory, write_back.py). The
  // engine updates aliased state in place; any other new value of state goes to the delegate's own
  // buffer and from there into the state's device memory.
  std::vector<bool> in_place(n_in, false);
  std::vector<int> into(n_out, -1);
  for (size_t o = 0; o < n_out; ++o) {
    const Tensor& out = args[n_in + o]->toTensor();
    auto is_input = [&](size_t k) {
      const Tensor& in = args[k]->toTensor();
      return out.const_data_ptr() == in.const_data_ptr() && out.nbytes() == in.nbytes() && out.nbytes() > 0;
    };
    if (int k = d.alias_of[o]; k >= 0) {
      in_place[k] = in_place[k] || is_input(k);
      continue;
    }
    for (size_t k = 0; k < n_in && into[o] < 0; ++k)
      if (is_input(k)) into[o] = static_cast<int>(k), in_place[k] = true;
  }
  // Inputs: state stays on the device; the rest are copied in.
  std::vector<void*> in_addr(n_in);
  for (size_t k = 0; k < n_in; ++k) {
    const Tensor& t = args[k]->toTensor();
    if (in_place[k]) {
      if (Error e = state_for(d, k, t, drv, stream, &in_addr[k]); e != Error::Ok) return e;
    } else if (!d.written[k] && (d.state[k] = shared_state(t))) {
      in_addr[k] = reinterpret_cast<void*>(d.state[k]->device.ptr);  // state another delegate keeps on the device
    } else {
      if (!d.in_buffers[k].reserve(drv, t.nbytes(), error)) return refuse(Error::MemoryAllocationFailed, d.where + ": " + error);
      if (t.nbytes() > 0) {
        cuda::Status s = drv->copy_to_device(d.in_buffers[k].ptr, t.const_data_ptr(), t.nbytes(), stream);
        if (s != 0) return refuse(Error::Internal, d.where + ": " + cuda::describe("cuMemcpyHtoDAsync", s));
        g_to_device += t.nbytes();
      }
      in_addr[k] = reinterpret_cast<void*>(d.in_buffers[k].ptr);
    }
    if (Error e = bind(d, k, d.inputs[k]->name, in_addr[k]); e != Error::Ok) return e;
  }
  if (reshaped) {  // the outputs' shapes follow the inputs': asked of TensorRT only when those change
    std::vector<std::vector<int64_t>> asked;
    for (const Binding* b : d.outputs) {
      asked.push_back(context_shape(d.context, b->name));
      const auto& shape = asked.back();
      bool known = shape.size() == b->shape.size();
      for (size_t i = 0; known && i < shape.size(); ++i) known = shape[i] >= 0 && (b->shape[i] < 0 || shape[i] == b->shape[i]);
      if (!known)
        return refuse(Error::InvalidProgram, d.where + ": TensorRT gives output '" + b->name + "' the shape " +
                                                 shape_text(shape) + ", which its binding " + shape_text(b->shape) +
                                                 " does not allow; rebuild the program");
    }
    d.out_shapes = std::move(asked);
  }
  std::vector<void*> out_addr(n_out);
  for (size_t o = 0; o < n_out; ++o) {
    Tensor& t = args[n_in + o]->toTensor();
    const std::vector<int64_t>& shape = d.out_shapes[o];
    std::vector<executorch::aten::SizesType> sizes(shape.begin(), shape.end());
    if (!std::equal(sizes.begin(), sizes.end(), t.sizes().begin(), t.sizes().end()) &&
        et::resize_tensor(t, ArrayRef<executorch::aten::SizesType>(sizes.data(), sizes.size())) != Error::Ok)
      return refuse(Error::InvalidProgram, d.where + ": output '" + d.outputs[o]->name + "' of shape " +
                                               shape_text(shape) + " does not fit the program's tensor; rebuild it");
    size_t elements = 1;
    for (int64_t x : shape) elements *= static_cast<size_t>(x);
    if (t.nbytes() != elements * dtype_size(d.outputs[o]->dtype))
      return refuse(Error::InvalidProgram, d.where + ": output '" + d.outputs[o]->name + "' of shape " +
                                               shape_text(shape) + " does not fit the program's tensor; rebuild it");
    int k = d.alias_of[o];
    if (k >= 0) {
      out_addr[o] = in_addr[k];  // TensorRT writes it into the input's memory
    } else {
      if (!d.out_buffers[o].reserve(drv, t.nbytes(), error)) return refuse(Error::MemoryAllocationFailed, d.where + ": " + error);
      out_addr[o] = reinterpret_cast<void*>(d.out_buffers[o].ptr);
    }
    if (Error e = bind(d, n_in + o, d.outputs[o]->name, out_addr[o]); e != Error::Ok) return e;
  }
  if (Error e = launch(d, drv, stream); e != Error::Ok) return e;
  for (size_t o = 0; o < n_out; ++o) {
    Tensor& t = args[n_in + o]->toTensor();
    if (into[o] >= 0) {  // new state: into its device memory
      cuda::Status s = drv->copy_on_device(reinterpret_cast<cuda::DevicePtr>(in_addr[into[o]]),
                                           reinterpret_cast<cuda::DevicePtr>(out_addr[o]), t.nbytes(), stream);
      if (s != 0) return refuse(Error::Internal, d.where + ": " + cuda::describe("cuMemcpyDtoDAsync", s));
    }
    int k = d.alias_of[o];
    if (into[o] >= 0 || (k >= 0 && in_place[k]) || t.nbytes() == 0) continue;  // state stays on the device
    cuda::Status s = drv->copy_to_host(t.mutable_data_ptr(), reinterpret_cast<cuda::DevicePtr>(out_addr[o]),
                                       t.nbytes(), stream);
    if (s != 0) return refuse(Error::Internal, d.where + ": " + cuda::describe("cuMemcpyDtoHAsync", s));
    g_to_host += t.nbytes();
  }
  cuda::Status s = drv->stream_synchronize(stream);
  if (s != 0) return refuse(Error::Internal, d.where + ": " + cuda::describe("cuStreamSynchronize", s));
  return Error::Ok;
}

// ---- init ----------------------------------------------------------------------------------------
// The engine's bytes: inline in the blob, or the named data entry (kept in `held`), checked.
Result<const void*> engine_data(BackendInitContext& context, Delegate& d, std::optional<FreeableBuffer>& held) {
  if (d.info.inline_engine != nullptr) return static_cast<const void*>(d.info.inline_engine);
  const et::NamedDataMap* named = context.get_named_data_map();
  Result<FreeableBuffer> data = named != nullptr ? named->get_data(d.info.engine_key.c_str())
                                                 : Result<FreeableBuffer>(Error::NotFound);
  if (!data.ok())
    return refuse(Error::NotFound, d.where + ": the program's named data has no entry '" + d.info.engine_key +
                                       "' (its engine); load the program with the .ptd it was written with "
                                       "(data_path=...), or rebuild it");
  held.emplace(std::move(data.get()));
  if (held->size() != d.info.engine_size)
    return refuse(Error::InvalidExternalData, d.where + ": named data '" + d.info.engine_key + "' is " +
                                                  std::to_string(held->size()) + " bytes, its blob says " +
                                                  std::to_string(d.info.engine_size) +
                                                  "; the .ptd is not this program's: use the one written with it");
  if (sha256_hex(held->data(), held->size()) != d.info.engine_sha256)
    return refuse(Error::InvalidExternalData, d.where + ": named data '" + d.info.engine_key +
                                                  "' does not match its SHA-256 (a damaged or altered .ptd or .pte); "
                                                  "copy it again or rebuild the program");
  return held->data();
}

class TensorRTBackend final : public et::BackendInterface {
 public:
  bool is_available() const override { return true; }

  Result<DelegateHandle*> init(BackendInitContext& context, FreeableBuffer* processed,
                               ArrayRef<CompileSpec>) const override {
    auto d = std::make_unique<Delegate>();
    const char* method = context.get_method_name();
    std::string error;
    bool ok = decode_blob(static_cast<const uint8_t*>(processed->data()), processed->size(), d->info, error);
    d->where = std::string("method '") + (method ? method : "?") + "', TensorRT engine " +
               (ok ? d->info.engine_sha256.substr(0, 12) : std::string("?"));
    if (!ok) {
      processed->Free();
      return refuse(Error::InvalidProgram, d->where + ": " + error + "; rebuild the program");
    }
    if (d->info.has_tf32_override) {
      const char* here = std::getenv("NVIDIA_TF32_OVERRIDE");
      std::string now = here ? here : "";
      if (now != d->info.tf32_override) {
        processed->Free();
        auto said = [](const std::string& v) { return v.empty() ? std::string("NVIDIA_TF32_OVERRIDE unset") : "NVIDIA_TF32_OVERRIDE=" + v; };
        return refuse(Error::DelegateInvalidCompatibility,
                      d->where + " was built with " + said(d->info.tf32_override) + " and this process has " +
                          said(now) + "; TensorRT-RTX runs an engine only under the NVIDIA_TF32_OVERRIDE it was "
                          "built with: set it so here, or rebuild the program");
      }
    }
    for (const auto& b : d->info.bindings) (b.is_input ? d->inputs : d->outputs).push_back(&b);
    for (const Binding* b : d->inputs) d->input_names.push_back(b->name);
    for (const Binding* b : d->outputs) {
      int k = -1;
      for (size_t i = 0; i < d->inputs.size(); ++i)
        if (!b->aliases.empty() && d->inputs[i]->name == b->aliases) k = static_cast<int>(i);
      d->alias_of.push_back(k);
    }
    d->written.assign(d->inputs.size(), false);
    for (int k : d->alias_of)
      if (k >= 0) d->written[k] = true;
    // The inline engine lives in `processed`: keep it until the engine is deserialized.
    std::optional<FreeableBuffer> held;
    Result<const void*> data = engine_data(context, *d, held);
    if (!data.ok()) {
      processed->Free();
      return data.error();
    }
    std::string drv_error;
    if (cuda::driver(drv_error) == nullptr) {
      processed->Free();
      return refuse(Error::NotSupported, d->where + ": " + drv_error);
    }
    d->engine = load_engine(d->info.engine_sha256, data.get(), d->info.engine_size, d->input_names, error);
    held.reset();
    processed->Free();
    d->info.inline_engine = nullptr;
    if (!d->engine) return refuse(Error::DelegateInvalidCompatibility, d->where + ": " + error);
    if (!check_io(*d->engine, d->info.bindings, error))
      return refuse(Error::InvalidProgram, d->where + ": " + error + "; rebuild the program");
    {
      std::lock_guard<std::mutex> lock(settings().mutex);
      d->options = settings().context;
    }
    d->shapes.resize(d->inputs.size());
    d->in_buffers.resize(d->inputs.size());
    d->out_buffers.resize(d->outputs.size());
    d->state.resize(d->inputs.size());
    d->bound.assign(d->inputs.size() + d->outputs.size(), nullptr);
    return reinterpret_cast<DelegateHandle*>(d.release());
  }

  // Calls run one at a time in a process: every delegate shares one CUDA stream, and a call being
  // captured as a graph must see no other call's work enqueued on it.
  Error execute(BackendExecutionContext&, DelegateHandle* handle, Span<EValue*> args) const override {
    static std::mutex* calls = new std::mutex;
    std::lock_guard<std::mutex> lock(*calls);
    return run(*reinterpret_cast<Delegate*>(handle), args);
  }

  void destroy(DelegateHandle* handle) const override { delete reinterpret_cast<Delegate*>(handle); }
};

TensorRTBackend g_backend;
const et::Backend g_entry{"TensorRTBackend", &g_backend};
const Error g_registered = et::register_backend(g_entry);

}  // namespace
}  // namespace pipeline_trt

// ---- C entry points (for pipeline.runtime's hand-off and the runner) ------------------------------
extern "C" {
// 0 when TensorRTBackend is in ExecuTorch's registry.
int pipeline_trt_registered() { return static_cast<int>(pipeline_trt::g_registered); }
// CUDA graphs for delegates initialized from now on: 0 none; 1 TensorRT-RTX's whole-graph capture;
// 2 each engine call captured by the delegate, replayed while its input shapes and addresses stay
// the same (its kernels then compiled eagerly). Returns 0, or -1 (nothing changed) for another value.
int pipeline_trt_set_cuda_graph(int mode) {
  if (mode < 0 || mode > 2) return -1;
  std::lock_guard<std::mutex> lock(pipeline_trt::settings().mutex);
  pipeline_trt::settings().context.graphs = static_cast<pipeline_trt::Graphs>(mode);
  return 0;
}
// When TensorRT-RTX compiles shape-specialized kernels, for delegates initialized from now on:
// 0 in the background, generic kernels until then (the default); 1 before the call returns; 2 never.
// Returns 0, or -1 (nothing changed) for another value.
int pipeline_trt_set_kernel_specialization(int strategy) {
  if (strategy < 0 || strategy > 2) return -1;
  std::lock_guard<std::mutex> lock(pipeline_trt::settings().mutex);
  pipeline_trt::settings().context.kernels = static_cast<pipeline_trt::abi::KernelSpecialization>(strategy);
  return 0;
}
// Run every delegate on this CUDA stream (a cudaStream_t / CUstream of the primary context).
void pipeline_trt_set_stream(void* stream) {
  std::lock_guard<std::mutex> lock(pipeline_trt::settings().mutex);
  pipeline_trt::settings().stream = stream;
}
// Use this TensorRT library (before the first engine loads).
void pipeline_trt_set_library(const char* path) { pipeline_trt::set_library(path ? path : ""); }
// The library in use ("" before the first engine).
const char* pipeline_trt_library() {
  static std::string held;
  held = pipeline_trt::library_in_use();
  return held.c_str();
}
// The last refusal's line ("" when none).
const char* pipeline_trt_last_error() {
  static thread_local std::string held;
  std::lock_guard<std::mutex> lock(pipeline_trt::settings().mutex);
  held = pipeline_trt::settings().last_error;
  return held.c_str();
}
void pipeline_trt_clear_error() {
  std::lock_guard<std::mutex> lock(pipeline_trt::settings().mutex);
  pipeline_trt::settings().last_error.clear();
}
// Page-lock `bytes` of host memory at `ptr` (a caller's planned memory, where the delegate copies
// inputs from and outputs to), so those copies go straight to and from the device. Returns 0, or -1
// (the memory stays pageable and works as before) without a usable CUDA driver or when the driver
// refuses. Unpin before the memory is freed.
int pipeline_trt_pin_host(void* ptr, size_t bytes) {
  std::string error;
  const pipeline_trt::cuda::Driver* drv = pipeline_trt::cuda::driver(error);
  if (drv == nullptr || ptr == nullptr || bytes == 0) return -1;
  return drv->host_register(ptr, bytes, 0) == 0 ? 0 : -1;
}
void pipeline_trt_unpin_host(void* ptr) {
  std::string error;
  const pipeline_trt::cuda::Driver* drv = pipeline_trt::cuda::driver(error);
  if (drv != nullptr && ptr != nullptr) drv->host_unregister(ptr);
}
// Bytes copied host to device and device to host since the process started.
unsigned long long pipeline_trt_bytes_to_device() { return pipeline_trt::g_to_device.load(); }
unsigned long long pipeline_trt_bytes_to_host() { return pipeline_trt::g_to_host.load(); }
}
