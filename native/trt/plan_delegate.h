// A TensorRT delegate that is a plan (pipeline/delegate/plan.py): engines and the project's kernels
// (their PTX, loaded by the CUDA driver) run in turn on the one stream, the values between them in
// device memory the delegate keeps; state stays on the device as an engine delegate keeps it.
#pragma once

#include <executorch/runtime/backend/interface.h>

#include <cstdint>
#include <string>

#include "delegate.h"

namespace pipeline_trt {

// An engine's delegate made ready from its decoded blob (backend.cpp).
Error init_engine(::executorch::runtime::BackendInitContext& context, Delegate& d);

// The plan delegate of a TP01 blob: every engine deserialized, every kernel loaded and its weights on
// the device; a refusal (one logged line) where any of it cannot be.
::executorch::runtime::Result<Handle*> init_plan(::executorch::runtime::BackendInitContext& context,
                                                 const uint8_t* blob, size_t size, const std::string& method);

// Run a plan delegate (`handle` made by init_plan) on ExecuTorch's values.
Error run_plan(Handle& handle, ::executorch::runtime::Span<EValue*> args);

}  // namespace pipeline_trt
