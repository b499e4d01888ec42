#include "npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "../trt/blob.h"

namespace pipeline_runner {
namespace {

constexpr int64_t kDimMax = (int64_t(1) << 31) - 1;  // ExecuTorch's tensor sizes are int32
constexpr size_t kHeaderMax = 1 << 16;

// NumPy's type strings of the contract's dtypes (bfloat16 has none in NumPy).
const char* const kDescr[][2] = {{"|u1", "uint8"},   {"|i1", "int8"},    {"<i2", "int16"},   {"<i4", "int32"},
                                 {"<i8", "int64"},   {"<f2", "float16"}, {"<f4", "float32"}, {"<f8", "float64"},
                                 {"|b1", "bool"}};

// The header: a Python dict literal of exactly 'descr', 'fortran_order' and 'shape', as numpy.save
// writes it ({'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }), read strictly.
class Header {
 public:
  explicit Header(const std::string& text) : p_(text.data()), end_(text.data() + text.size()) {}

  bool parse(std::string& descr, std::string& order, std::vector<int64_t>& shape, bool& has_shape, std::string& why) {
    space();
    if (!eat('{')) return why = "its header is not a dict", false;
    bool has_descr = false, has_order = false;
    while (true) {
      space();
      if (eat('}')) break;
      std::string key;
      if (!quoted(key)) return why = "its header has a key that is not a quoted name", false;
      space();
      if (!eat(':')) return why = "its header lacks a ':' after '" + pipeline_trt::shown(key) + "'", false;
      space();
      bool* seen = key == "descr" ? &has_descr : key == "fortran_order" ? &has_order : key == "shape" ? &has_shape : nullptr;
      if (seen == nullptr) return why = "its header has the unknown key '" + pipeline_trt::shown(key) + "'", false;
      if (*seen) return why = "its header gives '" + key + "' twice", false;
      *seen = true;
      if (key == "descr" && !quoted(descr)) return why = "its descr is not a quoted type string", false;
      if (key == "fortran_order" && !word(order)) return why = "its fortran_order is not True or False", false;
      if (key == "shape" && !dims(shape, why)) return false;
      space();
      if (eat('}')) break;
      if (!eat(',')) return why = "its header is not a dict", false;
    }
    space();
    if (p_ != end_) return why = "its header has bytes after the dict", false;
    if (!has_descr || !has_order || !has_shape) return why = "its header lacks descr, fortran_order or shape", false;
    return true;
  }

 private:
  const char* p_;
  const char* end_;

  void space() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n')) ++p_;
  }
  bool eat(char c) { return p_ < end_ && *p_ == c ? (++p_, true) : false; }
  bool quoted(std::string& out) {
    if (!eat('\'')) return false;
    const char* start = p_;
    while (p_ < end_ && *p_ != '\'') ++p_;
    if (p_ == end_ || p_ - start > 64) return false;
    out.assign(start, p_++);
    return true;
  }
  bool word(std::string& out) {
    const char* start = p_;
    while (p_ < end_ && ((*p_ >= 'a' && *p_ <= 'z') || (*p_ >= 'A' && *p_ <= 'Z'))) ++p_;
    out.assign(start, p_);
    return out == "True" || out == "False";
  }
  bool dims(std::vector<int64_t>& out, std::string& why) {
    why = "its shape is not a tuple of non-negative integers below 2**31";
    if (!eat('(')) return false;
    bool comma = false;
    while (true) {
      space();
      if (eat(')')) return out.size() != 1 || comma;  // (3) is no tuple: numpy writes (3,)
      if (p_ == end_ || *p_ < '0' || *p_ > '9' || out.size() == 32) return false;
      int64_t v = 0;
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') {
        v = v * 10 + (*p_++ - '0');
        if (v > kDimMax) return false;
      }
      out.push_back(v);
      space();
      comma = eat(',');
      if (!comma) return eat(')') && out.size() != 1;
    }
  }
};

uint32_t little(const uint8_t* p, int n) {
  uint32_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}

}  // namespace

