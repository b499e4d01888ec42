// A small JSON reader for the documents the native code reads (delegate blobs' metadata, the
// program record): objects, arrays, strings, integers, numbers, true/false/null, nesting bounded;
// a key given twice is refused (Python's reader would take the last, this one the first).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace pipeline_trt {

constexpr int kMaxJsonDepth = 16;

struct Json {
  enum Kind { kNull, kBool, kInt, kNumber, kString, kArray, kObject } kind = kNull;
  bool boolean = false;
  int64_t integer = 0;
  std::string text;
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;

  const Json* get(const char* key) const {
    for (const auto& m : members)
      if (m.first == key) return &m.second;
    return nullptr;
  }
};

class JsonParser {
 public:
  JsonParser(const char* p, const char* end) : p_(p), end_(end) {}

  bool document(Json& out) {
    if (!value(out, 0)) return false;
    space();
    return p_ == end_;
  }

 private:
  const char* p_;
  const char* end_;

  void space() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool literal(const char* word) {
    size_t n = std::strlen(word);
    if (size_t(end_ - p_) < n || std::memcmp(p_, word, n) != 0) return false;
    p_ += n;
    return true;
  }
  bool value(Json& out, int depth) {
    if (depth > kMaxJsonDepth) return false;
    space();
    if (p_ == end_) return false;
    switch (*p_) {
      case '{': return object(out, depth);
      case '[': return array(out, depth);
      case '"': out.kind = Json::kString; return string(out.text);
      case 't': out.kind = Json::kBool; out.boolean = true; return literal("true");
      case 'f': out.kind = Json::kBool; return literal("false");
      case 'n': return literal("null");
      default: return number(out);
    }
  }
  bool object(Json& out, int depth) {
    out.kind = Json::kObject;
    ++p_;
    space();
    if (p_ < end_ && *p_ == '}') return ++p_, true;
    while (true) {
      space();
      std::string key;
      if (p_ == end_ || *p_ != '"' || !string(key)) return false;
      space();
      if (p_ == end_ || *p_++ != ':') return false;
      // A key given twice is refused: Python's reader would take the last, this one the first.
      if (out.get(key.c_str()) != nullptr) return false;
      out.members.emplace_back(std::move(key), Json());
      if (!value(out.members.back().second, depth + 1)) return false;
      space();
      if (p_ == end_) return false;
      if (*p_ == '}') return ++p_, true;
      if (*p_++ != ',') return false;
    }
  }
  bool array(Json& out, int depth) {
    out.kind = Json::kArray;
    ++p_;
    space();
    if (p_ < end_ && *p_ == ']') return ++p_, true;
    while (true) {
      out.items.emplace_back();
      if (!value(out.items.back(), depth + 1)) return false;
      space();
      if (p_ == end_) return false;
      if (*p_ == ']') return ++p_, true;
      if (*p_++ != ',') return false;
    }
  }
  bool string(std::string& out) {
    ++p_;
    while (p_ < end_ && *p_ != '"') {
      unsigned char c = static_cast<unsigned char>(*p_++);
      if (c < 0x20) return false;
      if (c != '\\') {
        out.push_back(static_cast<char>(c));
        continue;
      }
      if (p_ == end_) return false;
      char e = *p_++;
      switch (e) {
        case '"': case '\\': case '/': out.push_back(e); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          if (end_ - p_ < 4) return false;
          unsigned code = 0;
          for (int i = 0; i < 4; ++i) {
            char h = *p_++;
            code <<= 4;
            if (h >= '0' && h <= '9') code |= unsigned(h - '0');
            else if (h >= 'a' && h <= 'f') code |= unsigned(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') code |= unsigned(h - 'A' + 10);
            else return false;
          }
          if (code >= 0xd800 && code < 0xe000) return false;  // surrogates: never in our names
          if (code < 0x80) out.push_back(char(code));
          else if (code < 0x800) out += {char(0xc0 | (code >> 6)), char(0x80 | (code & 0x3f))};
          else out += {char(0xe0 | (code >> 12)), char(0x80 | ((code >> 6) & 0x3f)), char(0x80 | (code & 0x3f))};
          break;
        }
        default: return false;
      }
    }
    if (p_ == end_) return false;
    ++p_;
    return true;
  }
  bool number(Json& out) {
    bool negative = p_ < end_ && *p_ == '-';
    if (negative) ++p_;
    const char* digits = p_;
    // An integer that int64 cannot hold is no integer here (Python's reader refuses it too):
    // the magnitude stops growing at the first digit that would pass INT64_MAX.
    uint64_t magnitude = 0;
    bool overflow = false;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
      const uint64_t digit = uint64_t(*p_++ - '0');
      if (overflow || magnitude > (uint64_t(INT64_MAX) - digit) / 10) overflow = true;
      else magnitude = magnitude * 10 + digit;
    }
    if (p_ == digits) return false;
    bool fraction = false;
    if (p_ < end_ && *p_ == '.') {
      fraction = true;
      const char* f = ++p_;
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      if (p_ == f) return false;
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      fraction = true;
      ++p_;
      if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      const char* x = p_;
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      if (p_ == x) return false;
    }
    if (fraction || overflow) {
      out.kind = Json::kNumber;  // no binding field takes one
      return true;
    }
    out.kind = Json::kInt;
    out.integer = negative ? -int64_t(magnitude) : int64_t(magnitude);  // |magnitude| <= INT64_MAX: no overflow
    return true;
  }
};

}  // namespace pipeline_trt
