#include "blob.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "json.h"
#include "sha256.h"

namespace pipeline_trt {
namespace {

constexpr size_t kHeader = 32;
constexpr int64_t kDimMax = (int64_t(1) << 31) - 1;
const char* const kKeyPrefix = "tensorrt.engine.";

struct DType {
  const char* name;
  size_t size;
  int scalar_type;  // ExecuTorch's ScalarType (c10's numbering)
};
const DType kDTypes[] = {{"uint8", 1, 0},   {"int8", 1, 1},    {"int16", 2, 2},   {"int32", 4, 3},
                         {"int64", 8, 4},   {"float16", 2, 5}, {"float32", 4, 6}, {"float64", 8, 7},
                         {"bool", 1, 11},   {"bfloat16", 2, 15}};


bool fail(std::string& error, const std::string& why) {
  error = "TensorRT blob " + why;
  return false;
}

bool int_list(const Json* j, std::vector<int64_t>& out) {
  if (j == nullptr || j->kind != Json::kArray) return false;
  for (const auto& item : j->items) {
    if (item.kind != Json::kInt) return false;
    out.push_back(item.integer);
  }
  return true;
}

bool read_binding(const Json& j, Binding& b) {
  const Json *name = j.get("name"), *dtype = j.get("dtype"), *is_input = j.get("is_input");
  if (j.kind != Json::kObject || !name || name->kind != Json::kString || !dtype || dtype->kind != Json::kString ||
      !is_input || is_input->kind != Json::kBool || !int_list(j.get("shape"), b.shape))
    return false;
  b.name = name->text;
  b.dtype = dtype->text;
  b.is_input = is_input->boolean;
  if (j.get("min") && !int_list(j.get("min"), b.min_shape)) return false;
  if (j.get("max") && !int_list(j.get("max"), b.max_shape)) return false;
  if (const Json* a = j.get("aliases")) {
    if (a->kind != Json::kString) return false;
    b.aliases = a->text;
  }
  if (const Json* l = j.get("layout")) {
    if (l->kind != Json::kString) return false;
    b.layout = l->text;
  }
  return true;
}

// What pipeline.tensorrt.blob.check_coherent checks, in the same words.
bool coherent(const BlobInfo& info, std::string& error) {
  std::set<std::string> names;
  std::map<std::string, const Binding*> inputs;
  bool any_output = false;
  for (const auto& b : info.bindings) {
    if (b.name.empty() || !names.insert(b.name).second)
      return fail(error, "binds a name twice or an empty name: every binding needs its own non-empty name");
    if (b.is_input) inputs[b.name] = &b;
    else any_output = true;
  }
  if (!any_output) return fail(error, "binds no output");
  for (const auto& b : info.bindings) {
    std::string where = "binding '" + shown(b.name) + "' ";
    if (dtype_size(b.dtype) == 0) return fail(error, where + "has dtype '" + shown(b.dtype) + "', not one of " + dtype_names());
    bool bounded = !b.min_shape.empty() || !b.max_shape.empty();
    const auto& lo = bounded ? b.min_shape : b.shape;
    const auto& hi = bounded ? b.max_shape : b.shape;
    if (lo.size() != b.shape.size() || hi.size() != b.shape.size() || b.shape.size() > 8)
      return fail(error, where + "has a shape with bounds of another rank (or more than 8 dims)");
    for (size_t k = 0; k < b.shape.size(); ++k) {
      int64_t size = b.shape[k];
      if (size == -1 && b.is_input && !(0 <= lo[k] && lo[k] <= hi[k] && hi[k] <= kDimMax))
        return fail(error, where + "has a dynamic dim bounded outside 0 <= min <= max < 2**31");
      if (size != -1 && !(0 <= size && size <= kDimMax && lo[k] == size && hi[k] == size))
        return fail(error, where + "has a static dim that is not its own bounds");
    }
    if (!b.aliases.empty()) {
      auto it = inputs.find(b.aliases);
      if (b.is_input || it == inputs.end() || it->second->dtype != b.dtype || it->second->shape.size() != b.shape.size())
        return fail(error, where + "aliases '" + shown(b.aliases) + "', which is not an input binding of its dtype and rank");
    }
    bool floating = b.dtype == "float32" || b.dtype == "float16" || b.dtype == "bfloat16";
    if (!b.layout.empty() && (b.layout != "channels_last" || b.shape.size() != 4 || !b.aliases.empty() || !floating))
      return fail(error, where + "has layout '" + shown(b.layout) +
                             "': only a 4-D float binding that aliases nothing may be held 'channels_last'");
  }
  return true;
}

// Whether `size` bytes at `p` are well-formed UTF-8 (as the metadata must be: JSON's encoding).
bool utf8(const uint8_t* p, size_t size) {
  size_t i = 0;
  while (i < size) {
    uint8_t c = p[i];
    size_t n = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xe ? 2 : (c >> 3) == 0x1e ? 3 : 4;
    if (n == 4 || size - i - 1 < n) return false;
    uint32_t code = n == 0 ? c : n == 1 ? c & 0x1f : n == 2 ? c & 0x0f : c & 0x07;
    for (size_t k = 1; k <= n; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
      code = code << 6 | (p[i + k] & 0x3f);
    }
    static const uint32_t kLeast[4] = {0, 0x80, 0x800, 0x10000};
    if (code < kLeast[n] || code > 0x10ffff || (code >= 0xd800 && code < 0xe000)) return false;
    i += n + 1;
  }
  return true;
}

uint32_t u32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }
uint64_t u64(const uint8_t* p) { return uint64_t(u32(p)) | uint64_t(u32(p + 4)) << 32; }

}  // namespace

