// Calls each TensorRT method the delegate uses once, through abi.h, against the layout spy
// (linked in): one "CALL <name>" line on stderr before each, so the test can pair names with slots.
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "../trt/abi.h"

extern "C" void* createInferRuntime_INTERNAL(void*, int32_t) noexcept;

namespace {
using namespace pipeline_trt::abi;

void mark(const char* name) {
  (void)!write(2, "CALL ", 5);
  (void)!write(2, name, strlen(name));
  (void)!write(2, "\n", 1);
}

class Quiet final : public Logger {
 public:
  void log(Severity, const char*) noexcept override {}
};
}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--verified") == 0) {  // the versions the delegate loads
    for (const auto& r : kVerified) std::printf("%d %d\n", r.first, r.last);
    return 0;
  }
  Quiet logger;
  void* rt = createInferRuntime_INTERNAL(&logger, 10601);
  static const char blob[16] = {};
  mark("deserialize_cuda_engine");
  void* e = call<runtime_slot::kDeserializeCudaEngine, void*>(rt, static_cast<const void*>(blob), sizeof blob);
  mark("num_optimization_profiles");
  call<engine_slot::kNbOptimizationProfiles, int32_t>(e);
  mark("engine.get_tensor_shape");
  call_dims<engine_slot::kTensorShape>(e, "x");
  mark("get_tensor_dtype");
  call<engine_slot::kTensorDataType, DataType>(e, "x");
  mark("get_tensor_mode");
  call<engine_slot::kTensorIOMode, IOMode>(e, "x");
  mark("get_tensor_profile_shape");
  call_dims<engine_slot::kProfileShape>(e, "x", int32_t{0}, ProfileSelector::kMin);
  mark("num_io_tensors");
  call<engine_slot::kNbIOTensors, int32_t>(e);
  mark("get_tensor_name");
  call<engine_slot::kIOTensorName, const char*>(e, int32_t{0});
  mark("create_runtime_config");
  void* rc = call<engine_slot::kCreateRuntimeConfig, void*>(e);
  mark("kernel_specialization=");
  call<config_slot::kSetKernelSpecialization, void>(rc, KernelSpecialization::kEager);
  mark("cuda_graph_strategy=");
  call<config_slot::kSetCudaGraphStrategy, bool>(rc, CudaGraphStrategy::kWholeGraphCapture);
  mark("create_execution_context(rc)");
  void* c = call<engine_slot::kCreateContextWithConfig, void*>(e, rc);
  mark("all_binding_shapes_specified");
  call<context_slot::kAllInputDimensionsSpecified, bool>(c);
  mark("set_optimization_profile_async");
  call<context_slot::kSetOptimizationProfileAsync, bool>(c, int32_t{0}, static_cast<void*>(nullptr));
  Dims d{};
  mark("set_input_shape");
  call<context_slot::kSetInputShape, bool>(c, "x", static_cast<const Dims*>(&d));
  mark("context.get_tensor_shape");
  call_dims<context_slot::kTensorShape>(c, "x");
  mark("set_tensor_address");
  call<context_slot::kSetTensorAddress, bool>(c, "x", static_cast<void*>(nullptr));
  mark("execute_async_v3");
  call<context_slot::kEnqueueV3, bool>(c, static_cast<void*>(nullptr));
  mark("end");
  return 0;
}
