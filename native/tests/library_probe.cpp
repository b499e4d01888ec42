// Drives the real TensorRT library (argv[1]) through abi.h on a machine without a GPU: creates a
// runtime with our logger, hands it bytes that are not an engine, and prints what TensorRT logged
// ("LOG <severity> <message>") and what it returned, then destroys the runtime.
#include <dlfcn.h>

#include <cstdio>

#include "../trt/abi.h"

namespace {
using namespace pipeline_trt::abi;

class Printer final : public Logger {
 public:
  void log(Severity severity, const char* message) noexcept override {
    std::fprintf(stderr, "LOG %d %s\n", static_cast<int>(severity), message);
  }
};
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "dlopen: %s\n", dlerror());
    return 3;
  }
  auto create = reinterpret_cast<CreateRuntimeFn>(dlsym(lib, kCreateRuntimeSymbol));
  auto version = reinterpret_cast<LibVersionFn>(dlsym(lib, kLibVersionSymbol));
  if (create == nullptr || version == nullptr) return 4;
  Printer logger;
  void* runtime = create(&logger, version());
  std::printf("version %d runtime %d\n", version(), runtime != nullptr);
  if (runtime == nullptr) return 5;
  static const char junk[64] = "these bytes are not a TensorRT engine";
  void* engine = call<runtime_slot::kDeserializeCudaEngine, void*>(runtime, static_cast<const void*>(junk), sizeof junk);
  std::printf("engine %d\n", engine != nullptr);
  destroy(runtime);
  std::printf("destroyed\n");
  return 0;
}
