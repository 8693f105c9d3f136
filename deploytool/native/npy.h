// npy.h: read and write NumPy .npy files (C order, little-endian), for the bundle's runner.
#ifndef DEPLOYTOOL_NPY_H_
#define DEPLOYTOOL_NPY_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace npy {

struct Array {
  std::string dtype;  // deploytool/TVM name: float32, int64, ...
  std::vector<int64_t> shape;
  std::vector<char> data;
};

inline const std::map<std::string, std::string>& Descr() {  // numpy descr (without byte order) -> dtype
  static const std::map<std::string, std::string> m = {
      {"f2", "float16"}, {"f4", "float32"}, {"f8", "float64"}, {"i1", "int8"},   {"i2", "int16"},
      {"i4", "int32"},   {"i8", "int64"},   {"u1", "uint8"},   {"u2", "uint16"}, {"u4", "uint32"},
      {"u8", "uint64"},  {"b1", "bool"}};
  return m;
}

inline Array Load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read '" + path + "'");
  char magic[6];
  f.read(magic, 6);
  if (!f || std::memcmp(magic, "\x93NUMPY", 6) != 0) throw std::runtime_error("'" + path + "' is not a .npy file");
  unsigned char ver[2];
  f.read(reinterpret_cast<char*>(ver), 2);
  uint32_t hlen = 0;
  if (ver[0] == 1) {
    unsigned char b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    hlen = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  }
  std::string header(hlen, '\0');
  f.read(&header[0], hlen);
  auto field = [&](const std::string& key) {
    auto p = header.find("'" + key + "'");
    if (p == std::string::npos) throw std::runtime_error("'" + path + "': no " + key + " in the .npy header");
    return header.substr(header.find(':', p) + 1);
  };
  std::string descr = field("descr");
  descr = descr.substr(descr.find('\'') + 1);
  descr = descr.substr(0, descr.find('\''));
  if (descr[0] == '>') throw std::runtime_error("'" + path + "' is big-endian: save it little-endian");
  auto it = Descr().find(descr.substr(descr[0] == '<' || descr[0] == '|' || descr[0] == '=' ? 1 : 0));
  if (it == Descr().end()) throw std::runtime_error("'" + path + "': unsupported dtype " + descr);
  if (field("fortran_order").find("True") < field("fortran_order").find(','))
    throw std::runtime_error("'" + path + "' is Fortran-ordered: save it with np.ascontiguousarray");
  Array a;
  a.dtype = it->second;
  std::string shape = field("shape");
  shape = shape.substr(shape.find('(') + 1, shape.find(')') - shape.find('(') - 1);
  size_t n = 1, pos = 0;
  while (pos < shape.size()) {
    size_t next = shape.find(',', pos);
    std::string tok = shape.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
    if (tok.find_first_of("0123456789") != std::string::npos) {
      a.shape.push_back(std::stoll(tok));
      n *= static_cast<size_t>(a.shape.back());
    }
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  size_t item = std::stoul(it->first.substr(1));
  a.data.resize(n * item);
  f.read(a.data.data(), static_cast<std::streamsize>(a.data.size()));
  if (!f) throw std::runtime_error("'" + path + "' is truncated");
  return a;
}

inline void Save(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape,
                 const void* data, size_t bytes) {
  std::string descr;
  for (auto& kv : Descr())
    if (kv.second == dtype) descr = (kv.first[1] == '1' ? "|" : "<") + kv.first;
  if (descr.empty()) throw std::runtime_error("cannot write dtype " + dtype + " to .npy");
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() > 1) dims.erase(dims.size() - 2);
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot write '" + path + "'");
  f.write("\x93NUMPY\x01\x00", 8);
  unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff), static_cast<unsigned char>(header.size() >> 8)};
  f.write(reinterpret_cast<char*>(len), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

}  // namespace npy

#endif  // DEPLOYTOOL_NPY_H_
