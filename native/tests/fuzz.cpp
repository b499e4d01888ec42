// Fuzz targets for the native readers of untrusted bytes: the delegate blob (blob.cpp, its JSON
// included), the runner's .npy inputs (npy.cpp) and the program record (record.cpp).
//
// Each target is LLVMFuzzerTestOneInput, so clang's libFuzzer can drive it (-fsanitize=fuzzer).
// Built without it (g++, CI: tests/native/test_fuzz.py), the main below is a small mutation fuzzer:
//   fuzz TARGET ITERATIONS SEED...   (TARGET: blob, npy or record)
// It reads each seed first (a line "seed OK" or "seed ERR" each), then mutates the seeds (bit flips, interesting bytes and integers, cuts, repeats, splices, digit
// runs) deterministically and calls the target on each case; under AddressSanitizer and
// UndefinedBehaviorSanitizer any finding ends the run with a report. It prints how many cases each
// target took and refused.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "../runner/npy.h"
#include "../runner/record.h"
#include "../trt/blob.h"

namespace {

int g_target = 0;  // 0 blob, 1 npy, 2 record
size_t g_taken = 0, g_refused = 0;

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "FUZZ FINDING: %s\n", what);
    std::abort();
  }
}

void blob(const uint8_t* data, size_t size) {
  pipeline_trt::BlobInfo info;
  std::string error;
  if (!pipeline_trt::decode_blob(data, size, info, error)) {
    check(error.rfind("TensorRT blob ", 0) == 0 && error.find('\n') == std::string::npos, "a refusal is one line");
    ++g_refused;
    return;
  }
  for (const auto& b : info.bindings) {
    check(pipeline_trt::dtype_size(b.dtype) > 0, "a taken binding has a known dtype");
    for (int64_t d : b.shape) check(d >= -1 && d < (int64_t(1) << 31), "a taken dim is -1 or below 2**31");
  }
  check(info.inline_engine == nullptr ||
            (info.inline_engine >= data && info.engine_size <= size_t(data + size - info.inline_engine)),
        "an inline engine lies inside the blob");
  ++g_taken;
}

void npy(const uint8_t* data, size_t size) {
  pipeline_runner::Array a;
  std::string error;
  if (!pipeline_runner::parse_npy(data, size, a, error)) {
    check(!error.empty() && error.find('\n') == std::string::npos, "a refusal is one line");
    ++g_refused;
    return;
  }
  uint64_t count = 1;
  for (int64_t d : a.shape) {
    check(d >= 0 && d < (int64_t(1) << 31), "a taken dim is below 2**31");
    count *= uint64_t(d);
  }
  check(count * pipeline_trt::dtype_size(a.dtype) == a.data.size(), "the data is exactly the shape's bytes");
  ++g_taken;
}

void record(const uint8_t* data, size_t size) {
  std::map<std::string, std::vector<pipeline_runner::Spec>> specs;
  std::string error;
  if (!pipeline_runner::parse_record(std::string(reinterpret_cast<const char*>(data), size), specs, error)) {
    ++g_refused;
    return;
  }
  for (const auto& [method, list] : specs) {
    // Inputs at each spec's smallest shape (int64 zeros), checked against the record: every
    // arithmetic on its bounds runs.
    std::vector<pipeline_runner::Array> inputs;
    for (const auto& s : list) {
      check(!s.present || s.min.size() == s.max.size(), "a taken spec's bounds share a rank");
      pipeline_runner::Array a;
      a.dtype = "int64";
      uint64_t count = 1;
      for (int64_t d : s.min) {
        a.shape.push_back(d < 0 ? 0 : std::min<int64_t>(d, 4));
        count *= uint64_t(a.shape.back());
      }
      a.data.assign(size_t(count) * 8, 0);
      inputs.push_back(std::move(a));
    }
    pipeline_runner::check_inputs(method, list, inputs, error);
  }
  ++g_taken;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A copy of exactly `size` bytes: the sanitizer sees any read past the end.
  std::vector<uint8_t> copy(data, data + size);
  const uint8_t* p = copy.empty() ? nullptr : copy.data();
  if (g_target == 0) blob(p, size);
  else if (g_target == 1) npy(p ? p : reinterpret_cast<const uint8_t*>(""), size);
  else record(p ? p : reinterpret_cast<const uint8_t*>(""), size);
  return 0;
}

