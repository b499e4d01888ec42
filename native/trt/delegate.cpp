#include "delegate.h"

#include <executorch/runtime/platform/log.h>

#include <algorithm>
#include <cstdlib>

namespace pipeline_trt {

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

StateRegistry& states() {
  static StateRegistry* r = new StateRegistry;
  return *r;
}

bool scalar_type_is(const Tensor& t, const Binding& b) {
  return static_cast<int>(t.scalar_type()) == dtype_scalar_type(b.dtype);
}

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
  return state_for(d.state[k], d.where, t, drv, stream, out);
}

Error state_for(std::shared_ptr<State>& mine, const std::string& where, const Tensor& t, const cuda::Driver* drv,
                cuda::Stream stream, void** out) {
  const void* host = t.const_data_ptr();
  const size_t bytes = t.nbytes();
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
      if (!found->device.reserve(drv, bytes, error)) return refuse(Error::MemoryAllocationFailed, where + ": " + error);
      found->bytes = bytes;
      cuda::Status s = drv->copy_to_device(found->device.ptr, host, bytes, stream);
      if (s != 0) return refuse(Error::Internal, where + ": " + cuda::describe("cuMemcpyHtoDAsync", s));
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
static bool capture(Delegate& d, const cuda::Driver* drv, cuda::Stream stream) {
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
std::vector<int> alias_positions(const std::vector<const Binding*>& inputs, const std::vector<const Binding*>& outputs) {
  std::vector<int> out;
  for (const Binding* b : outputs) {
    int k = -1;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (!b->aliases.empty() && inputs[i]->name == b->aliases) k = static_cast<int>(i);
    out.push_back(k);
  }
  return out;
}

StateUse state_use(::executorch::runtime::Span<EValue*> args, size_t n_in, const std::vector<int>& alias_of) {
  const size_t n_out = alias_of.size();
  StateUse use{std::vector<bool>(n_in, false), std::vector<int>(n_out, -1)};
  for (size_t o = 0; o < n_out; ++o) {
    const Tensor& out = args[n_in + o]->toTensor();
    auto is_input = [&](size_t k) {
      const Tensor& in = args[k]->toTensor();
      return out.const_data_ptr() == in.const_data_ptr() && out.nbytes() == in.nbytes() && out.nbytes() > 0;
    };
    if (int k = alias_of[o]; k >= 0) {
      use.in_place[k] = use.in_place[k] || is_input(k);
      continue;
    }
    for (size_t k = 0; k < n_in && use.into[o] < 0; ++k)
      if (is_input(k)) use.into[o] = static_cast<int>(k), use.in_place[k] = true;
  }
  return use;
}

}  // namespace pipeline_trt
