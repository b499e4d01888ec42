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
#include "delegate.h"
#include "engine.h"
#include "plan_delegate.h"
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

namespace pipeline_trt {
namespace {


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
  auto [in_place, into] = state_use(args, n_in, d.alias_of);
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

}  // namespace

// One engine's delegate made ready from its decoded blob (`d.info`, `d.where` set): the
// NVIDIA_TF32_OVERRIDE it needs, its bindings, its engine fetched, checked and deserialized. An
// inline engine points into the blob, which the caller frees after this.
Error init_engine(BackendInitContext& context, Delegate& d) {
  if (d.info.has_tf32_override) {
    const char* here = std::getenv("NVIDIA_TF32_OVERRIDE");
    std::string now = here ? here : "";
    if (now != d.info.tf32_override) {
      auto said = [](const std::string& v) { return v.empty() ? std::string("NVIDIA_TF32_OVERRIDE unset") : "NVIDIA_TF32_OVERRIDE=" + v; };
      return refuse(Error::DelegateInvalidCompatibility,
                    d.where + " was built with " + said(d.info.tf32_override) + " and this process has " +
                        said(now) + "; TensorRT-RTX runs an engine only under the NVIDIA_TF32_OVERRIDE it was "
                        "built with: set it so here, or rebuild the program");
    }
  }
  for (const auto& b : d.info.bindings) (b.is_input ? d.inputs : d.outputs).push_back(&b);
  for (const Binding* b : d.inputs) d.input_names.push_back(b->name);
  d.alias_of = alias_positions(d.inputs, d.outputs);
  d.written.assign(d.inputs.size(), false);
  for (int k : d.alias_of)
    if (k >= 0) d.written[k] = true;
  std::optional<FreeableBuffer> held;
  Result<const void*> data = engine_data(context, d, held);
  if (!data.ok()) return data.error();
  std::string error;
  if (cuda::driver(error) == nullptr) return refuse(Error::NotSupported, d.where + ": " + error);
  d.engine = load_engine(d.info.engine_sha256, data.get(), d.info.engine_size, d.input_names, error);
  held.reset();
  d.info.inline_engine = nullptr;
  if (!d.engine) return refuse(Error::DelegateInvalidCompatibility, d.where + ": " + error);
  if (!check_io(*d.engine, d.info.bindings, error))
    return refuse(Error::InvalidProgram, d.where + ": " + error + "; rebuild the program");
  {
    std::lock_guard<std::mutex> lock(settings().mutex);
    d.options = settings().context;
  }
  d.shapes.resize(d.inputs.size());
  d.in_buffers.resize(d.inputs.size());
  d.out_buffers.resize(d.outputs.size());
  d.state.resize(d.inputs.size());
  d.bound.assign(d.inputs.size() + d.outputs.size(), nullptr);
  return Error::Ok;
}

namespace {

class TensorRTBackend final : public et::BackendInterface {
 public:
  bool is_available() const override { return true; }

  Result<DelegateHandle*> init(BackendInitContext& context, FreeableBuffer* processed,
                               ArrayRef<CompileSpec>) const override {
    const char* method = context.get_method_name();
    const auto* bytes = static_cast<const uint8_t*>(processed->data());
    if (is_plan_blob(bytes, processed->size())) {
      Result<Handle*> plan = init_plan(context, bytes, processed->size(), method ? method : "?");
      processed->Free();
      if (!plan.ok()) return plan.error();
      return reinterpret_cast<DelegateHandle*>(plan.get());
    }
    auto d = std::make_unique<Delegate>();
    std::string error;
    bool ok = decode_blob(bytes, processed->size(), d->info, error);
    d->where = std::string("method '") + (method ? method : "?") + "', TensorRT engine " +
               (ok ? d->info.engine_sha256.substr(0, 12) : std::string("?"));
    Error e = ok ? init_engine(context, *d) : refuse(Error::InvalidProgram, d->where + ": " + error + "; rebuild the program");
    processed->Free();  // an inline engine lived in it: kept until the engine was deserialized
    if (e != Error::Ok) return e;
    return reinterpret_cast<DelegateHandle*>(static_cast<Handle*>(d.release()));
  }

  // Calls run one at a time in a process: every delegate shares one CUDA stream, and a call being
  // captured as a graph must see no other call's work enqueued on it.
  Error execute(BackendExecutionContext&, DelegateHandle* handle, Span<EValue*> args) const override {
    static std::mutex* calls = new std::mutex;
    std::lock_guard<std::mutex> lock(*calls);
    Handle* h = reinterpret_cast<Handle*>(handle);
    return h->is_plan ? run_plan(*h, args) : run(*static_cast<Delegate*>(h), args);
  }

  void destroy(DelegateHandle* handle) const override { delete reinterpret_cast<Handle*>(handle); }
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
