// pipeline-runner: runs a program with ExecuTorch's C++ runtime and the native TensorRT delegate,
// no Python anywhere.
//
//   pipeline-runner run PROGRAM.pte [--ptd DATA.ptd] --method NAME [--input X.npy ...]
//                   [--output-dir DIR] [--repeat N] [--cuda-graph | --method-graph] [--kernels lazy|eager|none]
//   pipeline-runner generate PROGRAM.pte [--ptd DATA.ptd] --prompt "1 5 9" [--max-new-tokens N]
//                   [--prefill prefill] [--decode decode] [--cuda-graph | --method-graph] [--kernels lazy|eager|none]
//                   [--encoder NAME --input X.npy ...]
//
// --cuda-graph: TensorRT-RTX's own whole-graph capture. --method-graph: each engine call captured as
// one CUDA graph once a call repeats the last one's shapes, replayed while they hold (a decode step
// is then one launch; kernels compiled eagerly).
// --kernels: when TensorRT-RTX compiles kernels specialized to each new input shape: in the
// background, running generic kernels until they are ready (lazy, the default); in the first call
// with that shape (eager: steady calls are fastest from then on); never (none).
// `run` writes output_<i>.npy per output and prints one line per output; with --repeat, the median
// milliseconds of N calls. `generate` prints the new token ids greedily chosen, then the first two
// decode steps' milliseconds, the steady decode speed after them and the bytes the delegate copied per
// steady step. With --encoder, that method runs first on the --input files (a multimodal program's
// vision_encoder or audio_encoder: one image or window into the state's slot the inputs name), and
// the prompt must hold the program's placeholder token once per row it wrote. The methods share the program's
// planned memory, so what prefill writes in the state decode reads; the delegate keeps that state on
// the device. Inputs are checked against the program record (dtype, dims, values) before any run.
// Every refusal is one line on stderr and exit status 1.
#include <executorch/extension/data_loader/mmap_data_loader.h>
#include <executorch/extension/flat_tensor/flat_tensor_data_map.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/core/portable_type/tensor_impl.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../trt/blob.h"
#include "npy.h"
#include "record.h"

extern "C" {
const char* pipeline_trt_last_error();
int pipeline_trt_set_cuda_graph(int mode);
int pipeline_trt_set_kernel_specialization(int strategy);
unsigned long long pipeline_trt_bytes_to_device();
unsigned long long pipeline_trt_bytes_to_host();
int pipeline_trt_pin_host(void* ptr, size_t bytes);
void pipeline_trt_unpin_host(void* ptr);
}

namespace {

namespace et = ::executorch::runtime;
using executorch::extension::FlatTensorDataMap;
using executorch::extension::MallocMemoryAllocator;
using executorch::extension::MmapDataLoader;
using pipeline_runner::Array;

struct Refusal {
  std::string line;
};

[[noreturn]] void refuse(const std::string& line) { throw Refusal{line}; }

std::string hex(et::Error e) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%x", static_cast<unsigned>(e));
  return buf;
}

// The delegate's line when it refused, else ExecuTorch's error code.
std::string why(et::Error e) {
  const char* line = pipeline_trt_last_error();
  return line && *line ? std::string(line) : "ExecuTorch error " + hex(e) + " (see the log above)";
}

