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

bool read_engine_doc(const Json& doc, uint64_t eng_size, bool named, BlobInfo& out, std::string& error);

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
  if (!read_engine_doc(doc, eng_size, named, out, error)) return false;
  if (named) return true;
  out.inline_engine = data + eng_offset;
  if (sha256_hex(out.inline_engine, eng_size) != out.engine_sha256)
    return fail(error, "engine does not match its checksum (corrupt or altered); rebuild the program");
  return true;
}

// A TR03 blob's metadata (or a TR01/TR02's, `named` false) for an engine of `eng_size` bytes.
bool read_engine_doc(const Json& doc, uint64_t eng_size, bool named, BlobInfo& out, std::string& error) {
  if (doc.kind != Json::kObject) return fail(error, "metadata is not the expected JSON");
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
  }
  return true;
}


// ---- the plan blob ------------------------------------------------------------------------------
namespace {

bool plan_fail(std::string& error, const std::string& why) {
  error = "TensorRT plan " + why;
  return false;
}

bool names(const Json* j, std::vector<std::string>& out) {
  if (j == nullptr || j->kind != Json::kArray) return false;
  for (const auto& item : j->items) {
    if (item.kind != Json::kString) return false;
    out.push_back(item.text);
  }
  return true;
}

bool integer(const Json& doc, const char* key, int64_t& out) {
  const Json* j = doc.get(key);
  if (j == nullptr || j->kind != Json::kInt) return false;
  out = j->integer;
  return true;
}

// A named-data entry {"key", "sha256", "size"} (null where `optional`): the key must be its digest's.
bool data_entry(const Json* j, bool optional, DataEntry& out) {
  if (j != nullptr && j->kind == Json::kNull && optional) return true;
  if (j == nullptr || j->kind != Json::kObject) return false;
  const Json *key = j->get("key"), *digest = j->get("sha256"), *size = j->get("size");
  if (!key || key->kind != Json::kString || !digest || digest->kind != Json::kString || !size || size->kind != Json::kInt ||
      size->integer <= 0)
    return false;
  bool prefixed = key->text.rfind("pipeline.kernels.", 0) == 0 || key->text.rfind("pipeline.weight.", 0) == 0;
  if (!prefixed || key->text.size() < digest->text.size() ||
      key->text.compare(key->text.size() - digest->text.size(), std::string::npos, digest->text) != 0)
    return false;
  out = DataEntry{key->text, digest->text, static_cast<uint64_t>(size->integer)};
  return true;
}

// The rows one warp of a kernel computes (decode_products.cu's Format<F>::rows), 0 for a name that is
// none of the project's kernels.
int kernel_rows(const std::string& name) {
  static const std::pair<const char*, int> formats[] = {{"fp16", 1}, {"int4", 1}, {"fp8", 1}};
  for (const auto& [format, rows] : formats)
    for (char t = '1'; t <= '8'; ++t)
      if (name == std::string("dp_") + format + "_t" + t) return rows;
  return 0;
}

bool read_step(const Json& j, PlanStep& step, std::string& error) {
  if (j.kind != Json::kObject || !names(j.get("inputs"), step.inputs) || !names(j.get("outputs"), step.outputs))
    return plan_fail(error, "has a step that is not the expected JSON");
  if (const Json* engine = j.get("engine")) {
    int64_t size = 0;
    step.is_engine = true;
    if (!integer(j, "engine_size", size) || size <= 0) return plan_fail(error, "has an engine step without its size");
    if (!read_engine_doc(*engine, static_cast<uint64_t>(size), true, step.engine, error)) return false;
    size_t n_in = 0;
    for (const auto& b : step.engine.bindings) n_in += b.is_input ? 1 : 0;
    if (step.inputs.size() != n_in || step.outputs.size() != step.engine.bindings.size() - n_in)
      return plan_fail(error, "binds an engine step's names to another count of bindings");
    return true;
  }
  const Json* kernel = j.get("kernel");
  if (kernel && kernel->kind == Json::kString && kernel->text == "decode_attention") {
    int64_t bits = -1;
    step.is_attention = true;
    step.kernel = kernel->text;
    if (!data_entry(j.get("module"), false, step.module) || !integer(j, "scale_bits", bits) || bits < 0 || bits > 0xffffffffLL)
      return plan_fail(error, "has an attention step whose module or scale is not the expected JSON");
    if ((step.inputs.size() != 3 && step.inputs.size() != 4) || step.outputs.size() != 2)
      return plan_fail(error, "has an attention step that does not read q, k, v (a mask) and write o and its workspace");
    step.scale_bits = static_cast<uint32_t>(bits);
    return true;
  }
  if (!kernel || kernel->kind != Json::kString || kernel_rows(kernel->text) == 0 || step.inputs.size() != 1 ||
      step.outputs.size() != 1)
    return plan_fail(error, "has a kernel step that is none of the project's kernels (one x, one y)");
  step.kernel = kernel->text;
  if (!data_entry(j.get("module"), false, step.module) || !data_entry(j.get("weight"), false, step.weight) ||
      !data_entry(j.get("scales"), true, step.scales) || !data_entry(j.get("bias"), true, step.bias))
    return plan_fail(error, "has a kernel step whose named data is not the expected JSON");
  if (!integer(j, "n", step.n) || !integer(j, "k", step.k) || !integer(j, "group", step.group) ||
      !integer(j, "grid", step.grid) || !integer(j, "block", step.block) || step.n <= 0 || step.k <= 0 ||
      step.group < 0 || step.grid <= 0 || step.block <= 0 || step.block > 1024 || step.n > kDimMax || step.k > kDimMax ||
      step.grid > kDimMax)
    return plan_fail(error, "has a kernel step with sizes out of range");
  return true;
}

size_t elements(const Binding* b) {
  size_t n = 1;
  for (int64_t d : b->shape) n *= static_cast<size_t>(d);
  return n;
}

// The rules plan.py's `check` states: names known before they are read, every output written, static
// shapes; and a kernel's x and y of its sizes (what it reads and writes is sized from them).
bool plan_coherent(const PlanInfo& plan, std::string& error) {
  BlobInfo io;
  io.bindings = plan.bindings;
  if (!coherent(io, error)) return false;
  std::map<std::string, const Binding*> declared;
  for (const auto* list : {&plan.bindings, &plan.values})
    for (const auto& b : *list) {
      if (!declared.emplace(b.name, &b).second) return plan_fail(error, "names a value twice");
      for (int64_t d : b.shape)
        if (d < 0) return plan_fail(error, "has a value of a dynamic shape; a plan's values are static");
      if (dtype_size(b.dtype) == 0) return plan_fail(error, "has a value of an unknown dtype");
    }
  std::set<std::string> known;
  for (const auto& b : plan.bindings)
    if (b.is_input) known.insert(b.name);
  for (const auto& step : plan.steps) {
    for (const auto& name : step.inputs)
      if (!known.count(name)) return plan_fail(error, "reads '" + shown(name) + "', which no input or earlier step gives");
    for (const auto& name : step.outputs)
      if (!declared.count(name)) return plan_fail(error, "writes '" + shown(name) + "', which it does not declare");
    if (step.is_engine) {
      size_t k = 0, o = 0;
      for (const auto& b : step.engine.bindings) {
        const std::string& name = b.is_input ? step.inputs[k++] : step.outputs[o++];
        const Binding* value = declared[name];
        if (value->dtype != b.dtype || value->shape.size() != b.shape.size())
          return plan_fail(error, "binds '" + shown(name) + "' to an engine binding of another dtype or rank");
        for (size_t i = 0; i < b.shape.size(); ++i)
          if (b.shape[i] >= 0 ? b.shape[i] != value->shape[i] : (!b.min_shape.empty() && (value->shape[i] < b.min_shape[i] || value->shape[i] > b.max_shape[i])))
            return plan_fail(error, "binds '" + shown(name) + "' to an engine binding of another shape");
      }
    } else if (step.is_attention) {
      AttentionSizes sizes;
      const Binding* mask = step.inputs.size() == 4 ? declared[step.inputs[3]] : nullptr;
      if (!attention_sizes(*declared[step.inputs[0]], *declared[step.inputs[1]], *declared[step.inputs[2]], mask,
                           *declared[step.outputs[0]], *declared[step.outputs[1]], sizes))
        return plan_fail(error, "runs the decode attention on values it does not take");
    } else {
      const Binding *x = declared[step.inputs[0]], *y = declared[step.outputs[0]];
      if (x->dtype != "float16" || y->dtype != "float16" || x->shape.empty() || y->shape.empty() ||
          x->shape.back() != step.k || y->shape.back() != step.n || elements(x) / step.k != elements(y) / step.n ||
          elements(x) / step.k < 1 || elements(x) / step.k > 8 || step.kernel.back() - '0' != int(elements(x) / step.k) ||
          (uint64_t)step.grid * step.block / 32 * kernel_rows(step.kernel) < (uint64_t)step.n)
        return plan_fail(error, "runs kernel " + step.kernel + " on values that are not its [T, k] -> [T, n] in float16");
    }
    known.insert(step.outputs.begin(), step.outputs.end());
  }
  for (const auto& b : plan.bindings)
    if (!b.is_input && b.aliases.empty() && !known.count(b.name))
      return plan_fail(error, "never writes its output '" + shown(b.name) + "'");
  return true;
}

}  // namespace

