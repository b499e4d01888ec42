#include "plan_delegate.h"

#include <executorch/runtime/core/named_data_map.h>
#include <executorch/runtime/platform/log.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "sha256.h"

namespace et = ::executorch::runtime;

namespace pipeline_trt {
namespace {

// A kernel step: its function, its weights on the device, and the values it reads and writes; an
// attention step: its two functions (split, then combine), its sizes and scale.
struct KernelCall {
  cuda::Function function = nullptr, combine = nullptr;
  DeviceBuffer weight, scales, bias;  // scales and bias: ptr 0 where the step has none
  int n = 0, k = 0, group = 0;
  unsigned grid = 0, block = 0;
  AttentionSizes sizes;
  float scale = 0.0f;
};

struct Plan : Handle {
  PlanInfo info;
  std::string where;  // "method 'decode', TensorRT plan of 89 steps"
  std::vector<const Binding*> inputs, outputs;
  std::vector<int> alias_of;                        // per output: the input it is written into, or -1
  std::vector<bool> written;                        // per input: an output updates it in place
  std::vector<std::vector<std::vector<int64_t>>> shapes;  // per step: its engine's input shapes (static)
  std::vector<std::unique_ptr<Delegate>> engines;   // per step: its engine's delegate (null: a kernel)
  std::vector<std::unique_ptr<KernelCall>> kernels;  // per step: its kernel (null: an engine)
  std::map<std::string, DeviceBuffer> buffers;      // the values and outputs the steps write
  std::map<std::string, const Binding*> declared;   // every name: its dtype and shape
  std::vector<DeviceBuffer> in_buffers;             // per input: its device copy where it is no state
  std::vector<std::shared_ptr<State>> state;        // per input: its shared device copy while it is state
  ContextOptions options;
  cuda::GraphExec graph = nullptr;  // Graphs::kCall: every step as one CUDA graph
  std::vector<void*> captured, last;
  bool uncapturable = false;

