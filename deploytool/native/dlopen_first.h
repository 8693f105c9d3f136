// The first of a vendor library's names that dlopen loads: $ENV's value, then the given sonames.
// Shared by the vendor-library calls linked into artifacts (cublas_gemm.cc, cudnn_conv.cc).
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <initializer_list>
#include <string>

namespace deploytool {

// Returns the handle, or nullptr with *tried listing what was tried (comma-separated).
inline void* dlopen_first(const char* env_var, std::initializer_list<const char*> sonames, std::string* tried) {
  const char* env = std::getenv(env_var);
  if (env != nullptr && *env != '\0') {
    if (void* lib = dlopen(env, RTLD_NOW | RTLD_GLOBAL)) return lib;
    *tried += env;
  }
  for (const char* n : sonames) {
    if (void* lib = dlopen(n, RTLD_NOW | RTLD_GLOBAL)) return lib;
    *tried += std::string(tried->empty() ? "" : ", ") + n;
  }
  return nullptr;
}

}  // namespace deploytool