// ---- the program --------------------------------------------------------------------------------
class Runner {
 public:
  Runner(const std::string& pte, const std::optional<std::string>& ptd) : where_(pte) {
    std::string error;
    if (!pipeline_runner::regular_file(pte, error) || (ptd && !pipeline_runner::regular_file(*ptd, error))) refuse(error);
    auto loader = MmapDataLoader::from(pte.c_str());
    if (!loader.ok()) refuse(pte + ": cannot open it (error " + hex(loader.error()) + ")");
    pte_loader_.emplace(std::move(loader.get()));
    auto program = et::Program::load(&*pte_loader_, et::Program::Verification::InternalConsistency);
    if (!program.ok()) refuse(pte + ": not a program ExecuTorch loads (error " + hex(program.error()) + "); rebuild it");
    program_.emplace(std::move(program.get()));
    if (ptd) {
      auto data_loader = MmapDataLoader::from(ptd->c_str());
      if (!data_loader.ok()) refuse(*ptd + ": cannot open it (error " + hex(data_loader.error()) + ")");
      ptd_loader_.emplace(std::move(data_loader.get()));
      auto map = FlatTensorDataMap::load(&*ptd_loader_);
      if (!map.ok()) refuse(*ptd + ": not a .ptd ExecuTorch reads (error " + hex(map.error()) + "); use the one written with the program");
      data_map_.emplace(std::move(map.get()));
    }
    // One arena per memory id for every method, so that state planned there is shared by them.
    for (size_t m = 0; m < program_->num_methods(); ++m) {
      const char* name = program_->get_method_name(m).get();
      auto meta = program_->method_meta(name);
      if (!meta.ok()) continue;
      for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
        size_t size = static_cast<size_t>(meta->memory_planned_buffer_size(i).get());
        if (arenas_.size() <= i) arenas_.resize(i + 1);
        if (arenas_[i].size() < size) arenas_[i].resize(size);
      }
    }
    for (auto& a : arenas_) {
      spans_.emplace_back(a.data(), a.size());
      // Page-locked where the driver allows: the delegate's copies of inputs and outputs then go
      // straight to and from the device (a decode step's logits each step); else they stay pageable.
      if (pipeline_trt_pin_host(a.data(), a.size()) == 0) pinned_.push_back(a.data());
    }
    read_record();
  }
  ~Runner() {
    methods_.clear();
    for (void* p : pinned_) pipeline_trt_unpin_host(p);
  }
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  et::Method& method(const std::string& name) {
    auto found = methods_.find(name);
    if (found != methods_.end()) return *found->second->method;
    auto meta = program_->method_meta(name.c_str());
    if (!meta.ok()) refuse(where_ + " has no method '" + name + "'");
    auto slot = std::make_unique<Loaded>();
    slot->spans.assign(spans_.begin(), spans_.begin() + static_cast<long>(meta->num_memory_planned_buffers()));
    slot->planned.emplace(et::Span<et::Span<uint8_t>>(slot->spans.data(), slot->spans.size()));
    slot->memory.emplace(&slot->method_allocator, &*slot->planned, &slot->temp_allocator);
    auto loaded = program_->load_method(name.c_str(), &*slot->memory, nullptr, data_map_ ? &*data_map_ : nullptr);
    if (!loaded.ok()) refuse("method '" + name + "' does not load: " + why(loaded.error()));
    slot->method.emplace(std::move(loaded.get()));
    et::Method& m = *slot->method;
    methods_.emplace(name, std::move(slot));
    return m;
  }

  // Outputs of `name` on `inputs`, after the record's checks.
  std::vector<Array> call(const std::string& name, const std::vector<Array>& inputs) {
    et::Method& m = call_in_place(name, inputs);
    std::vector<Array> outs;
    for (size_t i = 0; i < m.outputs_size(); ++i) outs.push_back(to_array(m.get_output(i), name, i));
    return outs;
  }

  // Run `name` on `inputs` (after the record's checks); its outputs stay where the method wrote them,
  // valid until its next call.
  et::Method& call_in_place(const std::string& name, const std::vector<Array>& inputs) {
    check(name, inputs);
    et::Method& m = method(name);
    execute(m, name, inputs);
    return m;
  }

  void check(const std::string& name, const std::vector<Array>& inputs) {
    auto specs = specs_.find(name);
    std::string error;
    if (specs != specs_.end() && !pipeline_runner::check_inputs(name, specs->second, inputs, error)) refuse(error);
  }

  void execute(et::Method& m, const std::string& name, const std::vector<Array>& inputs) {
    if (inputs.size() != m.inputs_size())
      refuse("method '" + name + "' takes " + std::to_string(m.inputs_size()) + " inputs, got " + std::to_string(inputs.size()));
    std::vector<std::unique_ptr<Held>> held;
    for (size_t i = 0; i < inputs.size(); ++i) {
      held.push_back(std::make_unique<Held>(inputs[i]));
      et::Error e = m.set_input(et::EValue(executorch::aten::Tensor(&held.back()->impl)), i);
      if (e != et::Error::Ok)
        refuse("method '" + name + "' input " + std::to_string(i) + " is refused by ExecuTorch (error " + hex(e) +
               "): its dtype or shape is not the program's");
    }
    et::Error e = m.execute();
    if (e != et::Error::Ok) refuse("method '" + name + "' failed: " + why(e));
  }

  // The most bytes input `i` of `name` can hold (the .npy header's room included): no input file
  // larger is read.
  uint64_t input_limit(const std::string& name, size_t i) {
    auto meta = program_->method_meta(name.c_str());
    if (!meta.ok()) refuse(where_ + " has no method '" + name + "'");
    if (i >= meta->num_inputs())
      refuse("method '" + name + "' takes " + std::to_string(meta->num_inputs()) + " inputs, got more");
    auto tensor = meta->input_tensor_meta(i);
    return tensor.ok() ? tensor->nbytes() + (1 << 16) + 12 : 0;
  }

  bool has_constant(const std::string& name) {
    return program_->method_meta(name.c_str()).ok();
  }

  int64_t constant_int(const std::string& name) {
    et::Method& m = method(name);
    if (m.execute() != et::Error::Ok || m.outputs_size() != 1 || !m.get_output(0).isInt())
      refuse(where_ + ": constant method '" + name + "' is not an integer");
    return m.get_output(0).toInt();
  }

 private:
  struct Loaded {
    MallocMemoryAllocator method_allocator, temp_allocator;
    std::vector<et::Span<uint8_t>> spans;
    std::optional<et::HierarchicalAllocator> planned;
    std::optional<et::MemoryManager> memory;
    std::optional<et::Method> method;
  };
  // An input's tensor: sizes, dim order and strides for ExecuTorch's TensorImpl over the array's own
  // data (set_input copies it into the program's planned memory and never writes it).
  struct Held {
    explicit Held(const Array& a)
        : sizes(a.shape.begin(), a.shape.end()),
          order(a.shape.size()),
          strides(a.shape.size()),
          impl(static_cast<executorch::aten::ScalarType>(pipeline_trt::dtype_scalar_type(a.dtype)),
               static_cast<ssize_t>(sizes.size()), sizes.data(), const_cast<uint8_t*>(a.data.data()), fill_order(),
               fill_strides()) {}
    executorch::aten::DimOrderType* fill_order() {
      for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<executorch::aten::DimOrderType>(i);
      return order.data();
    }
    executorch::aten::StridesType* fill_strides() {
      executorch::aten::StridesType s = 1;
      for (size_t i = strides.size(); i-- > 0;) {
        strides[i] = s;
        s *= sizes[i];
      }
      return strides.data();
    }
    std::vector<executorch::aten::SizesType> sizes;
    std::vector<executorch::aten::DimOrderType> order;
    std::vector<executorch::aten::StridesType> strides;
    executorch::runtime::etensor::TensorImpl impl;
  };

  Array to_array(const et::EValue& v, const std::string& name, size_t i) {
    if (!v.isTensor()) refuse("method '" + name + "' output " + std::to_string(i) + " is not a tensor; run it from Python");
    const auto& t = v.toTensor();
    Array a;
    a.dtype = pipeline_trt::dtype_of_scalar_type(static_cast<int>(t.scalar_type()));
    a.shape.assign(t.sizes().begin(), t.sizes().end());
    const auto* p = static_cast<const uint8_t*>(t.const_data_ptr());
    a.data.assign(p, p + t.nbytes());
    return a;
  }

  void read_record() {
    auto meta = program_->method_meta("pipeline_record");
    if (!meta.ok()) return;  // a program from elsewhere: the delegate's checks only
    et::Method& m = method("pipeline_record");
    if (m.execute() != et::Error::Ok || m.outputs_size() != 1 || !m.get_output(0).isString())
      refuse(where_ + ": its program record does not run; rebuild it");
    auto text = m.get_output(0).toString();
    std::string error;
    if (!pipeline_runner::parse_record(std::string(text.data(), text.size()), specs_, error)) refuse(where_ + ": " + error);
  }

  std::string where_;
  std::optional<MmapDataLoader> pte_loader_, ptd_loader_;
  std::optional<et::Program> program_;
  std::optional<FlatTensorDataMap> data_map_;
  std::vector<std::vector<uint8_t>> arenas_;
  std::vector<et::Span<uint8_t>> spans_;
  std::vector<void*> pinned_;
  std::map<std::string, std::unique_ptr<Loaded>> methods_;
  std::map<std::string, std::vector<pipeline_runner::Spec>> specs_;
};

