// NumPy .npy files (format 1.0/2.0, little-endian, C order): the runner's inputs and outputs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pipeline_runner {

struct Array {
  std::string dtype;  // a dtype name of the blob contract ("float32", "int64", ...)
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

// Read `path`; false with `error` set (one line naming the file and the problem).
bool read_npy(const std::string& path, Array& out, std::string& error);
// Write `array` to `path`; false with `error` set.
bool write_npy(const std::string& path, const Array& array, std::string& error);

}  // namespace pipeline_runner