// Untrusted text as a log line may show it: printable ASCII, others as \xNN, 64 at most.
std::string shown(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < 64; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(char(c));
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return text.size() > 64 ? out + "..." : out;
}

size_t dtype_size(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.size;
  return 0;
}

int dtype_scalar_type(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.scalar_type;
  return -1;
}

std::string dtype_of_scalar_type(int scalar_type) {
  for (const auto& d : kDTypes)
    if (scalar_type == d.scalar_type) return d.name;
  return "scalar type " + std::to_string(scalar_type);
}

std::string dtype_names() {
  std::string out;
  for (const auto& d : kDTypes)
    out += (out.empty() ? "" : ",") + std::string(d.name) + ":" + std::to_string(d.size) + ":" +
           std::to_string(d.scalar_type);
  return out;
}

bool decode_blob(const uint8_t* data, size_t size, BlobInfo& out, std::string& error) {
  if (data == nullptr || size < kHeader) return fail(error, "is shorter than its 32-byte header");
  bool named = std::memcmp(data, "TR03", 4) == 0;
  if (!named && std::memcmp(data, "TR01", 4) != 0 && std::memcmp(data, "TR02", 4) != 0)
    return fail(error, "magic is not TR03, TR01 or TR02: a layout this version does not implement; rebuild the program");
  uint64_t meta_offset = u32(data + 4), meta_size = u32(data + 8), eng_offset = u32(data + 12);
  uint64_t eng_size = u64(data + 16);
  if (meta_offset < kHeader || meta_offset + meta_size > size) return fail(error, "metadata lies outside the blob");
  if (eng_size == 0) return fail(error, "holds an empty engine");
  if (named) {
    if (eng_offset != 0 || meta_offset + meta_size != size)
      return fail(error, "(layout TR03) has bytes after its metadata or an inline engine offset");
  } else if (eng_offset % 16 != 0 || eng_offset < meta_offset + meta_size || eng_offset > size ||
             eng_size > size - eng_offset) {
    return fail(error, "engine offset is unaligned, overlaps the metadata, or runs past the blob (truncated?)");
  }
  const char* text = reinterpret_cast<const char*>(data + meta_offset);
  Json doc;
  if (!utf8(data + meta_offset, meta_size) || !JsonParser(text, text + meta_size).document(doc) || doc.kind != Json::kObject)
    return fail(error, "metadata is not the expected JSON");
  const Json* bindings = doc.get("io_bindings");
  const Json* digest = doc.get("engine_sha256");
  if (!bindings || bindings->kind != Json::kArray || !digest || digest->kind != Json::kString)
    return fail(error, "metadata lacks io_bindings or engine_sha256");
  out = BlobInfo();
  for (const auto& j : bindings->items) {
    out.bindings.emplace_back();
    if (!read_binding(j, out.bindings.back())) return fail(error, "metadata has a binding that is not the expected JSON");
  }
  if (const Json* tf32 = doc.get("tf32_override")) {
    if (tf32->kind != Json::kString) return fail(error, "metadata has a tf32_override that is not a string");
    out.has_tf32_override = true;
    out.tf32_override = tf32->text;
  }
  out.engine_sha256 = digest->text;
  out.engine_size = eng_size;
  if (!coherent(out, error)) return false;
  if (named) {
    const Json* key = doc.get("engine_key");
    if (!key || key->kind != Json::kString || key->text != kKeyPrefix + out.engine_sha256)
      return fail(error, "names an engine key that is not the key of its digest");
    out.engine_key = key->text;
    return true;
  }
  out.inline_engine = data + eng_offset;
  if (sha256_hex(out.inline_engine, eng_size) != out.engine_sha256)
    return fail(error, "engine does not match its checksum (corrupt or altered); rebuild the program");
  return true;
}

}  // namespace pipeline_trt