// ---- commands -----------------------------------------------------------------------------------
struct Args {
  std::string command, pte, method = "forward", output_dir = ".", prompt, prefill = "prefill", decode = "decode", encoder;
  std::optional<std::string> ptd;
  std::vector<std::string> inputs;
  int repeat = 0, max_new_tokens = 16;
  int graphs = 0;   // pipeline_trt_set_cuda_graph's mode
  int kernels = 0;  // pipeline_trt_set_kernel_specialization's strategy
};

const char* const kUsage =
    "usage: pipeline-runner run PROGRAM.pte [--ptd DATA.ptd] --method NAME [--input X.npy ...] [--output-dir DIR] "
    "[--repeat N] [--cuda-graph | --method-graph] [--kernels lazy|eager|none]\n"
    "       pipeline-runner generate PROGRAM.pte [--ptd DATA.ptd] --prompt \"1 5 9\" [--max-new-tokens N] "
    "[--prefill NAME] [--decode NAME] [--cuda-graph | --method-graph] [--kernels lazy|eager|none] "
    "[--encoder NAME --input X.npy ...]";
const char* const kKernels[] = {"lazy", "eager", "none"};

int to_int(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 1 || v > 1000000) refuse(flag + " takes a positive integer, got '" + text + "'");
  return static_cast<int>(v);
}

