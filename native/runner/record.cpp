#include "record.h"

#include <algorithm>
#include <cstring>

#include "../trt/blob.h"
#include "../trt/json.h"

namespace pipeline_runner {
namespace {
using pipeline_trt::Json;

bool ints(const Json* j, std::vector<int64_t>& out, size_t want = 0) {
  if (j == nullptr || j->kind != Json::kArray || (want && j->items.size() != want)) return false;
  out.clear();
  for (const auto& item : j->items) {
    if (item.kind != Json::kInt) return false;
    out.push_back(item.integer);
  }
  return true;
}

std::string describe(const Spec& s) {
  std::string dims;
  for (size_t i = 0; i < s.min.size(); ++i)
    dims += (i ? ", " : "") + (s.min[i] == s.max[i] ? std::to_string(s.min[i])
                                                   : std::to_string(s.min[i]) + ".." + std::to_string(s.max[i]));
  return s.dtype + "[" + dims + "]";
}

std::string shape_list(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// The smallest and largest element of an integer array.
bool int_range(const Array& a, int64_t& low, int64_t& high) {
  const size_t size = pipeline_trt::dtype_size(a.dtype), n = size ? a.data.size() / size : 0;
  if (n == 0) return false;
  low = INT64_MAX;
  high = INT64_MIN;
  for (size_t i = 0; i < n; ++i) {
    int64_t v = 0;
    const uint8_t* p = a.data.data() + i * size;
    if (a.dtype == "int64") std::memcpy(&v, p, 8);
    else if (a.dtype == "int32") { int32_t x; std::memcpy(&x, p, 4); v = x; }
    else if (a.dtype == "int16") { int16_t x; std::memcpy(&x, p, 2); v = x; }
    else if (a.dtype == "int8") v = static_cast<int8_t>(*p);
    else if (a.dtype == "uint8" || a.dtype == "bool") v = *p;
    else return false;
    low = std::min(low, v);
    high = std::max(high, v);
  }
  return true;
}

}  // namespace

bool parse_record(const std::string& text, std::map<std::string, std::vector<Spec>>& out, std::string& error) {
  Json doc;
  const Json* inputs = nullptr;
  if (!pipeline_trt::JsonParser(text.data(), text.data() + text.size()).document(doc) || doc.kind != Json::kObject ||
      (inputs = doc.get("inputs")) == nullptr || inputs->kind != Json::kObject)
    return error = "the program record is not the expected JSON; rebuild the program", false;
  for (const auto& [method, list] : inputs->members) {
    if (list.kind != Json::kArray) return error = "the program record's inputs of '" + method + "' are not a list", false;
    std::vector<Spec> specs;
    for (const auto& j : list.items) {
      Spec s;
      if (j.kind == Json::kObject) {
        const Json* dtype = j.get("dtype");
        // What TensorSpec.from_json takes: a contract dtype, bounds of one rank with 0 <= min <= max.
        s.present = dtype != nullptr && dtype->kind == Json::kString && pipeline_trt::dtype_size(dtype->text) > 0 &&
                    ints(j.get("min"), s.min) && ints(j.get("max"), s.max) && s.min.size() == s.max.size();
        for (size_t d = 0; s.present && d < s.min.size(); ++d) s.present = 0 <= s.min[d] && s.min[d] <= s.max[d];
        if (!s.present) return error = "the program record has a malformed input spec for '" + method + "'", false;
        s.dtype = dtype->text;
        std::vector<int64_t> v;
        if (j.get("values")) {
          if (!ints(j.get("values"), v, 2)) return error = "malformed value bounds in the program record", false;
          if (v[0] > v[1]) return error = "malformed value bounds in the program record", false;
          s.has_values = true, s.low = v[0], s.high = v[1];
        }
        if (j.get("end")) {
          if (!ints(j.get("end"), v, 3)) return error = "malformed end bound in the program record", false;
          s.has_end = true, s.other = v[0], s.dim = v[1], s.limit = v[2];
        }
      } else if (j.kind != Json::kNull) {
        return error = "the program record has a malformed input spec for '" + method + "'", false;
      }
      specs.push_back(s);
    }
    out[method] = specs;
  }
  return true;
}

bool check_inputs(const std::string& method, const std::vector<Spec>& specs, const std::vector<Array>& inputs,
                  std::string& error) {
  const std::string where = "method '" + method + "'";
  if (inputs.size() != specs.size())
    return error = where + " takes " + std::to_string(specs.size()) + " inputs, got " + std::to_string(inputs.size()), false;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    const Array& a = inputs[i];
    const std::string at = where + " input " + std::to_string(i);
    if (!s.present) continue;
    if (a.dtype != s.dtype)
      return error = at + " has dtype " + a.dtype + ", but the program takes " + describe(s) + "; convert it first", false;
    if (a.shape.size() != s.min.size())
      return error = at + " has " + std::to_string(a.shape.size()) + " dims " + shape_list(a.shape) +
                     ", but the program takes " + describe(s),
             false;
    for (size_t d = 0; d < a.shape.size(); ++d)
      if (a.shape[d] < s.min[d] || a.shape[d] > s.max[d])
        return error = at + " dim " + std::to_string(d) + " is " + std::to_string(a.shape[d]) +
                       ", but the program was built for " +
                       (s.min[d] == s.max[d] ? "exactly " + std::to_string(s.min[d])
                                             : std::to_string(s.min[d]) + ".." + std::to_string(s.max[d])) +
                       " (" + describe(s) + "); rebuild with a wider range to take it",
               false;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    int64_t low, high;
    if (!s.present || !(s.has_values || s.has_end) || !int_range(inputs[i], low, high)) continue;
    int64_t lo = s.has_values ? s.low : low, hi = s.has_values ? s.high : high;
    std::string span_text;
    if (s.has_end) {
      int64_t span = 1;
      if (s.other >= 0 && size_t(s.other) < inputs.size() && s.dim >= 0 && size_t(s.dim) < inputs[s.other].shape.size())
        span = inputs[s.other].shape[s.dim];
      hi = std::min(hi, s.limit < INT64_MIN + span ? INT64_MIN : s.limit - span);  // span >= 0: no overflow
      span_text = " with " + std::to_string(span) + " positions from it (input " + std::to_string(s.other) + " dim " +
                  std::to_string(s.dim) + ")";
    }
    if (!(lo <= low && low <= high && high <= hi))
      return error = where + " input " + std::to_string(i) + " holds " + std::to_string(low < lo ? low : high) +
                     ", but the program takes values " + std::to_string(lo) + ".." + std::to_string(hi) + span_text +
                     " (" + describe(s) + "); an index outside them would read or write past its table",
             false;
  }
  return true;
}

}  // namespace pipeline_runner