#ifndef PIPELINE_LIBFUZZER
namespace {

struct Rng {
  uint64_t s = 0x9e3779b97f4a7c15ULL;
  uint64_t next() {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return s;
  }
  size_t below(size_t n) { return n ? size_t(next() % n) : 0; }
};

const char* const kDigits[] = {"18446744073709551617", "9223372036854775808", "-9223372036854775808",
                               "9223372036854775807", "2147483648", "4294967296", "-1", "0", "1e309", "99999999999999999999999"};
const uint8_t kBytes[] = {0, 1, 0x7f, 0x80, 0xff, '"', '\\', '{', '}', '[', ']', ',', ':', '(', ')', '\'', '-', 'e', '0'};

std::vector<uint8_t> mutate(Rng& rng, const std::vector<std::vector<uint8_t>>& seeds) {
  std::vector<uint8_t> d = seeds[rng.below(seeds.size())];
  const int rounds = 1 + int(rng.below(4));
  for (int r = 0; r < rounds; ++r) {
    switch (rng.below(8)) {
      case 0: if (!d.empty()) d[rng.below(d.size())] ^= uint8_t(1u << rng.below(8)); break;
      case 1: if (!d.empty()) d[rng.below(d.size())] = kBytes[rng.below(sizeof kBytes)]; break;
      case 2: d.resize(rng.below(d.size() + 1)); break;
      case 3: {  // a little-endian integer at a random place (header fields)
        if (d.size() < 8) break;
        uint64_t v = rng.below(2) ? ~uint64_t(0) >> rng.below(64) : rng.below(1 << 16);
        size_t at = rng.below(d.size() - 7);
        std::memcpy(d.data() + at, &v, rng.below(2) ? 4 : 8);
        break;
      }
      case 4: {  // a run of digits where digits are
        size_t at = rng.below(d.size() + 1);
        while (at < d.size() && !(d[at] >= '0' && d[at] <= '9')) ++at;
        if (at >= d.size()) break;
        size_t end = at;
        while (end < d.size() && d[end] >= '0' && d[end] <= '9') ++end;
        const char* k = kDigits[rng.below(sizeof kDigits / sizeof *kDigits)];
        d.erase(d.begin() + long(at), d.begin() + long(end));
        d.insert(d.begin() + long(at), k, k + std::strlen(k));
        break;
      }
      case 5: {  // repeat a chunk
        if (d.empty()) break;
        size_t at = rng.below(d.size()), n = 1 + rng.below(std::min<size_t>(64, d.size() - at));
        std::vector<uint8_t> chunk(d.begin() + long(at), d.begin() + long(at + n));
        d.insert(d.begin() + long(rng.below(d.size() + 1)), chunk.begin(), chunk.end());
        break;
      }
      case 6: {  // splice another seed's tail
        const auto& other = seeds[rng.below(seeds.size())];
        size_t cut = rng.below(d.size() + 1), from = rng.below(other.size() + 1);
        d.resize(cut);
        d.insert(d.end(), other.begin() + long(from), other.end());
        break;
      }
      default: if (!d.empty()) d.erase(d.begin() + long(rng.below(d.size()))); break;
    }
  }
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: fuzz blob|npy|record ITERATIONS SEED...\n");
    return 2;
  }
  const std::string target = argv[1];
  g_target = target == "blob" ? 0 : target == "npy" ? 1 : target == "record" ? 2 : -1;
  const long iterations = std::atol(argv[2]);
  if (g_target < 0 || iterations < 0) return 2;
  std::vector<std::vector<uint8_t>> seeds;
  for (int i = 3; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    seeds.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  for (const auto& s : seeds) {  // one line per seed: "seed OK" or "seed ERR"
    const size_t before = g_taken;
    LLVMFuzzerTestOneInput(s.data(), s.size());
    std::printf("seed %s\n", g_taken > before ? "OK" : "ERR");
  }
  const size_t seeds_taken = g_taken;
  Rng rng;
  for (long i = 0; i < iterations; ++i) {
    std::vector<uint8_t> d = mutate(rng, seeds);
    LLVMFuzzerTestOneInput(d.data(), d.size());
  }
  std::printf("%s seeds taken %zu of %zu; cases taken %zu refused %zu\n", target.c_str(), seeds_taken, seeds.size(),
              g_taken - seeds_taken, g_refused);
  return 0;
}
#endif
