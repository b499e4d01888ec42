// The part of the CUDA driver API the delegate calls, declared by this project and bound at run
// time from libcuda.so.1 (the driver every CUDA machine has): the library then builds on machines
// without CUDA and loads on machines without a GPU, where it says so when a program asks for one.
// The `_v2` entry points are the ones the driver's own header maps these names to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pipeline_trt {
namespace cuda {

using Status = int;                 // CUresult: 0 is success
using DevicePtr = unsigned long long;  // CUdeviceptr
using Stream = void*;               // CUstream (cudaStream_t is the same handle)
using Context = void*;              // CUcontext
using Graph = void*;                // CUgraph
using GraphExec = void*;            // CUgraphExec
using Module = void*;               // CUmodule
using Function = void*;             // CUfunction

constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr unsigned kStreamNonBlocking = 1;
constexpr int kCaptureThreadLocal = 1;  // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL

struct Driver {
  Status (*init)(unsigned flags) = nullptr;
  Status (*device_get)(int* device, int ordinal) = nullptr;
  Status (*device_get_count)(int* count) = nullptr;
  Status (*device_get_attribute)(int* value, int attribute, int device) = nullptr;
  Status (*primary_context_retain)(Context* context, int device) = nullptr;
  Status (*context_set_current)(Context context) = nullptr;
  Status (*mem_alloc)(DevicePtr* ptr, size_t bytes) = nullptr;
  Status (*mem_free)(DevicePtr ptr) = nullptr;
  Status (*copy_to_device)(DevicePtr dst, const void* src, size_t bytes, Stream stream) = nullptr;
  Status (*copy_to_host)(void* dst, DevicePtr src, size_t bytes, Stream stream) = nullptr;
  Status (*copy_on_device)(DevicePtr dst, DevicePtr src, size_t bytes, Stream stream) = nullptr;
  Status (*stream_create)(Stream* stream, unsigned flags) = nullptr;
  Status (*stream_synchronize)(Stream stream) = nullptr;
  Status (*error_string)(Status status, const char** text) = nullptr;
  Status (*begin_capture)(Stream stream, int mode) = nullptr;
  Status (*end_capture)(Stream stream, Graph* graph) = nullptr;
  Status (*graph_instantiate)(GraphExec* exec, Graph graph, unsigned long long flags) = nullptr;
  Status (*graph_launch)(GraphExec exec, Stream stream) = nullptr;
  Status (*graph_destroy)(Graph graph) = nullptr;
  Status (*graph_exec_destroy)(GraphExec exec) = nullptr;
  Status (*host_register)(void* ptr, size_t bytes, unsigned flags) = nullptr;
  Status (*host_unregister)(void* ptr) = nullptr;
  Status (*module_load)(Module* module, const void* image) = nullptr;  // PTX, NUL-terminated: JIT-compiled here
  Status (*module_unload)(Module module) = nullptr;
  Status (*module_function)(Function* function, Module module, const char* name) = nullptr;
  Status (*launch_kernel)(Function f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                          unsigned block_y, unsigned block_z, unsigned shared_bytes, Stream stream, void** params,
                          void** extra) = nullptr;
};

// The driver, loaded and initialized once with device 0's primary context (the one the CUDA
// runtime, PyTorch and TensorRT use) made current on the calling thread; nullptr with `error` set
// when this machine has no usable CUDA driver or device.
const Driver* driver(std::string& error);

// Make the primary context current on this thread (each thread that calls the driver needs it).
bool make_current(std::string& error);

// "<call> failed: <the driver's text>".
std::string describe(const char* call, Status status);

}  // namespace cuda
}  // namespace pipeline_trt
