// Registering a vendor-library call's global function once per process (cublas_gemm.cc,
// cudnn_conv.cc).
#pragma once

#include <dlfcn.h>
#include <tvm/ffi/function.h>

namespace deploytool {

// Whether this artifact is the first in the process to define the global function `name`: every
// artifact built with the flag carries its own copy of the call, and TVM-FFI refuses (std::terminate,
// at dlopen) a second registration of a name, so the second artifact loaded would abort the
// process. The first registers it and is pinned in memory (RTLD_NODELETE: unloading its module must
// not unmap the code the global points to); the others use that one. `code` is an address inside
// this artifact (the registered function itself).
inline bool first_to_register(const char* name, const void* code) {
  if (tvm::ffi::Function::GetGlobal(name).has_value()) return false;
  Dl_info info;
  if (dladdr(code, &info) != 0 && info.dli_fname != nullptr)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  return true;
}

}  // namespace deploytool