bool attention_sizes(const Binding& q, const Binding& k, const Binding& v, const Binding* mask, const Binding& o,
                     const Binding& workspace, AttentionSizes& out) {
  enum { kMaxTokens = 8, kMaxQueries = 32, kMaxQueryValues = 4096 };  // decode_attention.cu's
  if (q.shape.size() != 4 || k.shape.size() != 4 || k.shape != v.shape) return false;
  for (const Binding* b : {&q, &k, &v, mask, &o})
    if (b != nullptr && b->dtype != "float16") return false;
  for (int64_t d : q.shape)
    if (d <= 0 || d > kDimMax) return false;
  for (int64_t d : k.shape)
    if (d <= 0 || d > kDimMax) return false;
  const int64_t batch = q.shape[0], heads = q.shape[1], tokens = q.shape[2], dim = q.shape[3];
  if (batch > kDimMax / heads || batch * heads > kDimMax / tokens || batch * heads * tokens > kDimMax / dim) return false;
  const int64_t kv_heads = k.shape[1], positions = k.shape[2];
  if (k.shape[0] != batch || k.shape[3] != dim || heads % kv_heads != 0 || tokens > kMaxTokens || dim % 8 != 0) return false;
  const int64_t queries = heads / kv_heads * tokens;
  if (queries > kMaxQueries || queries * dim > kMaxQueryValues) return false;
  if (mask != nullptr && (mask->shape.size() != 4 || (mask->shape[0] != 1 && mask->shape[0] != batch) || mask->shape[1] != 1 ||
                          mask->shape[2] != tokens || mask->shape[3] != positions))
    return false;
  if (elements(&o) != elements(&q) || workspace.dtype != "float32") return false;
  out.batch = int(batch), out.heads = int(heads), out.kv_heads = int(kv_heads), out.tokens = int(tokens);
  out.positions = int(positions), out.dim = int(dim), out.mask_batch = mask != nullptr ? int(mask->shape[0]) : 0;
  out.chunks = int((positions + kAttentionChunk - 1) / kAttentionChunk);
  out.workspace = uint64_t(batch * heads * tokens) * uint64_t(out.chunks) * uint64_t(dim + 2);
  return elements(&workspace) >= out.workspace;
}

