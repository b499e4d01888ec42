#include "npy.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "../trt/blob.h"

namespace pipeline_runner {
namespace {

// NumPy's type strings of the contract's dtypes (bfloat16 has none in NumPy).
const char* const kDescr[][2] = {{"|u1", "uint8"},   {"|i1", "int8"},    {"<i2", "int16"},   {"<i4", "int32"},
                                 {"<i8", "int64"},   {"<f2", "float16"}, {"<f4", "float32"}, {"<f8", "float64"},
                                 {"|b1", "bool"}};

std::string field(const std::string& header, const std::string& key) {
  size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) return "";
  at = header.find(':', at);
  if (at == std::string::npos) return "";
  size_t start = header.find_first_not_of(' ', at + 1);
  if (start == std::string::npos) return "";
  char open = header[start];
  size_t end = open == '\'' ? header.find('\'', start + 1) + 1 : open == '(' ? header.find(')', start) + 1
                                                                              : header.find_first_of(",}", start);
  return end == std::string::npos || end == 0 ? "" : header.substr(start, end - start);
}

}  // namespace

bool read_npy(const std::string& path, Array& out, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error = path + ": cannot open it", false;
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0)
    return error = path + ": not a .npy file (write it with numpy.save)", false;
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, at = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | static_cast<unsigned char>(bytes[9]) << 8;
    at = 10;
  } else if ((major == 2 || major == 3) && bytes.size() >= 12) {
    for (int i = 0; i < 4; ++i) header_len |= size_t(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    at = 12;
  } else {
    return error = path + ": .npy format version " + std::to_string(major) + " is not read here", false;
  }
  if (header_len > bytes.size() - at) return error = path + ": its .npy header is cut off", false;
  const std::string header = bytes.substr(at, header_len);
  at += header_len;
  std::string descr = field(header, "descr"), order = field(header, "fortran_order"), shape = field(header, "shape");
  if (order != "False") return error = path + ": Fortran-ordered arrays are not read; save a C-ordered one", false;
  out.dtype.clear();
  for (const auto& d : kDescr)
    if (descr == std::string("'") + d[0] + "'") out.dtype = d[1];
  if (out.dtype.empty())
    return error = path + ": dtype " + descr + " is not one the programs take (little-endian ints, floats, bool)", false;
  out.shape.clear();
  std::stringstream dims(shape.size() >= 2 ? shape.substr(1, shape.size() - 2) : "");
  std::string dim;
  size_t count = 1;
  while (std::getline(dims, dim, ',')) {
    if (dim.find_first_not_of(' ') == std::string::npos) continue;
    long long v = std::atoll(dim.c_str());
    if (v < 0) return error = path + ": negative dim in its shape", false;
    out.shape.push_back(v);
    count *= static_cast<size_t>(v);
  }
  const size_t need = count * pipeline_trt::dtype_size(out.dtype);
  if (bytes.size() - at != need)
    return error = path + ": holds " + std::to_string(bytes.size() - at) + " data bytes, its header says " +
                   std::to_string(need),
           false;
  out.data.assign(bytes.begin() + static_cast<long>(at), bytes.end());
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
  std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary);
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const uint16_t len = static_cast<uint16_t>(header.size());
  out.write(magic, 8);
  out.put(static_cast<char>(len & 0xff));
  out.put(static_cast<char>(len >> 8));
  out << header;
  out.write(reinterpret_cast<const char*>(array.data.data()), static_cast<long>(array.data.size()));
  out.close();
  if (!out || std::rename(tmp.c_str(), path.c_str()) != 0) return error = path + ": cannot write it", false;
  return true;
}

}  // namespace pipeline_runner