  ~Plan() override {
    std::string error;
    const cuda::Driver* drv = graph != nullptr ? cuda::driver(error) : nullptr;
    if (drv != nullptr) drv->graph_exec_destroy(graph);
  }
};

// Modules by the PTX's digest, loaded once a process (never unloaded: delegates of any method share them).
std::mutex g_modules_mutex;
std::map<std::string, cuda::Module> g_modules;

size_t bytes_of(const Binding& b) {
  size_t n = dtype_size(b.dtype);
  for (int64_t d : b.shape) n *= static_cast<size_t>(d);
  return n;
}

// A named-data entry, checked against its size and digest.
Error fetch(et::BackendInitContext& context, const Plan& p, const DataEntry& entry, std::optional<et::FreeableBuffer>& out) {
  const et::NamedDataMap* named = context.get_named_data_map();
  et::Result<et::FreeableBuffer> data = named != nullptr ? named->get_data(entry.key.c_str())
                                                         : et::Result<et::FreeableBuffer>(Error::NotFound);
  if (!data.ok())
    return refuse(Error::NotFound, p.where + ": the program's named data has no entry '" + shown(entry.key) +
                                       "' (its kernels' data); load the program with the .ptd it was written with, or rebuild it");
  out.emplace(std::move(data.get()));
  if (out->size() != entry.size || sha256_hex(out->data(), out->size()) != entry.sha256)
    return refuse(Error::InvalidExternalData, p.where + ": named data '" + shown(entry.key) +
                                                  "' does not match its size and SHA-256 (a damaged or altered .pte or "
                                                  ".ptd); copy it again or rebuild the program");
  return Error::Ok;
}

Error upload(et::BackendInitContext& context, const Plan& p, const DataEntry& entry, DeviceBuffer& buffer,
             const cuda::Driver* drv, cuda::Stream stream) {
  if (entry.key.empty()) return Error::Ok;
  std::optional<et::FreeableBuffer> data;
  if (Error e = fetch(context, p, entry, data); e != Error::Ok) return e;
  std::string error;
  if (!buffer.reserve(drv, data->size(), error)) return refuse(Error::MemoryAllocationFailed, p.where + ": " + error);
  cuda::Status s = drv->copy_to_device(buffer.ptr, data->data(), data->size(), stream);
  if (s == 0) s = drv->stream_synchronize(stream);  // the host bytes go when `data` does
  if (s != 0) return refuse(Error::Internal, p.where + ": " + cuda::describe("cuMemcpyHtoDAsync", s));
  return Error::Ok;
}

Error load_kernel(et::BackendInitContext& context, Plan& p, const PlanStep& step, KernelCall& call,
                  const cuda::Driver* drv, cuda::Stream stream) {
  cuda::Module module = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_modules_mutex);
    auto found = g_modules.find(step.module.sha256);
    if (found != g_modules.end()) module = found->second;
  }
  if (module == nullptr) {
    std::optional<et::FreeableBuffer> ptx;
    if (Error e = fetch(context, p, step.module, ptx); e != Error::Ok) return e;
    const char* text = static_cast<const char*>(ptx->data());
    if (ptx->size() == 0 || text[ptx->size() - 1] != '\0')
      return refuse(Error::InvalidProgram, p.where + ": the kernels' PTX is not NUL-terminated; rebuild the program");
    cuda::Status s = drv->module_load(&module, text);
    if (s != 0)
      return refuse(Error::NotSupported, p.where + ": this machine's CUDA driver cannot load the program's kernels (" +
                                             cuda::describe("cuModuleLoadData", s) +
                                             "); run it where the driver supports their PTX (CUDA 13's: driver 580 or "
                                             "later) or rebuild it without compile.decode_kernels");
    std::lock_guard<std::mutex> lock(g_modules_mutex);
    g_modules.emplace(step.module.sha256, module);
  }
  if (step.is_attention) {
    const auto& d = p.declared;
    const Binding* mask = step.inputs.size() == 4 ? d.at(step.inputs[3]) : nullptr;
    attention_sizes(*d.at(step.inputs[0]), *d.at(step.inputs[1]), *d.at(step.inputs[2]), mask, *d.at(step.outputs[0]),
                    *d.at(step.outputs[1]), call.sizes);  // decode_plan checked them
    std::memcpy(&call.scale, &step.scale_bits, sizeof call.scale);
    for (auto [name, function] : {std::pair{"da_split", &call.function}, {"da_combine", &call.combine}})
      if (drv->module_function(function, module, name) != 0)
        return refuse(Error::InvalidProgram, p.where + ": its PTX has no kernel " + name + "; rebuild the program");
    return Error::Ok;
  }
  cuda::Status s = drv->module_function(&call.function, module, step.kernel.c_str());
  if (s != 0) return refuse(Error::InvalidProgram, p.where + ": its PTX has no kernel " + step.kernel + "; rebuild the program");
  call.n = static_cast<int>(step.n), call.k = static_cast<int>(step.k), call.group = static_cast<int>(step.group);
  call.grid = static_cast<unsigned>(step.grid), call.block = static_cast<unsigned>(step.block);
  for (auto [entry, buffer] : {std::pair{&step.weight, &call.weight}, {&step.scales, &call.scales}, {&step.bias, &call.bias}})
    if (Error e = upload(context, p, *entry, *buffer, drv, stream); e != Error::Ok) return e;
  return Error::Ok;
}

Error check_arg(const Plan& p, const Binding& b, const EValue* arg, bool input) {
  bool ok = arg->isTensor() && scalar_type_is(arg->toTensor(), b);
  if (ok) {
    const Tensor& t = arg->toTensor();
    ok = std::equal(t.sizes().begin(), t.sizes().end(), b.shape.begin(), b.shape.end());
  }
  if (ok) return Error::Ok;
  if (!input)
    return refuse(Error::InvalidProgram, p.where + ": output '" + b.name + "' is not a " + b.dtype + " tensor of shape " +
                                             shape_text(b.shape) + " in the program; rebuild it");
  return refuse(Error::InvalidArgument, p.where + ": input '" + b.name + "' is not a " + b.dtype + " tensor of shape " +
                                            shape_text(b.shape) + "; pass that, or rebuild the program for this input");
}

