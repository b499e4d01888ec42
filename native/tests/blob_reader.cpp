// Reads delegate blobs with the native reader: argv[1] holds records (u32 little-endian length,
// then that many bytes); one line per record: "OK <bindings> <engine key or 'inline'>" or
// "ERR <message>"; a plan blob (TP01): "OK plan <bindings> <steps>" or "ERR <message>". `--dtypes` prints the dtype table (name:size:scalar type). Built under a sanitizer for
// fuzzing (tests/native/test_blob_reader.py).
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "../trt/blob.h"

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--dtypes") == 0) {
    std::printf("%s\n", pipeline_trt::dtype_names().c_str());
    return 0;
  }
  if (argc != 2) return 2;
  std::ifstream in(argv[1], std::ios::binary);
  std::vector<unsigned char> all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = 0;
  while (at + 4 <= all.size()) {
    size_t n = size_t(all[at]) | size_t(all[at + 1]) << 8 | size_t(all[at + 2]) << 16 | size_t(all[at + 3]) << 24;
    at += 4;
    if (n > all.size() - at) return 3;
    // A copy of exactly the record's size, so that the sanitizer sees any read past its end.
    std::vector<unsigned char> record(all.begin() + long(at), all.begin() + long(at + n));
    at += n;
    std::string error;
    if (pipeline_trt::is_plan_blob(record.empty() ? nullptr : record.data(), record.size())) {
      pipeline_trt::PlanInfo plan;
      if (pipeline_trt::decode_plan(record.data(), record.size(), plan, error))
        std::printf("OK plan %zu %zu\n", plan.bindings.size(), plan.steps.size());
      else
        std::printf("ERR %s\n", error.c_str());
      continue;
    }
    pipeline_trt::BlobInfo info;
    if (pipeline_trt::decode_blob(record.empty() ? nullptr : record.data(), record.size(), info, error))
      std::printf("OK %zu %s\n", info.bindings.size(), info.inline_engine ? "inline" : info.engine_key.c_str());
    else
      std::printf("ERR %s\n", error.c_str());
  }
  return 0;
}