bool is_plan_blob(const uint8_t* data, size_t size) { return data != nullptr && size >= 4 && std::memcmp(data, "TP01", 4) == 0; }

bool decode_plan(const uint8_t* data, size_t size, PlanInfo& out, std::string& error) {
  if (!is_plan_blob(data, size) || size < kHeader) return plan_fail(error, "blob is not layout TP01");
  uint64_t meta_offset = u32(data + 4), meta_size = u32(data + 8), eng_offset = u32(data + 12), eng_size = u64(data + 16);
  if (meta_offset != kHeader || meta_offset + meta_size != size || eng_offset != 0 || eng_size != 0)
    return plan_fail(error, "blob header does not frame its metadata");
  const char* text = reinterpret_cast<const char*>(data + meta_offset);
  Json doc;
  if (!utf8(data + meta_offset, meta_size) || !JsonParser(text, text + meta_size).document(doc) || doc.kind != Json::kObject)
    return plan_fail(error, "metadata is not the expected JSON");
  const Json *bindings = doc.get("io_bindings"), *values = doc.get("values"), *steps = doc.get("steps");
  if (!bindings || bindings->kind != Json::kArray || !values || values->kind != Json::kArray || !steps ||
      steps->kind != Json::kArray)
    return plan_fail(error, "metadata lacks io_bindings, values or steps");
  out = PlanInfo();
  for (const auto& j : bindings->items) {
    out.bindings.emplace_back();
    if (!read_binding(j, out.bindings.back())) return plan_fail(error, "has a binding that is not the expected JSON");
  }
  for (const auto& j : values->items) {
    Binding b;
    const Json *name = j.get("name"), *dtype = j.get("dtype");
    if (j.kind != Json::kObject || !name || name->kind != Json::kString || !dtype || dtype->kind != Json::kString ||
        !int_list(j.get("shape"), b.shape))
      return plan_fail(error, "has a value that is not the expected JSON");
    b.name = name->text;
    b.dtype = dtype->text;
    out.values.push_back(std::move(b));
  }
  for (const auto& j : steps->items) {
    out.steps.emplace_back();
    if (!read_step(j, out.steps.back(), error)) return false;
  }
  return plan_coherent(out, error);
}

}  // namespace pipeline_trt