// An attention step's two kernels in turn (decode_attention.cu's parameters, in its order).
Error launch_attention(const Plan& p, const PlanStep& step, KernelCall& call, const std::map<std::string, void*>& at,
                       const cuda::Driver* drv, cuda::Stream stream) {
  void *q = at.at(step.inputs[0]), *k = at.at(step.inputs[1]), *v = at.at(step.inputs[2]);
  void* mask = step.inputs.size() == 4 ? at.at(step.inputs[3]) : nullptr;
  void *o = at.at(step.outputs[0]), *ws = at.at(step.outputs[1]);
  AttentionSizes& s = call.sizes;
  void* params[] = {&q, &k, &v, &mask, &ws, &o, &s.batch, &s.heads, &s.kv_heads, &s.tokens, &s.positions, &s.dim,
                    &s.mask_batch, &call.scale};
  const unsigned threads = kAttentionThreads;
  cuda::Status status = drv->launch_kernel(call.function, unsigned(s.chunks), unsigned(s.kv_heads), unsigned(s.batch), threads,
                                           1, 1, 0, stream, params, nullptr);
  if (status == 0)
    status = drv->launch_kernel(call.combine, unsigned(s.batch * s.heads * s.tokens), 1, 1, threads, 1, 1, 0, stream, params, nullptr);
  return status == 0 ? Error::Ok : refuse(Error::Internal, p.where + ": " + cuda::describe("cuLaunchKernel", status) + " (decode attention)");
}

// Every step in turn on `stream`, reading and writing the memory `at` gives each name.
Error run_steps(Plan& p, const std::map<std::string, void*>& at, const cuda::Driver* drv, cuda::Stream stream) {
  for (size_t i = 0; i < p.info.steps.size(); ++i) {
    const PlanStep& step = p.info.steps[i];
    if (Delegate* d = p.engines[i].get()) {
      if (Error e = ensure_context(*d); e != Error::Ok) return e;
      const auto& shapes = p.shapes[i];
      if (Error e = select_profile(*d, shapes, stream); e != Error::Ok) return e;
      for (size_t k = 0; k < shapes.size(); ++k) {
        if (shapes[k] == d->shapes[k]) continue;
        if (!set_input_shape(d->context, d->inputs[k]->name, shapes[k]))
          return refuse(Error::InvalidProgram, d->where + ": TensorRT refused the shape of '" + d->inputs[k]->name +
                                                   "' (" + last_tensorrt_error() + "); rebuild the program");
        d->shapes[k] = shapes[k];
      }
      for (size_t k = 0; k < step.inputs.size(); ++k)
        if (Error e = bind(*d, k, d->inputs[k]->name, at.at(step.inputs[k])); e != Error::Ok) return e;
      for (size_t o = 0; o < step.outputs.size(); ++o)
        if (Error e = bind(*d, step.inputs.size() + o, d->outputs[o]->name, at.at(step.outputs[o])); e != Error::Ok) return e;
      if (Error e = launch(*d, drv, stream); e != Error::Ok) return e;
      continue;
    }
    KernelCall& call = *p.kernels[i];
    if (step.is_attention) {
      if (Error e = launch_attention(p, step, call, at, drv, stream); e != Error::Ok) return e;
      continue;
    }
    void *x = at.at(step.inputs[0]), *y = at.at(step.outputs[0]);
    void *w = reinterpret_cast<void*>(call.weight.ptr), *s = reinterpret_cast<void*>(call.scales.ptr);
    void* b = reinterpret_cast<void*>(call.bias.ptr);
    void* params[] = {&x, &w, &s, &b, &y, &call.n, &call.k, &call.group};
    cuda::Status status = drv->launch_kernel(call.function, call.grid, 1, 1, call.block, 1, 1, 0, stream, params, nullptr);
    if (status != 0) return refuse(Error::Internal, p.where + ": " + cuda::describe("cuLaunchKernel", status) + " (" + step.kernel + ")");
  }
  return Error::Ok;
}

