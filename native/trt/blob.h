// The TensorRT delegate blob, read natively: the same contract pipeline/tensorrt/blob.py writes
// and reads (that module's docstring is its definition). Every bound is checked before use; a
// blob that breaks one is refused with one line naming the rule.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pipeline_trt {

struct Binding {
  std::string name;
  std::string dtype;           // a name of pipeline.dtypes
  std::vector<int64_t> shape;  // -1: dynamic
  bool is_input = false;
  std::vector<int64_t> min_shape, max_shape;  // dynamic inputs: the first profile's bounds
  std::string aliases;                        // outputs written in place: the input they update
  std::string layout;                         // "channels_last" (N, H, W, C memory; engines only) or ""
};

struct BlobInfo {
  std::vector<Binding> bindings;  // inputs in delegate-argument order, then outputs
  bool has_tf32_override = false;
  std::string tf32_override;  // NVIDIA_TF32_OVERRIDE where a TensorRT-RTX engine was built
  std::string engine_sha256;
  std::string engine_key;        // TR03: the named-data key of the engine
  const uint8_t* inline_engine = nullptr;  // TR01/TR02: the engine inside the blob
  uint64_t engine_size = 0;
};

// Decode `size` bytes at `data`; on failure returns false with `error` set. An inline engine is
// checked against its digest here; a named one when it is fetched.
bool decode_blob(const uint8_t* data, size_t size, BlobInfo& out, std::string& error);

// ---- the plan blob (pipeline/delegate/plan.py: engines and the project's kernels in turn) --------
struct DataEntry {
  std::string key, sha256;  // key empty: none (a kernel without scales or bias)
  uint64_t size = 0;
};
struct PlanStep {
  bool is_engine = false;
  bool is_attention = false;                // "decode_attention": q, k, v (mask) -> o, workspace
  BlobInfo engine;                          // engine steps: the TR03 metadata of the engine
  std::string kernel;                       // kernel steps: the PTX entry
  DataEntry module, weight, scales, bias;   // kernel steps: named data
  int64_t n = 0, k = 0, group = 0, grid = 0, block = 0;
  uint32_t scale_bits = 0;                  // attention steps: the scale's float32 bits
  std::vector<std::string> inputs, outputs;  // value names (engine: per binding, in its order)
};
struct PlanInfo {
  std::vector<Binding> bindings;  // the delegate's inputs ("input_<i>"), then outputs ("output_<j>")
  std::vector<Binding> values;    // the device buffers between steps
  std::vector<PlanStep> steps;
};

// An attention step's sizes, read from its values as pipeline/kernels/decode_attention.py's `sizes` reads
// them: q [batch, heads, tokens, dim], k and v [batch, kv_heads, positions, dim], mask [mask_batch, 1,
// tokens, positions] (mask_batch 0: none); its launch: `chunks` blocks of kAttentionThreads a K/V head.
struct AttentionSizes {
  int batch = 0, heads = 0, kv_heads = 0, tokens = 0, positions = 0, dim = 0, mask_batch = 0;
  int chunks = 0;
  uint64_t workspace = 0;  // float32 values the kernels write
};
constexpr int kAttentionChunk = 64, kAttentionThreads = 128;  // decode_attention.cu's kChunk, kAttnThreads
// The sizes of an attention over these values (mask may be null), dtypes included; false where its
// kernels do not take them.
bool attention_sizes(const Binding& q, const Binding& k, const Binding& v, const Binding* mask, const Binding& o,
                     const Binding& workspace, AttentionSizes& out);

// Whether the blob is a plan (magic "TP01").
bool is_plan_blob(const uint8_t* data, size_t size);
// Decode and check a plan blob as plan.py's `decode` does; false with `error` set.
bool decode_plan(const uint8_t* data, size_t size, PlanInfo& out, std::string& error);

// Untrusted text (a name from a blob or file) as one log line may show it: printable ASCII, others
// as \xNN, 64 characters at most.
std::string shown(const std::string& text);

// The element size of a dtype name of the blob contract (0: not one).
size_t dtype_size(const std::string& name);
// Its ExecuTorch ScalarType number (-1: not one).
int dtype_scalar_type(const std::string& name);
// The dtype name of an ExecuTorch ScalarType number ("scalar type N" for one the contract lacks).
std::string dtype_of_scalar_type(int scalar_type);
// The dtypes the contract knows, "name:size:scalar_type" comma-separated (held against
// pipeline.dtypes and ExecuTorch's ScalarType by a test).
std::string dtype_names();

}  // namespace pipeline_trt
