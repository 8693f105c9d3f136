// deploytool.cudnn.conv2d: the float16 NHWC convolutions of a --cudnn CUDA build, with the bias,
// residual and ReLU that follow them, on cuDNN (see deploytool/cudnn.py). Linked into the
// artifact; registers the function when the .so is loaded.
//
// It needs no CUDA toolkit or cuDNN to build: cuDNN's graph (backend) API is declared in
// cudnn_graph.h and resolved with dlopen at the first call (libcudnn.so.9, .so.8, .so, or
// $DEPLOYTOOL_CUDNN), so a machine without a GPU builds GPU artifacts.
//
//   conv2d(params, x, w, [bias], [z], y)
//   params = [stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, relu, has_bias, has_z]
//   x[N, H, W, C], w[K, R, S, C / groups], bias[K], z[N, P, Q, K], y[N, P, Q, K]: float16
//   y = conv(x, w) (+ bias) (+ z), then ReLU if relu; float32 accumulation, the epilogue on the
//   float32 accumulator, one rounding to float16.
//
// Per shape, the first call builds the cuDNN graph of the convolution with its epilogue, takes
// the engine configurations cuDNN's heuristics give, times the first few on the call's buffers
// and keeps the fastest (cudnn_graph.h). Where no engine takes the fused graph, the convolution
// is planned alone and the epilogue runs as cuDNN's legacy add/activation calls (slower, same
// result). Workspace memory comes from TVM's workspace pool (TVMBackendAllocWorkspace). Builds
// with these calls capture no CUDA graph (deploytool/pipeline.py: the first call's timing of
// engines cannot run under stream capture).
//
// $DEPLOYTOOL_CUDNN_VERBOSE=1 prints each plan (the engines timed, the one kept), =2 also every
// call; $DEPLOYTOOL_CUDNN_CANDIDATES (default 4) sets how many engine configurations are timed.

#include <dlfcn.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "cudnn_graph.h"
#include "register_once.h"

namespace {

namespace cg = deploytool::cudnn_graph;
using cg::Desc;
using cg::Handle;
using cg::Status;

// cudnn.h's legacy values (stable across cuDNN 7, 8 and 9), for the unfused epilogue
constexpr int kHalf = 2, kNCHW = 0, kNHWC = 1;  // cudnnDataType_t, cudnnTensorFormat_t
constexpr int kReLU = 1, kNotPropagateNan = 0;  // cudnnActivationMode_t, cudnnNanPropagation_t
constexpr int kCUDA = 2;                        // kDLCUDA

// what the glue needs beyond cudnn_graph.h: the legacy epilogue calls and TVM's workspace pool
struct Extra {
  Status (*create_tensor)(Desc*) = nullptr;
  Status (*set_tensor4d)(Desc, int, int, int, int, int, int) = nullptr;
  Status (*create_act)(Desc*) = nullptr;
  Status (*set_act)(Desc, int, int, double) = nullptr;
  Status (*add_tensor)(Handle, const void*, Desc, const void*, const void*, Desc, void*) = nullptr;
  Status (*activation)(Handle, Desc, const void*, Desc, const void*, const void*, Desc, void*) = nullptr;
  void* (*alloc_ws)(int, int, uint64_t, int, int) = nullptr;
  int (*free_ws)(int, int, void*) = nullptr;
  int verbose = 0;     // $DEPLOYTOOL_CUDNN_VERBOSE
  int candidates = 4;  // $DEPLOYTOOL_CUDNN_CANDIDATES
  std::string error;
};

const Extra& extra() {
  static Extra a;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* verbose = std::getenv("DEPLOYTOOL_CUDNN_VERBOSE");
    a.verbose = verbose == nullptr ? 0 : (verbose[0] == '2' ? 2 : 1);
    if (const char* n = std::getenv("DEPLOYTOOL_CUDNN_CANDIDATES")) a.candidates = std::max(1, std::atoi(n));
    a.error = cg::api().error;
    if (!a.error.empty()) return;
    void* lib = cg::api().lib;
    std::string missing;
    cg::bind(lib, &a.create_tensor, "cudnnCreateTensorDescriptor", &missing);
    cg::bind(lib, &a.set_tensor4d, "cudnnSetTensor4dDescriptor", &missing);
    cg::bind(lib, &a.create_act, "cudnnCreateActivationDescriptor", &missing);
    cg::bind(lib, &a.set_act, "cudnnSetActivationDescriptor", &missing);
    cg::bind(lib, &a.add_tensor, "cudnnAddTensor", &missing);
    cg::bind(lib, &a.activation, "cudnnActivationForward", &missing);
    // TVM's runtime, loaded (globally) by whatever loaded this artifact
    cg::bind(RTLD_DEFAULT, &a.alloc_ws, "TVMBackendAllocWorkspace", &missing);
    cg::bind(RTLD_DEFAULT, &a.free_ws, "TVMBackendFreeWorkspace", &missing);
    if (!missing.empty()) a.error = "the cuDNN / TVM runtime found lacks " + missing;
  });
  return a;
}

