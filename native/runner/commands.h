// The runner's commands and what they are given on the command line.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "program.h"

namespace pipeline_runner {

struct Args {
  std::string command, pte, method = "forward", output_dir = ".", prompt, prefill = "prefill", decode = "decode", encoder;
  std::optional<std::string> ptd;
  std::vector<std::string> inputs;
  int repeat = 0, max_new_tokens = 16;
  int graphs = 0;   // pipeline_trt_set_cuda_graph's mode
  int kernels = 0;  // pipeline_trt_set_kernel_specialization's strategy
};

// The arrays of `files` (.npy), each no larger than input i of `method` can be.
std::vector<Array> read_inputs(Runner& runner, const std::string& method, const std::vector<std::string>& files);

// `transcribe`: a speech program's greedy transcription (speech.cpp).
int transcribe(Runner& runner, const Args& a);

}  // namespace pipeline_runner
