// NumPy .npy files (format 1.0/2.0/3.0, little-endian, C order): the runner's inputs and outputs.
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

// Parse the bytes of a .npy file; false with `error` set (the problem, in words that follow a path).
// Every dim is at most 2**31 - 1 (ExecuTorch's sizes are int32) and the element count cannot
// overflow; the header must name descr, fortran_order and shape, each once.
bool parse_npy(const uint8_t* bytes, size_t size, Array& out, std::string& error);
// Read `path`: a regular file (no pipe or device) of at most `limit` bytes; false with `error` set
// (one line naming the file and the problem).
bool read_npy(const std::string& path, Array& out, std::string& error, uint64_t limit);
// Whether `path` is a regular file (opened without waiting on a pipe); false with `error` set.
bool regular_file(const std::string& path, std::string& error);
// Write `array` to `path` through a new temporary file beside it (never through a link or a file
// already there), then rename it over `path`, which may be a missing name or a .npy file (an earlier
// run's output), never a link or another file; false with `error` set.
bool write_npy(const std::string& path, const Array& array, std::string& error);

}  // namespace pipeline_runner