void check(Status s, const char* what) {
  if (s != 0) TVM_FFI_THROW(RuntimeError) << "deploytool.cudnn.conv2d: " << what << " failed: " << cg::describe(s);
}

Handle handle_for(int device) {
  // one handle per device and host thread (cuDNN handles are not thread-safe)
  thread_local std::map<int, Handle> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  Handle h = nullptr;
  check(cg::api().create(&h), "cudnnCreate");
  handles[device] = h;
  return h;
}

// TVM's pooled device memory: for the plans' timing (as cg::Memory) and each call's workspace
void* pool_alloc(int device, size_t bytes) { return extra().alloc_ws(kCUDA, device, bytes, 2, 16); }
void pool_free(int device, void* p) { extra().free_ws(kCUDA, device, p); }

cg::Memory pool(int device) {
  return {[device](size_t bytes) { return pool_alloc(device, bytes); },
          [device](void* p) { pool_free(device, p); }};
}

struct Workspace {  // one call's workspace from the pool
  int device;
  void* ptr = nullptr;
  Workspace(int dev, int64_t bytes) : device(dev) {
    if (bytes > 0) {
      ptr = pool_alloc(dev, static_cast<size_t>(bytes));
      if (ptr == nullptr) TVM_FFI_THROW(RuntimeError) << "deploytool.cudnn.conv2d: no " << bytes << " B workspace";
    }
  }
  ~Workspace() {
    if (ptr != nullptr) pool_free(device, ptr);
  }
};

// the epilogue as legacy calls, for a convolution planned without it
struct Epilogue {
  Desc y = nullptr, bias = nullptr, relu = nullptr;
  Epilogue(const cg::Conv& cv) {
    const Extra& f = extra();
    check(f.create_tensor(&y), "cudnnCreateTensorDescriptor");
    check(f.set_tensor4d(y, kNHWC, kHalf, cv.n, cv.k, cv.p, cv.q), "y descriptor");
    check(f.create_tensor(&bias), "cudnnCreateTensorDescriptor");
    check(f.set_tensor4d(bias, kNCHW, kHalf, 1, cv.k, 1, 1), "bias descriptor");
    check(f.create_act(&relu), "cudnnCreateActivationDescriptor");
    check(f.set_act(relu, kReLU, kNotPropagateNan, 0.0), "activation descriptor");
  }
  void run(Handle h, const cg::Conv& cv, const cg::Buffers& b) const {
    const Extra& f = extra();
    const float one = 1.0f, zero = 0.0f;
    if (cv.bias) check(f.add_tensor(h, &one, bias, b.bias, &one, y, b.y), "cudnnAddTensor (bias)");
    if (cv.residual) check(f.add_tensor(h, &one, y, b.z, &one, y, b.y), "cudnnAddTensor (residual)");
    if (cv.relu) check(f.activation(h, relu, &one, y, b.y, &zero, y, b.y), "cudnnActivationForward");
  }
};

struct Entry {
  cg::Conv conv;
  std::unique_ptr<cg::Plan> plan;
  std::unique_ptr<Epilogue> epilogue;  // only where the plan is the convolution alone
};

// what a convolution is, as the cache's key: device, x's and w's shapes, params
using Key = std::tuple<int, std::array<int64_t, 4>, std::array<int64_t, 4>, std::vector<int64_t>>;

std::array<int64_t, 4> dims(const DLTensor* t) { return {t->shape[0], t->shape[1], t->shape[2], t->shape[3]}; }

void* data(const DLTensor* t) { return static_cast<char*>(t->data) + t->byte_offset; }

void expect_half(const DLTensor* t, const char* what, int ndim) {
  if (t->ndim != ndim || t->dtype.code != kDLFloat || t->dtype.bits != 16 || t->dtype.lanes != 1 ||
      !tvm::ffi::IsContiguous(*t) || t->device.device_type != kDLCUDA)
    TVM_FFI_THROW(TypeError) << "deploytool.cudnn.conv2d: " << what << " must be a contiguous " << ndim
                             << "-d float16 CUDA tensor";
}

