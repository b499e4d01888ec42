#include "cuda_driver.h"

#include <dlfcn.h>

#include <mutex>

namespace pipeline_trt {
namespace cuda {
namespace {

Driver g_driver;
Context g_context = nullptr;
std::string g_error;  // why the driver is not usable (set once)

template <typename Fn>
bool bind(void* lib, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
  if (fn == nullptr) g_error = std::string("the CUDA driver (libcuda.so.1) lacks ") + name + "; update the NVIDIA driver";
  return fn != nullptr;
}

bool load() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) {
    g_error = "this machine has no CUDA driver (libcuda.so.1 does not load); TensorRT programs run on an NVIDIA GPU";
    return false;
  }
  Driver d;
  if (!(bind(lib, "cuInit", d.init) && bind(lib, "cuDeviceGet", d.device_get) &&
        bind(lib, "cuDeviceGetCount", d.device_get_count) &&
        bind(lib, "cuDeviceGetAttribute", d.device_get_attribute) &&
        bind(lib, "cuDevicePrimaryCtxRetain", d.primary_context_retain) &&
        bind(lib, "cuCtxSetCurrent", d.context_set_current) && bind(lib, "cuMemAlloc_v2", d.mem_alloc) &&
        bind(lib, "cuMemFree_v2", d.mem_free) && bind(lib, "cuMemcpyHtoDAsync_v2", d.copy_to_device) &&
        bind(lib, "cuMemcpyDtoHAsync_v2", d.copy_to_host) &&
        bind(lib, "cuMemcpyDtoDAsync_v2", d.copy_on_device) && bind(lib, "cuStreamCreate", d.stream_create) &&
        bind(lib, "cuStreamSynchronize", d.stream_synchronize) && bind(lib, "cuGetErrorString", d.error_string) &&
        bind(lib, "cuStreamBeginCapture_v2", d.begin_capture) && bind(lib, "cuStreamEndCapture", d.end_capture) &&
        bind(lib, "cuGraphInstantiateWithFlags", d.graph_instantiate) && bind(lib, "cuGraphLaunch", d.graph_launch) &&
        bind(lib, "cuGraphDestroy", d.graph_destroy) && bind(lib, "cuGraphExecDestroy", d.graph_exec_destroy) &&
        bind(lib, "cuMemHostRegister_v2", d.host_register) && bind(lib, "cuMemHostUnregister", d.host_unregister) &&
        bind(lib, "cuModuleLoadData", d.module_load) && bind(lib, "cuModuleUnload", d.module_unload) &&
        bind(lib, "cuModuleGetFunction", d.module_function) && bind(lib, "cuLaunchKernel", d.launch_kernel)))
    return false;
  g_driver = d;
  Status s = d.init(0);
  int count = 0;
  if (s == 0) s = d.device_get_count(&count);
  if (s != 0 || count == 0) {
    g_error = "this machine has no CUDA device (" + (s != 0 ? describe("cuInit", s) : std::string("none found")) +
              "); TensorRT programs run on an NVIDIA GPU";
    return false;
  }
  int device = 0;
  if ((s = d.device_get(&device, 0)) != 0 || (s = d.primary_context_retain(&g_context, device)) != 0) {
    g_error = describe("cuDevicePrimaryCtxRetain", s);
    return false;
  }
  return true;
}

}  // namespace

std::string describe(const char* call, Status status) {
  const char* text = nullptr;
  if (g_driver.error_string == nullptr || g_driver.error_string(status, &text) != 0 || text == nullptr)
    text = "unknown CUDA error";
  return std::string(call) + " failed: " + text + " (" + std::to_string(status) + ")";
}

const Driver* driver(std::string& error) {
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [] { ok = load(); });
  if (!ok) {
    error = g_error;
    return nullptr;
  }
  return make_current(error) ? &g_driver : nullptr;
}

bool make_current(std::string& error) {
  thread_local Context current = nullptr;
  if (current == g_context) return true;
  Status s = g_driver.context_set_current(g_context);
  if (s != 0) {
    error = describe("cuCtxSetCurrent", s);
    return false;
  }
  current = g_context;
  return true;
}

}  // namespace cuda
}  // namespace pipeline_trt