Args parse(int argc, char** argv) {
  if (argc < 3) refuse(kUsage);
  Args a;
  a.command = argv[1];
  a.pte = argv[2];
  if (a.command != "run" && a.command != "generate") refuse(kUsage);
  for (int i = 3; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--cuda-graph" || flag == "--method-graph") {
      int mode = flag == "--cuda-graph" ? 1 : 2;
      if (a.graphs != 0 && a.graphs != mode) refuse("--cuda-graph and --method-graph exclude each other: pass one");
      a.graphs = mode;
      continue;
    }
    if (i + 1 >= argc) refuse(flag + " needs a value\n" + kUsage);
    std::string value = argv[++i];
    if (flag == "--ptd") a.ptd = value;
    else if (flag == "--method") a.method = value;
    else if (flag == "--input") a.inputs.push_back(value);
    else if (flag == "--output-dir") a.output_dir = value;
    else if (flag == "--repeat") a.repeat = to_int(flag, value);
    else if (flag == "--prompt") a.prompt = value;
    else if (flag == "--max-new-tokens") a.max_new_tokens = to_int(flag, value);
    else if (flag == "--prefill") a.prefill = value;
    else if (flag == "--decode") a.decode = value;
    else if (flag == "--encoder") a.encoder = value;
    else if (flag == "--kernels") {
      auto found = std::find(std::begin(kKernels), std::end(kKernels), value);
      if (found == std::end(kKernels)) refuse("--kernels takes lazy, eager or none, got '" + value + "'");
      a.kernels = static_cast<int>(found - std::begin(kKernels));
    }
    else refuse("unknown option " + flag + "\n" + kUsage);
  }
  return a;
}

std::vector<Array> read_inputs(Runner& runner, const std::string& method, const std::vector<std::string>& files);