// The steps as one CUDA graph while the memory they read is where the last call's was (captured the
// second time a call repeats it); else run one by one.
Error run_graph(Plan& p, const std::map<std::string, void*>& at, std::vector<void*> key, const cuda::Driver* drv,
                cuda::Stream stream) {
  if (p.options.graphs != Graphs::kCall || p.uncapturable) return run_steps(p, at, drv, stream);
  if (p.graph == nullptr || p.captured != key) {
    if (p.last != key) {
      p.last = std::move(key);
      return run_steps(p, at, drv, stream);
    }
    if (drv->begin_capture(stream, cuda::kCaptureThreadLocal) != 0) return run_steps(p, at, drv, stream);
    Error ran = run_steps(p, at, drv, stream);
    cuda::Graph graph = nullptr;
    bool ok = drv->end_capture(stream, &graph) == 0 && ran == Error::Ok && graph != nullptr;
    cuda::GraphExec exec = nullptr;
    ok = ok && drv->graph_instantiate(&exec, graph, 0) == 0;
    if (graph != nullptr) drv->graph_destroy(graph);
    if (!ok) {
      p.uncapturable = true;
      ET_LOG(Info, "%s: its steps cannot be captured as a CUDA graph; they run uncaptured", p.where.c_str());
      return run_steps(p, at, drv, stream);
    }
    if (p.graph != nullptr) drv->graph_exec_destroy(p.graph);
    p.graph = exec;
    p.captured = key;
  }
  cuda::Status s = drv->graph_launch(p.graph, stream);
  return s == 0 ? Error::Ok : refuse(Error::Internal, p.where + ": " + cuda::describe("cuGraphLaunch", s));
}

}  // namespace

et::Result<Handle*> init_plan(et::BackendInitContext& context, const uint8_t* blob, size_t size, const std::string& method) {
  auto p = std::make_unique<Plan>();
  p->is_plan = true;
  std::string error;
  p->where = "method '" + method + "', TensorRT plan";
  if (!decode_plan(blob, size, p->info, error)) return refuse(Error::InvalidProgram, p->where + ": " + error + "; rebuild the program");
  p->where += " of " + std::to_string(p->info.steps.size()) + " steps";
  const cuda::Driver* drv = cuda::driver(error);
  if (drv == nullptr) return refuse(Error::NotSupported, p->where + ": " + error);
  cuda::Stream stream = the_stream(drv, error);
  if (stream == nullptr) return refuse(Error::Internal, p->where + ": " + error);
  for (const auto& b : p->info.bindings) (b.is_input ? p->inputs : p->outputs).push_back(&b);
  for (const auto* list : {&p->info.bindings, &p->info.values})
    for (const auto& b : *list) p->declared[b.name] = &b;
  p->alias_of = alias_positions(p->inputs, p->outputs);
  p->written.assign(p->inputs.size(), false);
  for (int k : p->alias_of)
    if (k >= 0) p->written[k] = true;
  for (const auto& step : p->info.steps) {
    p->shapes.emplace_back();
    if (step.is_engine)
      for (const auto& name : step.inputs) p->shapes.back().push_back(p->declared.at(name)->shape);
    if (step.is_engine) {
      auto d = std::make_unique<Delegate>();
      d->info = step.engine;
      d->where = p->where + ", engine " + step.engine.engine_sha256.substr(0, 12);
      if (Error e = init_engine(context, *d); e != Error::Ok) return e;
      d->graph.refused = true;  // the plan captures its steps as one graph, not each engine call
      p->engines.push_back(std::move(d));
      p->kernels.emplace_back();
    } else {
      auto call = std::make_unique<KernelCall>();
      if (Error e = load_kernel(context, *p, step, *call, drv, stream); e != Error::Ok) return e;
      p->kernels.push_back(std::move(call));
      p->engines.emplace_back();
    }
  }
  for (const auto* list : {&p->info.values, &p->info.bindings})
    for (const auto& b : *list) {
      if (b.is_input || !b.aliases.empty()) continue;
      if (!p->buffers[b.name].reserve(drv, bytes_of(b), error)) return refuse(Error::MemoryAllocationFailed, p->where + ": " + error);
    }
  p->in_buffers.resize(p->inputs.size());
  p->state.resize(p->inputs.size());
  {
    std::lock_guard<std::mutex> lock(settings().mutex);
    p->options = settings().context;
  }
  return static_cast<Handle*>(p.release());
}

