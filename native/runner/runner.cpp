// pipeline-runner: runs a program with ExecuTorch's C++ runtime and the native TensorRT delegate,
// no Python anywhere.
//
//   pipeline-runner run PROGRAM.pte [--ptd DATA.ptd] --method NAME [--input X.npy ...]
//                   [--output-dir DIR] [--repeat N] [--cuda-graph | --method-graph] [--kernels lazy|eager|none]
//   pipeline-runner generate PROGRAM.pte [--ptd DATA.ptd] --prompt "1 5 9" [--max-new-tokens N]
//                   [--prefill prefill] [--decode decode] [--cuda-graph | --method-graph] [--kernels lazy|eager|none]
//                   [--encoder NAME --input X.npy ...]
//   pipeline-runner transcribe PROGRAM.pte [--ptd DATA.ptd] --input FEATURES.npy --input MASK.npy
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
// vision_encoder or audio_encoder: each image or window into the state's slot its inputs name, the
// files given item by item), and the prompt must hold the program's placeholder token once per row
// written. The methods share the program's planned memory, so what prefill writes in the state decode
// reads; the delegate keeps that state on the device. Inputs are checked against the program record (dtype, dims, values) before any run.
// `transcribe` runs a Parakeet program (CTC, RNN-T or TDT) on padded log-mel features and the mask of
// the utterance's frames, decodes greedily as pipeline.runtime.speech does, and prints the token ids.
// Every refusal is one line on stderr and exit status 1.
#include <executorch/runtime/platform/runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "greedy.h"
#include "program.h"

namespace pipeline_runner {
namespace {

const char* const kUsage =
    "usage: pipeline-runner run PROGRAM.pte [--ptd DATA.ptd] --method NAME [--input X.npy ...] [--output-dir DIR] "
    "[--repeat N] [--cuda-graph | --method-graph] [--kernels lazy|eager|none]\n"
    "       pipeline-runner generate PROGRAM.pte [--ptd DATA.ptd] --prompt \"1 5 9\" [--max-new-tokens N] "
    "[--prefill NAME] [--decode NAME] [--cuda-graph | --method-graph] [--kernels lazy|eager|none] "
    "[--encoder NAME --input X.npy ...]\n"
    "       pipeline-runner transcribe PROGRAM.pte [--ptd DATA.ptd] --input FEATURES.npy --input MASK.npy";
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
  if (a.command != "run" && a.command != "generate" && a.command != "transcribe") refuse(kUsage);
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

}  // namespace

std::vector<Array> read_inputs(Runner& runner, const std::string& method, const std::vector<std::string>& files) {
  std::vector<Array> inputs(files.size());
  std::string error;
  for (size_t i = 0; i < files.size(); ++i)
    if (!pipeline_runner::read_npy(files[i], inputs[i], error, runner.input_limit(method, i))) refuse(error);
  return inputs;
}

// The items --encoder reads: its --input files in turns of the method's inputs, each turn one item
// (an image or window and the slot its rows go to), all read and checked before any method runs;
// two items of one slot would leave the first's rows unread.
std::vector<std::vector<Array>> encoder_items(Runner& runner, const Args& a) {
  const size_t arity = runner.num_inputs(a.encoder);
  if (a.inputs.empty() || a.inputs.size() % arity != 0)
    refuse("--encoder " + a.encoder + " takes " + std::to_string(arity) + " --input files per item, got " +
           std::to_string(a.inputs.size()) + ": give each item's files in turn (its data, then its slot)");
  std::vector<std::vector<Array>> items;
  std::vector<std::vector<uint8_t>> slots;
  for (size_t at = 0; at < a.inputs.size(); at += arity) {
    items.push_back(read_inputs(runner, a.encoder, {a.inputs.begin() + at, a.inputs.begin() + at + arity}));
    runner.check(a.encoder, items.back());
    const auto& slot = items.back().back().data;
    if (std::find(slots.begin(), slots.end(), slot) != slots.end())
      refuse("two items --encoder reads go to one slot (" + a.inputs[at + arity - 1] + "): give each item a slot of its own");
    slots.push_back(slot);
  }
  return items;
}

// A multimodal program's prompt holds its placeholder token once per row the encoder writes: as many
// as the items' rows with --encoder, none without (checked before any method runs).
void check_placeholders(Runner& runner, const Args& a, const std::vector<int64_t>& prompt, size_t items) {
  if (!runner.has_constant("placeholder_token_id")) return;  // --encoder on such a program is refused before
  const int64_t placeholder = runner.constant_int("placeholder_token_id");
  const int64_t want = static_cast<int64_t>(items) * runner.constant_int("media_rows");
  const auto found = std::count(prompt.begin(), prompt.end(), placeholder);
  if (found != want)
    refuse("the prompt holds " + std::to_string(found) + " placeholder tokens (id " + std::to_string(placeholder) +
           "); " + (a.encoder.empty() ? std::string("without --encoder it holds none")
                                      : "the " + std::to_string(items) + " item(s) --encoder reads stand for " +
                                            std::to_string(want)) +
           ": make the prompt with the model's processor");
}

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
  if (!a.encoder.empty() && !runner.has_constant("placeholder_token_id"))
    refuse("--encoder runs a multimodal program's encoder; this program has none");
  const auto items = a.encoder.empty() ? std::vector<std::vector<Array>>{} : encoder_items(runner, a);
  check_placeholders(runner, a, prompt, items.size());
  for (const auto& item : items) runner.call_in_place(a.encoder, item);  // its rows stay in the state
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

}  // namespace pipeline_runner

int main(int argc, char** argv) {
  using namespace pipeline_runner;
  et::runtime_init();
  try {
    Args a = parse(argc, argv);
    pipeline_trt_set_cuda_graph(a.graphs);
    pipeline_trt_set_kernel_specialization(a.kernels);
    Runner runner(a.pte, a.ptd);
    if (a.command == "transcribe") return transcribe(runner, a);
    return a.command == "run" ? run(runner, a) : generate(runner, a);
  } catch (const Refusal& r) {
    std::fprintf(stderr, "pipeline-runner: %s\n", r.line.c_str());
    return 1;
  }
}