int run(Runner& runner, const Args& a) {
  std::vector<Array> inputs = read_inputs(runner, a.method, a.inputs);
  std::string error;
  std::vector<Array> outs = runner.call(a.method, inputs);
  for (size_t i = 0; i < outs.size(); ++i) {
    std::string path = a.output_dir + "/output_" + std::to_string(i) + ".npy";
    if (!pipeline_runner::write_npy(path, outs[i], error)) refuse(error);
    std::printf("output %zu: %s %s -> %s\n", i, outs[i].dtype.c_str(), [&] {
      std::string s = "[";
      for (size_t d = 0; d < outs[i].shape.size(); ++d) s += (d ? "," : "") + std::to_string(outs[i].shape[d]);
      return s + "]";
    }().c_str(), path.c_str());
  }
  if (a.repeat > 0) {
    et::Method& m = runner.method(a.method);
    std::vector<double> ms;
    for (int r = 0; r < a.repeat; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      runner.execute(m, a.method, inputs);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("median %.4f ms over %d calls (inputs copied in and outputs out each call)\n", ms[ms.size() / 2], a.repeat);
  }
  return 0;
}

// A 16-bit float's bits (float16 or bfloat16: sign, then magnitude) as an integer ordered as the
// values are, -0 as +0; a NaN (magnitude above `inf`) lowest, so it never wins. Branch-free 16-bit
// arithmetic, so the loops over it run as vector instructions.
inline int16_t half_key(uint16_t bits, int16_t inf) {
  const auto h = static_cast<int16_t>(bits);
  const auto magnitude = static_cast<int16_t>(h & 0x7fff), sign = static_cast<int16_t>(h >> 15);
  return magnitude > inf ? INT16_MIN : static_cast<int16_t>((magnitude ^ sign) - sign);
}
inline float float_key(float x) { return x != x ? -INFINITY : x; }  // a NaN never wins

template <typename T, typename Key>
auto block_max(const T* p, int64_t n, Key key) {
  auto top = key(p[0]);
#pragma omp simd reduction(max : top)
  for (int64_t v = 0; v < n; ++v) top = std::max(top, key(p[v]));
  return top;
}

// The first index of the largest of `n` values as `key` orders them: the maximum block by block
// (vector instructions), then the first match from the block that holds it. 5 us for 32000 float16
// logits where a plain loop took 21 (2-core development machine).
template <typename T, typename Key>
int64_t first_max(const T* p, int64_t n, Key key) {
  constexpr int64_t kBlock = 512;
  auto top = key(p[0]);
  int64_t from = 0;
  for (int64_t b = 0; b < n; b += kBlock)
    if (auto m = block_max(p + b, std::min(kBlock, n - b), key); m > top) top = m, from = b;
  for (int64_t v = from; v < n; ++v)
    if (key(p[v]) == top) return v;
  return 0;
}

// The last position's highest logit (logits [1, T, V], float32 / float16 / bfloat16, read where the
// method wrote them), the first of equal ones; a NaN never wins. This runs every decode step, over
// the whole vocabulary.
int64_t argmax_last(const et::EValue& out) {
  if (!out.isTensor() || out.toTensor().dim() != 3) refuse("the prefill/decode output is not logits [1, T, vocab]");
  const auto& t = out.toTensor();
  const int64_t vocab = t.size(2), row = t.size(1) - 1;
  if (vocab < 1 || row < 0) refuse("the prefill/decode output holds no logits");
  const std::string dtype = pipeline_trt::dtype_of_scalar_type(static_cast<int>(t.scalar_type()));
  const auto* base = static_cast<const uint8_t*>(t.const_data_ptr());
  if (dtype == "float32") {
    const auto* p = reinterpret_cast<const float*>(base) + row * vocab;
    return first_max(p, vocab, float_key);
  }
  if (dtype != "float16" && dtype != "bfloat16")
    refuse("the logits are " + dtype + "; generate reads float32, float16 or bfloat16");
  const int16_t inf = dtype == "float16" ? 0x7c00 : 0x7f80;
  const auto* p = reinterpret_cast<const uint16_t*>(base) + row * vocab;
  return first_max(p, vocab, [inf](uint16_t h) { return half_key(h, inf); });
}

Array ints(const std::vector<int64_t>& values, std::vector<int64_t> shape) {
  Array a;
  a.dtype = "int64";
  a.shape = std::move(shape);
  a.data.resize(values.size() * 8);
  std::memcpy(a.data.data(), values.data(), a.data.size());
  return a;
}

std::vector<Array> read_inputs(Runner& runner, const std::string& method, const std::vector<std::string>& files) {
  std::vector<Array> inputs(files.size());
  std::string error;
  for (size_t i = 0; i < files.size(); ++i)
    if (!pipeline_runner::read_npy(files[i], inputs[i], error, runner.input_limit(method, i))) refuse(error);
  return inputs;
}

// A multimodal program's prompt holds its placeholder token once per row the encoder writes: as many
// as one item's rows with --encoder, none without (checked before any method runs).
void check_placeholders(Runner& runner, const Args& a, const std::vector<int64_t>& prompt) {
  if (!runner.has_constant("placeholder_token_id")) {
    if (!a.encoder.empty()) refuse("--encoder runs a multimodal program's encoder; this program has none");
    return;
  }
  const int64_t placeholder = runner.constant_int("placeholder_token_id");
  const int64_t want = a.encoder.empty() ? 0 : runner.constant_int("media_rows");
  const auto found = std::count(prompt.begin(), prompt.end(), placeholder);
  if (found != want)
    refuse("the prompt holds " + std::to_string(found) + " placeholder tokens (id " + std::to_string(placeholder) +
           "); " + (a.encoder.empty() ? std::string("without --encoder it holds none")
                                      : "the item --encoder reads stands for " + std::to_string(want)) +
           ": make the prompt with the model's processor");
}

void run_encoder(Runner& runner, const Args& a) { runner.call(a.encoder, read_inputs(runner, a.encoder, a.inputs)); }

int generate(Runner& runner, const Args& a) {
  std::vector<int64_t> prompt;
  std::stringstream words(a.prompt);
  std::string w;
  while (words >> w) {
    if (w.find_first_not_of("0123456789") != std::string::npos || w.size() > 18)
      refuse("--prompt must be token ids in ASCII digits separated by spaces, e.g. \"1 5 9\"; got '" + a.prompt + "'");
    prompt.push_back(std::stoll(w));
  }
  if (prompt.empty()) refuse("--prompt must hold at least one token id");
  const int64_t room = runner.constant_int("max_cache_len");
  const int64_t need = static_cast<int64_t>(prompt.size()) + a.max_new_tokens - 1;
  if (need > room)
    refuse("a prompt of " + std::to_string(prompt.size()) + " tokens and " + std::to_string(a.max_new_tokens) +
           " new ones need " + std::to_string(need) + " cache positions; the program's cache holds " +
           std::to_string(room) + " (shorten the prompt or generate fewer)");
  check_placeholders(runner, a, prompt);
  if (!a.encoder.empty()) run_encoder(runner, a);
  int64_t position = static_cast<int64_t>(prompt.size());
  int64_t token = argmax_last(runner.call_in_place(a.prefill, {ints(prompt, {1, position}), ints({0}, {1})}).get_output(0));
  std::printf("%lld", static_cast<long long>(token));
  std::fflush(stdout);
  // The first decode step makes its execution context and kernels, the second captures its graph
  // (--method-graph): both timed apart from the steady state.
  constexpr int kWarm = 2;
  using Clock = std::chrono::steady_clock;
  double warm_ms = 0;
  unsigned long long to_device = 0, to_host = 0;
  Clock::time_point t0;
  int steps = 0;
  for (int i = 1; i < a.max_new_tokens; ++i, ++position) {
    auto begin = Clock::now();
    if (i == kWarm + 1) {
      to_device = pipeline_trt_bytes_to_device(), to_host = pipeline_trt_bytes_to_host();
      t0 = begin;
    }
    token = argmax_last(runner.call_in_place(a.decode, {ints({token}, {1, 1}), ints({position}, {1})}).get_output(0));
    if (i <= kWarm) warm_ms += std::chrono::duration<double, std::milli>(Clock::now() - begin).count();
    else ++steps;
    std::printf(" %lld", static_cast<long long>(token));
    std::fflush(stdout);
  }
  double s = steps ? std::chrono::duration<double>(Clock::now() - t0).count() : 0.0;
  std::printf("\nfirst %d decode steps %.3f ms; then %d decode steps in %.4f s (%.1f tokens/s); per step the "
              "delegate copied %llu bytes in and %llu out\n",
              kWarm, warm_ms, steps, s, steps ? steps / s : 0.0,
              steps ? (pipeline_trt_bytes_to_device() - to_device) / steps : 0ULL,
              steps ? (pipeline_trt_bytes_to_host() - to_host) / steps : 0ULL);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  et::runtime_init();
  try {
    Args a = parse(argc, argv);
    pipeline_trt_set_cuda_graph(a.graphs);
    pipeline_trt_set_kernel_specialization(a.kernels);
    Runner runner(a.pte, a.ptd);
    return a.command == "run" ? run(runner, a) : generate(runner, a);
  } catch (const Refusal& r) {
    std::fprintf(stderr, "pipeline-runner: %s\n", r.line.c_str());
    return 1;
  }
}
