// A C interface to deploytool/native/cudnn_graph.h for bench/cudnn_convs.py (ctypes, torch's
// buffers and stream): the same planning and launch code as the artifacts' deploytool.cudnn.conv2d,
// without TVM. Built there with: g++ -std=c++17 -O2 -shared -fPIC -I deploytool/native
// bench/cudnn_convs.cc -o cudnn_convs.so -ldl
#include <dlfcn.h>

#include <cstring>

#include "cudnn_graph.h"

namespace cg = deploytool::cudnn_graph;

namespace {

cg::Handle handle() {
  static cg::Handle h = nullptr;
  if (h == nullptr) cg::check(cg::api().create(&h), "cudnnCreate");
  return h;
}

cg::Memory driver_memory() {
  static void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  using Alloc = int (*)(void**, size_t);
  using Free = int (*)(void*);
  static Alloc alloc = reinterpret_cast<Alloc>(dlsym(cuda, "cuMemAlloc_v2"));
  static Free release = reinterpret_cast<Free>(dlsym(cuda, "cuMemFree_v2"));
  return {[](size_t n) {
            void* p = nullptr;
            return alloc(&p, n) == 0 ? p : nullptr;
          },
          [](void* p) { release(p); }};
}

}  // namespace

extern "C" {

// spec: n h w c k r s p q stride_h stride_w pad_h pad_w dil_h dil_w groups bias residual relu
// Returns a plan, or nullptr with the reason in err.
void* dt_plan(const int64_t* spec, int fuse, void* x, void* w, void* bias, void* z, void* y, void* stream,
              int candidates, int repeats, int verbose, char* err, int errlen) {
  try {
    if (!cg::api().error.empty()) throw cg::Error(cg::api().error);
    cg::Conv cv{spec[0], spec[1], spec[2], spec[3], spec[4], spec[5], spec[6], spec[7], spec[8],
                {spec[9], spec[10]}, {spec[11], spec[12]}, {spec[13], spec[14]}, spec[15],
                spec[16] != 0, spec[17] != 0, spec[18] != 0};
    cg::check(cg::api().set_stream(handle(), stream), "cudnnSetStream");
    return cg::Plan::make(handle(), cv, fuse != 0, {x, w, bias, z, y}, stream, driver_memory(), candidates, repeats,
                          verbose)
        .release();
  } catch (const std::exception& e) {
    std::strncpy(err, e.what(), static_cast<size_t>(errlen - 1));
    err[errlen - 1] = 0;
    return nullptr;
  }
}

int64_t dt_workspace(void* plan) { return static_cast<cg::Plan*>(plan)->workspace(); }
int dt_chosen(void* plan) { return static_cast<cg::Plan*>(plan)->chosen(); }
int dt_configs(void* plan) { return static_cast<cg::Plan*>(plan)->configs(); }

int dt_execute(void* plan, void* x, void* w, void* bias, void* z, void* y, void* workspace, void* stream) {
  cg::api().set_stream(handle(), stream);
  return static_cast<cg::Plan*>(plan)->execute(handle(), {x, w, bias, z, y}, workspace);
}

void dt_free(void* plan) { delete static_cast<cg::Plan*>(plan); }

}  // extern "C"
