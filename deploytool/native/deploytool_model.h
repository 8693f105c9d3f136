// deploytool_model.h: load and run a deploytool .so with the TVM runtime alone (no Python, no compiler).
//
//   deploytool::Model model("model.so");            // checks the artifact against this runtime and CPU
//   for (auto& s : model.inputs()) ...               // names, shapes, dtypes from the .so's metadata
//   std::vector<tvm::ffi::Tensor> outs = model.Run(inputs);
//
// Link with libtvm_runtime and libtvm_ffi (the bundle's lib/), C++17. The versions this header
// was built against come in as DEPLOYTOOL_TVM_VERSION and DEPLOYTOOL_TVM_FFI_VERSION.
#ifndef DEPLOYTOOL_MODEL_H_
#define DEPLOYTOOL_MODEL_H_

#include <dlfcn.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/json.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#if __has_include("deploytool_runtime_version.h")
#include "deploytool_runtime_version.h"  // written by `deploytool package`
#endif
#ifndef DEPLOYTOOL_TVM_VERSION
#error "define DEPLOYTOOL_TVM_VERSION (the TVM version of the bundled runtime)"
#endif
#ifndef DEPLOYTOOL_TVM_FFI_VERSION
#error "define DEPLOYTOOL_TVM_FFI_VERSION (the tvm-ffi version of the bundled runtime)"
#endif

namespace deploytool {

namespace ffi = tvm::ffi;

#if defined(__aarch64__)
inline const char* kArch = "aarch64";
#elif defined(__x86_64__)
inline const char* kArch = "x86_64";
#elif defined(__arm__)
inline const char* kArch = "armv7l";
#else
inline const char* kArch = "unknown";
#endif

// A model that can't run here: the message names the problem and the fix, in one line.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;  // "float32", "int64", ...
  DLDataType dl_dtype() const { return ffi::StringToDLDataType(dtype); }
  size_t bytes() const {
    size_t n = (dl_dtype().bits * dl_dtype().lanes + 7) / 8;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    return n;
  }
};

// The CPU flags of this machine, as /proc/cpuinfo names them ("flags" on x86, "Features" on Arm).
// Empty (unknown: not checked) when /proc/cpuinfo doesn't describe this architecture, as under
// qemu-user, which shows the host's.
inline std::set<std::string> CpuFlags() {
#if defined(__x86_64__)
  const std::string want = "flags";
#else
  const std::string want = "Features";
#endif
  std::set<std::string> flags;
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    if (key != want) continue;
    std::istringstream words(line.substr(colon + 1));
    std::string w;
    while (words >> w) flags.insert(w);
    break;
  }
  return flags;
}

struct CPUAlloc {
  void AllocData(DLTensor* t) { t->data = std::aligned_alloc(64, ((ffi::GetDataSize(*t) + 63) / 64) * 64 + 64); }
  void FreeData(DLTensor* t) { std::free(t->data); }
};

class Model {
 public:
  explicit Model(const std::string& path) : path_(path), lib_(Open(path)), vm_(Load(lib_, path)), main_(Init(vm_)) {}

  const std::vector<TensorSpec>& inputs() const { return inputs_; }
  const std::vector<TensorSpec>& outputs() const { return outputs_; }
  const ffi::json::Object& metadata() const { return meta_; }

  // A CPU tensor for an input (or any spec), to fill before Run.
  static ffi::Tensor Empty(const TensorSpec& s) {
    return ffi::Tensor::FromNDAlloc(CPUAlloc(), ffi::ShapeView(s.shape.data(), s.shape.size()), s.dl_dtype(),
                                    DLDevice{kDLCPU, 0});
  }

  std::vector<ffi::Tensor> Run(const std::vector<ffi::Tensor>& args) const {
    if (args.size() != inputs_.size())
      throw Error("the model takes " + std::to_string(inputs_.size()) + " inputs, got " + std::to_string(args.size()));
    std::vector<ffi::AnyView> packed(args.begin(), args.end());
    ffi::Any ret;
    main_.CallPacked(packed.data(), static_cast<int32_t>(packed.size()), &ret);
    std::vector<ffi::Tensor> outs;
    if (auto t = ret.try_cast<ffi::Tensor>()) {
      outs.push_back(*t);
    } else {
      for (const ffi::Any& a : ret.cast<ffi::Array<ffi::Any>>()) outs.push_back(a.cast<ffi::Tensor>());
    }
    return outs;
  }

 private:
  // The order matters: metadata and checks come before the TVM runtime touches the file.
  ffi::Module Open(const std::string& path) {
    ReadMetadata();
    Check();
    return ffi::Module::LoadFromFile(path_);
  }

  static ffi::Module Load(const ffi::Module& lib, const std::string& path) {
    auto load = lib->GetFunction("vm_load_executable");
    if (!load.has_value()) throw Error("'" + path + "' holds no relax VM executable: rebuild it with deploytool compile");
    return (*load)().cast<ffi::Module>();
  }

  ffi::Function Init(const ffi::Module& vm) const {
    // CPU device, pooled allocator (2), for both the device and the host, as relax.VirtualMachine does.
    (*vm->GetFunction("vm_initialization"))(static_cast<int>(kDLCPU), 0, 2, static_cast<int>(kDLCPU), 0, 2);
    auto f = vm->GetFunction(entry_);
    if (!f.has_value()) throw Error("'" + path_ + "' has no function '" + entry_ + "': rebuild it");
    return *f;
  }