Entry make_entry(Handle h, const cg::Conv& cv, const cg::Buffers& buf, void* stream, int device) {
  const Extra& f = extra();
  Entry e{cv, nullptr, nullptr};
  const bool has_epilogue = cv.bias || cv.residual || cv.relu;
  std::string fused_error;
  try {
    e.plan = cg::Plan::make(h, cv, true, buf, stream, pool(device), f.candidates, 5, f.verbose);
  } catch (const cg::Error& err) {
    if (!has_epilogue) TVM_FFI_THROW(RuntimeError) << "deploytool.cudnn.conv2d: " << err.what();
    fused_error = err.what();
  }
  if (!e.plan) {
    if (f.verbose) std::fprintf(stderr, "deploytool.cudnn.conv2d: %s; the epilogue runs apart\n", fused_error.c_str());
    try {
      e.plan = cg::Plan::make(h, cv, false, buf, stream, pool(device), f.candidates, 5, f.verbose);
    } catch (const cg::Error& err) {
      TVM_FFI_THROW(RuntimeError) << "deploytool.cudnn.conv2d: " << err.what();
    }
    e.epilogue.reset(new Epilogue(cv));
  }
  return e;
}

void Conv2d(tvm::ffi::PackedArgs args, tvm::ffi::Any* /*rv*/) {
  const Extra& f = extra();
  if (!f.error.empty()) TVM_FFI_THROW(RuntimeError) << f.error;
  if (args.size() < 4) TVM_FFI_THROW(ValueError) << "deploytool.cudnn.conv2d(params, x, w, [bias], [z], y)";
  tvm::ffi::Shape shape = args[0].cast<tvm::ffi::Shape>();
  std::vector<int64_t> p(shape.begin(), shape.end());
  if (p.size() != 10) TVM_FFI_THROW(ValueError) << "deploytool.cudnn.conv2d: 10 parameters expected";
  const bool relu = p[7] != 0, has_bias = p[8] != 0, has_z = p[9] != 0;
  if (args.size() != 4 + has_bias + has_z) TVM_FFI_THROW(ValueError) << "deploytool.cudnn.conv2d: wrong arity";
  int i = 1;
  DLTensor* x = args[i++].cast<DLTensor*>();
  DLTensor* w = args[i++].cast<DLTensor*>();
  DLTensor* bias = has_bias ? args[i++].cast<DLTensor*>() : nullptr;
  DLTensor* z = has_z ? args[i++].cast<DLTensor*>() : nullptr;
  DLTensor* y = args[i].cast<DLTensor*>();
  expect_half(x, "x", 4);
  expect_half(w, "w", 4);
  expect_half(y, "y", 4);
  if (bias) expect_half(bias, "bias", 1);
  if (z) expect_half(z, "z", 4);
  if (bias && bias->shape[0] != y->shape[3]) TVM_FFI_THROW(ValueError) << "deploytool.cudnn.conv2d: bias[K] expected";
  if (z && dims(z) != dims(y)) TVM_FFI_THROW(ValueError) << "deploytool.cudnn.conv2d: z must have y's shape";
  const int64_t groups = p[6];
  if (groups < 1 || x->shape[3] != w->shape[3] * groups || y->shape[3] % groups != 0)
    TVM_FFI_THROW(ValueError) << "deploytool.cudnn.conv2d: channels do not match the groups";
  const int device = x->device.device_id;
  Handle h = handle_for(device);
  void* stream = TVMFFIEnvGetStream(kDLCUDA, device);
  check(cg::api().set_stream(h, stream), "cudnnSetStream");
  const cg::Buffers buf{data(x), data(w), bias ? data(bias) : nullptr, z ? data(z) : nullptr, data(y)};

  static std::mutex mu;
  static std::map<Key, Entry> entries;
  const Entry* e = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    Key key{device, dims(x), dims(w), p};
    auto it = entries.find(key);
    if (it == entries.end()) {
      const cg::Conv cv{x->shape[0], x->shape[1], x->shape[2], x->shape[3], w->shape[0], w->shape[1], w->shape[2],
                        y->shape[1], y->shape[2], {p[0], p[1]}, {p[2], p[3]}, {p[4], p[5]}, groups,
                        has_bias, has_z, relu};
      it = entries.emplace(key, make_entry(h, cv, buf, stream, device)).first;
    }
    e = &it->second;
  }
  if (f.verbose == 2)
    std::fprintf(stderr, "deploytool.cudnn.conv2d call: x %p w %p b %p z %p y %p engine %d ws %lld %s\n", buf.x,
                 buf.w, buf.bias, buf.z, buf.y, e->plan->chosen(), (long long)e->plan->workspace(),
                 e->epilogue ? "epilogue apart" : "fused");
  Workspace ws(device, e->plan->workspace());
  check(e->plan->execute(h, buf, ws.ptr), "cudnnBackendExecute");
  if (e->epilogue) e->epilogue->run(h, e->conv, buf);
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  if (deploytool::first_to_register("deploytool.cudnn.conv2d", reinterpret_cast<const void*>(&Conv2d)))
    refl::GlobalDef().def_packed("deploytool.cudnn.conv2d", Conv2d);
}