Error run_plan(Handle& handle, et::Span<EValue*> args) {
  Plan& p = static_cast<Plan&>(handle);
  const size_t n_in = p.inputs.size(), n_out = p.outputs.size();
  if (args.size() != n_in + n_out)
    return refuse(Error::InvalidProgram, p.where + ": the program passes " + std::to_string(args.size()) +
                                             " values to a delegate of " + std::to_string(n_in + n_out) +
                                             " bindings; the program is damaged: rebuild it");
  for (size_t k = 0; k < n_in; ++k)
    if (Error e = check_arg(p, *p.inputs[k], args[k], true); e != Error::Ok) return e;
  for (size_t o = 0; o < n_out; ++o)
    if (Error e = check_arg(p, *p.outputs[o], args[n_in + o], false); e != Error::Ok) return e;
  std::string error;
  const cuda::Driver* drv = cuda::driver(error);
  if (drv == nullptr) return refuse(Error::NotSupported, p.where + ": " + error);
  cuda::Stream stream = the_stream(drv, error);
  if (stream == nullptr) return refuse(Error::Internal, p.where + ": " + error);
  // State, as an engine's delegate keeps it (backend.cpp's run): an input the program has an output
  // written into (the same memory) lives on the device, shared by every delegate handed it.
  auto [in_place, into] = state_use(args, n_in, p.alias_of);
  std::map<std::string, void*> at;
  std::vector<void*> key;
  for (size_t k = 0; k < n_in; ++k) {
    const Tensor& t = args[k]->toTensor();
    void* address = nullptr;
    if (in_place[k]) {
      if (Error e = state_for(p.state[k], p.where, t, drv, stream, &address); e != Error::Ok) return e;
    } else if (!p.written[k] && (p.state[k] = shared_state(t))) {
      address = reinterpret_cast<void*>(p.state[k]->device.ptr);
    } else {
      if (!p.in_buffers[k].reserve(drv, t.nbytes(), error)) return refuse(Error::MemoryAllocationFailed, p.where + ": " + error);
      cuda::Status s = t.nbytes() ? drv->copy_to_device(p.in_buffers[k].ptr, t.const_data_ptr(), t.nbytes(), stream) : 0;
      if (s != 0) return refuse(Error::Internal, p.where + ": " + cuda::describe("cuMemcpyHtoDAsync", s));
      g_to_device += t.nbytes();
      address = reinterpret_cast<void*>(p.in_buffers[k].ptr);
    }
    at[p.inputs[k]->name] = address;
    key.push_back(address);
  }
  for (auto& [name, buffer] : p.buffers) at[name] = reinterpret_cast<void*>(buffer.ptr);
  if (Error e = run_graph(p, at, std::move(key), drv, stream); e != Error::Ok) return e;
  for (size_t o = 0; o < n_out; ++o) {
    Tensor& t = args[n_in + o]->toTensor();
    int k = p.alias_of[o];
    void* from = at.at(k >= 0 ? p.inputs[k]->name : p.outputs[o]->name);
    if (into[o] >= 0) {  // a new value of state: into its device memory
      cuda::Status s = drv->copy_on_device(reinterpret_cast<cuda::DevicePtr>(at.at(p.inputs[into[o]]->name)),
                                           reinterpret_cast<cuda::DevicePtr>(from), t.nbytes(), stream);
      if (s != 0) return refuse(Error::Internal, p.where + ": " + cuda::describe("cuMemcpyDtoDAsync", s));
      continue;
    }
    if ((k >= 0 && in_place[k]) || t.nbytes() == 0) continue;  // state stays on the device
    cuda::Status s = drv->copy_to_host(t.mutable_data_ptr(), reinterpret_cast<cuda::DevicePtr>(from), t.nbytes(), stream);
    if (s != 0) return refuse(Error::Internal, p.where + ": " + cuda::describe("cuMemcpyDtoHAsync", s));
    g_to_host += t.nbytes();
  }
  cuda::Status s = drv->stream_synchronize(stream);
  return s == 0 ? Error::Ok : refuse(Error::Internal, p.where + ": " + cuda::describe("cuStreamSynchronize", s));
}

}  // namespace pipeline_trt
