// pipeline-runner transcribe: a Parakeet program's greedy transcription, as pipeline.runtime.speech's
// transcribe_ctc and transcribe_transducer decode it (pipeline/runtime/speech.py says the rules), from
// padded log-mel features [1, frames, mels] and the mask of the utterance's frames (1) and the
// padding's (0). CTC (a `ctc_blank_id` constant): each encoder frame's argmax, the padding's frames
// blank, runs merged, blanks dropped. RNN-T and TDT (`blank_id`, `decoder_step`, `joint` reading the
// encoder frames the encoder kept in the program's state): the prediction network started on the
// blank (or `decoder_start_id`); the joint's argmax on the current frame; a token advances the
// prediction network; RNN-T moves on at the blank or after `max_symbols_per_step` tokens on a frame,
// TDT by the predicted duration (at least one frame on the blank).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "greedy.h"
#include "program.h"

namespace pipeline_runner {
namespace {

// A mask of frames (int64, int32 or bool): whether frame i is the utterance's, and how many are.
struct Mask {
  explicit Mask(const et::EValue& v) {
    if (!v.isTensor()) refuse("the encoder's second output is not the frames' mask");
    const auto& t = v.toTensor();
    dtype = pipeline_trt::dtype_of_scalar_type(static_cast<int>(t.scalar_type()));
    if (dtype != "int64" && dtype != "int32" && dtype != "bool")
      refuse("the encoder's mask is " + dtype + "; the runner reads int64, int32 or bool");
    data = static_cast<const uint8_t*>(t.const_data_ptr());
    size = t.numel();
  }
  bool at(int64_t i) const {
    if (dtype == "bool") return data[i] != 0;
    return dtype == "int32" ? reinterpret_cast<const int32_t*>(data)[i] != 0 : reinterpret_cast<const int64_t*>(data)[i] != 0;
  }
  int64_t count() const {
    int64_t n = 0;
    for (int64_t i = 0; i < size; ++i) n += at(i);
    return n;
  }
  std::string dtype;
  const uint8_t* data = nullptr;
  int64_t size = 0;
};

// The integers of a JSON list ("[0,1,2]"), the TDT durations a program carries.
std::vector<int64_t> int_list(const std::string& text) {
  std::vector<int64_t> out;
  int64_t value = 0;
  bool in_number = false;
  for (char c : text) {
    if (c >= '0' && c <= '9') {
      value = value * 10 + (c - '0');
      in_number = true;
    } else if (c == ',' || c == ']') {
      if (in_number) out.push_back(value);
      value = 0, in_number = false;
    } else if (c != '[' && c != ' ') {
      refuse("the program's tdt_durations are not a list of integers: " + text);
    }
  }
  return out;
}

std::vector<int64_t> ctc(Runner& runner, const std::vector<Array>& inputs) {
  const int64_t blank = runner.constant_int("ctc_blank_id");
  et::Method& m = runner.call_in_place("encoder", inputs);
  if (m.outputs_size() != 2 || !m.get_output(0).isTensor() || m.get_output(0).toTensor().dim() != 3)
    refuse("the CTC encoder does not give logits [1, frames, vocab] and their mask");
  const auto& logits = m.get_output(0).toTensor();
  const Mask valid(m.get_output(1));
  const int64_t frames = logits.size(1), vocab = logits.size(2);
  std::vector<int64_t> out;
  int64_t last = -1;
  for (int64_t f = 0; f < frames; ++f) {
    const int64_t best = f < valid.size && valid.at(f) ? argmax_at(logits, f * vocab, vocab) : blank;
    if (best != blank && best != last) out.push_back(best);
    last = best;
  }
  return out;
}

std::vector<int64_t> transducer(Runner& runner, const std::vector<Array>& inputs) {
  const int64_t blank = runner.constant_int("blank_id");
  const bool capped = runner.has_constant("max_symbols_per_step");
  const int64_t limit = capped ? runner.constant_int("max_symbols_per_step") : 10;
  if (limit < 1) refuse("the program's max_symbols_per_step is below 1");
  const bool tdt = runner.has_constant("tdt_durations");
  const std::vector<int64_t> durations = tdt ? int_list(runner.constant_string("tdt_durations")) : std::vector<int64_t>{};
  const int64_t tdt_vocab = tdt ? runner.constant_int("tdt_vocab_size") : 0;
  if (runner.method("joint").inputs_size() != 1)
    refuse("the joint takes a frame and a prediction (model=transducer_tiny): transcribe it with pipeline.runtime.speech");
  et::Method& encoder = runner.call_in_place("encoder", inputs);
  if (encoder.outputs_size() != 1) refuse("the transducer's encoder does not give its frames' mask alone (rebuild it)");
  const int64_t count = Mask(encoder.get_output(0)).count();
  const int64_t cap = capped ? limit * count - 1 : -1;
  const int64_t start = runner.has_constant("decoder_start_id") ? runner.constant_int("decoder_start_id") : blank;
  runner.call_in_place("decoder_step", {ints({start}, {1})});
  std::vector<int64_t> out;
  int64_t t = 0, symbols = 0, steps = 0;
  while (t < count && (cap < 0 || steps < cap)) {
    et::Method& joint = runner.call_in_place("joint", {ints({t}, {1})});
    if (!joint.get_output(0).isTensor()) refuse("the joint does not give logits");
    const auto& logits = joint.get_output(0).toTensor();
    const int64_t width = logits.numel();
    const int64_t vocab = tdt ? tdt_vocab : width;
    if (vocab < 1 || vocab > width || (tdt && width - vocab != static_cast<int64_t>(durations.size())))
      refuse("the joint's logits are not the program's tokens and durations");
    ++steps;
    const int64_t token = argmax_at(logits, 0, vocab);
    const int64_t duration = tdt ? durations[argmax_at(logits, vocab, width - vocab)] : 0;
    if (token != blank) {
      out.push_back(token);
      runner.call_in_place("decoder_step", {ints({token}, {1})});
    }
    if (tdt) {
      t += std::max<int64_t>(duration, token == blank);
    } else if (token == blank || symbols + 1 >= limit) {
      ++t, symbols = 0;
    } else {
      ++symbols;
    }
  }
  return out;
}

}  // namespace

int transcribe(Runner& runner, const Args& a) {
  const bool is_ctc = runner.has_constant("ctc_blank_id");
  if (!is_ctc && !(runner.has_constant("blank_id") && runner.has_constant("joint")))
    refuse("the program is not a Parakeet program (no ctc_blank_id, or blank_id and joint); build one with model=parakeet "
           "or model=parakeet_transducer");
  if (a.inputs.size() != 2) refuse("transcribe takes two --input files: the padded features and the frames' mask");
  const std::vector<Array> inputs = read_inputs(runner, "encoder", a.inputs);
  const std::vector<int64_t> ids = is_ctc ? ctc(runner, inputs) : transducer(runner, inputs);
  for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %lld" : "%lld", static_cast<long long>(ids[i]));
  std::printf("\n");
  return 0;
}

}  // namespace pipeline_runner
