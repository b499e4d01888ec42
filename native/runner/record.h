// The program record's input specs (pipeline/record.py, pipeline/tensor_spec.py), read and checked
// natively: the runner refuses an input the program was not built for, values included, before
// anything runs, with the message pipeline.runtime gives.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "npy.h"

namespace pipeline_runner {

struct Spec {
  bool present = false;  // null in the record: not a tensor input
  std::string dtype;
  std::vector<int64_t> min, max;
  bool has_values = false;
  int64_t low = 0, high = 0;
  bool has_end = false;
  int64_t other = 0, dim = 0, limit = 0;
};

// The record's {"inputs": {method: [spec|null]}}; false with `error` set.
bool parse_record(const std::string& text, std::map<std::string, std::vector<Spec>>& out, std::string& error);

// Every input against its spec (dtype, rank, dims, then values); false with `error` set.
bool check_inputs(const std::string& method, const std::vector<Spec>& specs, const std::vector<Array>& inputs,
                  std::string& error);

}  // namespace pipeline_runner
