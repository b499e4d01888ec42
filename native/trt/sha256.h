// SHA-256 (FIPS 180-4), for checking an engine against the digest its blob records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pipeline_trt {

// The lowercase hex digest of `size` bytes at `data`.
std::string sha256_hex(const void* data, size_t size);

}  // namespace pipeline_trt