bool parse_npy(const uint8_t* bytes, size_t size, Array& out, std::string& error) {
  if (size < 10 || std::memcmp(bytes, "\x93NUMPY", 6) != 0) return error = "not a .npy file (write it with numpy.save)", false;
  const int major = bytes[6];
  size_t header_len = 0, at = 0;
  if (major == 1) {
    header_len = little(bytes + 8, 2), at = 10;
  } else if ((major == 2 || major == 3) && size >= 12) {
    header_len = little(bytes + 8, 4), at = 12;
  } else {
    return error = ".npy format version " + std::to_string(major) + " is not read here", false;
  }
  if (header_len > size - at || header_len > kHeaderMax) return error = "its .npy header is cut off or too long", false;
  std::string descr, order, why;
  std::vector<int64_t> shape;
  bool has_shape = false;
  if (!Header(std::string(reinterpret_cast<const char*>(bytes + at), header_len)).parse(descr, order, shape, has_shape, why))
    return error = why + " (write it with numpy.save)", false;
  at += header_len;
  if (order != "False") return error = "Fortran-ordered arrays are not read; save a C-ordered one", false;
  std::string dtype;
  for (const auto& d : kDescr)
    if (descr == d[0]) dtype = d[1];
  if (dtype.empty())
    return error = "dtype '" + pipeline_trt::shown(descr) + "' is not one the programs take (little-endian ints, floats, bool)", false;
  uint64_t need = pipeline_trt::dtype_size(dtype);
  for (int64_t d : shape)  // each dim < 2**31 and the product checked: no overflow
    if (d != 0 && need > (uint64_t(1) << 62) / uint64_t(d)) return error = "its shape holds more elements than any file", false;
    else need *= uint64_t(d);
  if (size - at != need)
    return error = "holds " + std::to_string(size - at) + " data bytes, its header says " + std::to_string(need), false;
  out.dtype = dtype;
  out.shape = shape;
  out.data.assign(bytes + at, bytes + size);
  return true;
}

bool regular_file(const std::string& path, std::string& error) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return error = path + ": cannot open it (" + std::strerror(errno) + ")", false;
  struct stat st {};
  bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  ::close(fd);
  if (!regular) error = path + ": not a regular file (a pipe, device or folder); pass the file itself";
  return regular;
}

bool read_npy(const std::string& path, Array& out, std::string& error, uint64_t limit) {
  // O_NONBLOCK: a FIFO opens without waiting for a writer, then is refused as no regular file.
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return error = path + ": cannot open it (" + std::strerror(errno) + ")", false;
  struct stat st {};
  std::vector<uint8_t> bytes;
  bool ok = ::fstat(fd, &st) == 0;
  if (ok && !S_ISREG(st.st_mode)) {
    error = path + ": not a regular file (a pipe, device or folder); pass a .npy file";
    ok = false;
  } else if (ok && uint64_t(st.st_size) > limit) {
    error = path + ": is " + std::to_string(st.st_size) + " bytes, more than the " + std::to_string(limit) +
            " the program's largest input can take; pass the input the program was built for";
    ok = false;
  } else if (ok) {
    bytes.resize(size_t(st.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
      ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
      if (n <= 0) break;
      got += size_t(n);
    }
    ok = got == bytes.size();
    if (!ok) error = path + ": could not be read whole (it changed while read?)";
  } else {
    error = path + ": cannot read it (" + std::strerror(errno) + ")";
  }
  ::close(fd);
  if (!ok) return false;
  if (!parse_npy(bytes.data(), bytes.size(), out, error)) return error = path + ": " + error, false;
  return true;
}

bool write_npy(const std::string& path, const Array& array, std::string& error) {
  const char* descr = nullptr;
  for (const auto& d : kDescr)
    if (array.dtype == d[1]) descr = d[0];
  if (descr == nullptr) return error = path + ": dtype " + array.dtype + " has no .npy form", false;
  std::string shape = "(";
  for (size_t i = 0; i < array.shape.size(); ++i) shape += std::to_string(array.shape[i]) + (array.shape.size() == 1 ? "," : i + 1 < array.shape.size() ? ", " : "");
  shape += ")";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8);
  bytes.push_back(static_cast<char>(header.size() & 0xff));
  bytes.push_back(static_cast<char>(header.size() >> 8));
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(array.data.data()), array.data.size());
  // A fresh temporary name (mkstemp: O_CREAT | O_EXCL, so never a link or a file planted there),
  // renamed over `path` (rename replaces a link at `path` itself, never writes through it).
  std::string tmp = path + ".XXXXXX";
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) return error = path + ": cannot write beside it (" + std::strerror(errno) + ")", false;
  size_t put = 0;
  while (put < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + put, bytes.size() - put);
    if (n <= 0) break;
    put += size_t(n);
  }
  bool ok = put == bytes.size() && ::fchmod(fd, 0644) == 0;
  ok = ::close(fd) == 0 && ok;
  struct stat st {};
  if (ok && ::lstat(path.c_str(), &st) == 0) {  // something is there: only an earlier output is replaced
    char magic[6] = {};
    int old = S_ISREG(st.st_mode) ? ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
    bool npy = old >= 0 && ::read(old, magic, 6) == 6 && std::memcmp(magic, "\x93NUMPY", 6) == 0;
    if (old >= 0) ::close(old);
    if (!npy) {
      ::unlink(tmp.c_str());
      return error = path + ": is there and is not an earlier .npy output (a link, folder or another file); the "
                            "runner replaces only its own outputs: pass another --output-dir",
             false;
    }
  }
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return error = path + ": cannot write it", false;
  }
  return true;
}

}  // namespace pipeline_runner