  static std::string Str(const ffi::json::Object& o, const char* key) {
    auto it = o.find(ffi::String(key));
    return it == o.end() ? std::string() : std::string((*it).second.cast<ffi::String>());
  }

  static std::vector<TensorSpec> Specs(const ffi::json::Object& meta, const char* key) {
    std::vector<TensorSpec> out;
    for (const ffi::Any& a : meta.at(ffi::String(key)).cast<ffi::json::Array>()) {
      auto o = a.cast<ffi::json::Object>();
      TensorSpec s{Str(o, "name"), {}, Str(o, "dtype")};
      for (const ffi::Any& d : o.at(ffi::String("shape")).cast<ffi::json::Array>()) s.shape.push_back(d.cast<int64_t>());
      out.push_back(s);
    }
    return out;
  }

  // The ELF machine of a file ("" if it is not ELF): dlopen's own message for a foreign one is
  // a misleading "No such file or directory".
  static std::string ElfArch(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error("cannot open '" + path + "': no such file: check the path");
    unsigned char h[20] = {0};
    f.read(reinterpret_cast<char*>(h), sizeof(h));
    if (!f || std::memcmp(h, "\x7f" "ELF", 4) != 0) return "";
    int machine = h[18] | (h[19] << 8);
    switch (machine) {
      case 62: return "x86_64";
      case 183: return "aarch64";
      case 40: return "armv7l";
      default: return "ELF machine " + std::to_string(machine);
    }
  }

  void ReadMetadata() {
    if (path_.find('/') == std::string::npos) path_ = "./" + path_;  // dlopen searches the library path otherwise
    std::string arch = ElfArch(path_);
    if (arch.empty()) throw Error("'" + path_ + "' is not a shared library: pass the .so that deploytool compile wrote");
    if (arch != kArch)
      throw Error("'" + path_ + "' is built for " + arch + " and this runner is " + kArch +
                  ": rebuild it for this board (deploytool compile --target ...), or use the bundle made for " + arch);
    void* h = dlopen(path_.c_str(), RTLD_LAZY | RTLD_LOCAL);
    if (!h) throw Error("cannot load '" + path_ + "': " + std::string(dlerror()) + ": check that lib/ sits next to run");
    auto* blob = static_cast<const char*>(dlsym(h, "deploytool_meta"));
    if (!blob) {
      dlclose(h);
      throw Error("'" + path_ + "' has no deploytool metadata: build it with `deploytool compile`");
    }
    ffi::String err;
    ffi::json::Value v = ffi::json::Parse(ffi::String(blob), &err);
    dlclose(h);
    if (!err.empty()) throw Error("'" + path_ + "' has corrupt metadata (" + std::string(err) + "): rebuild it");
    meta_ = v.cast<ffi::json::Object>();
    inputs_ = Specs(meta_, "inputs");
    outputs_ = Specs(meta_, "outputs");
    entry_ = Str(meta_, "entry");
    if (entry_.empty()) entry_ = "main";
  }

  void Check() const {
    std::string fmt = Str(meta_, "format");
    if (fmt != "deploytool-artifact/1")
      throw Error("'" + path_ + "' has artifact format '" + fmt +
                  "', this runner reads deploytool-artifact/1: package it with the deploytool that built it");
    std::string tvm = Str(meta_, "tvm_version"), tvm_ffi = Str(meta_, "tvm_ffi_version");
    if (tvm != DEPLOYTOOL_TVM_VERSION)
      throw Error("'" + path_ + "' was built with TVM " + tvm + ", this runtime is TVM " DEPLOYTOOL_TVM_VERSION
                  ": rebuild the model with this runtime's TVM, or package it again (deploytool package)");
    if (!tvm_ffi.empty() && tvm_ffi != DEPLOYTOOL_TVM_FFI_VERSION)
      throw Error("'" + path_ + "' was built against tvm-ffi " + tvm_ffi + " (ABI), this runtime has tvm-ffi "
                  DEPLOYTOOL_TVM_FFI_VERSION ": package it again with the matching runtime");
    auto target = meta_.at(ffi::String("target")).cast<ffi::json::Object>();
    std::string arch = Str(target, "arch");
    if (arch != kArch)
      throw Error("'" + path_ + "' is built for " + arch + " and this machine is " + kArch +
                  ": rebuild it for this board (deploytool compile --target ...)");
    std::set<std::string> have = CpuFlags();
    std::string lacking;
    for (const ffi::Any& f : target.at(ffi::String("required_features")).cast<ffi::json::Array>()) {
      std::string flag(f.cast<ffi::String>());
      if (!have.empty() && !have.count(flag)) lacking += (lacking.empty() ? "" : ", ") + flag;
    }
    if (!lacking.empty())
      throw Error("'" + path_ + "' needs CPU features this machine lacks: " + lacking +
                  ": rebuild it for this CPU (e.g. --target arm or x86-avx2)");
  }

  std::string path_, entry_;
  ffi::json::Object meta_;
  std::vector<TensorSpec> inputs_, outputs_;
  ffi::Module lib_, vm_;  // declared in the order the constructor builds them
  ffi::Function main_;
};

}  // namespace deploytool

#endif  // DEPLOYTOOL_MODEL_H_
