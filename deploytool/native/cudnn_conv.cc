// deploytool.cudnn.conv2d: the float16 NHWC convolutions of a --cudnn CUDA build, with the bias,
// residual and ReLU that follow them, on cuDNN (see deploytool/cudnn.py). Linked into the
// artifact; registers the function when the .so is loaded.
//
// It needs no CUDA toolkit or cuDNN to build: the few cuDNN entry points it calls (the "legacy"
// API, in cuDNN 8 and 9) are declared here and resolved with dlopen at the first call
// (libcudnn.so.9, .so.8, .so, or $DEPLOYTOOL_CUDNN), so a machine without a GPU builds GPU artifacts.
//
//   conv2d(params, x, w, [bias], [z], y)
//   params = [stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, relu, has_bias, has_z]
//   x[N, H, W, C], w[K, R, S, C / groups], bias[K], z[N, P, Q, K], y[N, P, Q, K]: float16
//   y = conv(x, w) (+ bias) (+ z), then ReLU if relu; float32 accumulation (cuDNN's
//   "pseudo-half" configuration, what torch does for float16 convolutions).
//
// Per shape, the first call picks the fastest algorithm by timing each on this GPU
// (cudnnFindConvolutionForwardAlgorithmEx) and checks that cuDNN's fused
// convolution-bias-activation takes it; where it does not, the epilogue runs as cuDNN's
// add/activation calls after the convolution (slower, same result). Workspace memory comes from
// TVM's workspace pool (TVMBackendAllocWorkspace): after the first call, the pool's blocks are
// reused. Builds with these calls capture no CUDA graph (deploytool/pipeline.py: the first call's
// algorithm search cannot run under stream capture).

#include <dlfcn.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "dlopen_first.h"

namespace {

using Handle = void*;
using Desc = void*;
using Status = int;

// cudnn.h's values (stable across cuDNN 7, 8 and 9)
constexpr int kFloat = 0, kHalf = 2;             // cudnnDataType_t
constexpr int kNCHW = 0, kNHWC = 1;              // cudnnTensorFormat_t
constexpr int kCrossCorrelation = 1;             // cudnnConvolutionMode_t
constexpr int kTensorOpMath = 1;                 // cudnnMathType_t
constexpr int kReLU = 1, kIdentity = 5;          // cudnnActivationMode_t
constexpr int kNotPropagateNan = 0;              // cudnnNanPropagation_t
constexpr int kImplicitPrecompGemm = 1;          // cudnnConvolutionFwdAlgo_t
constexpr int kAlgoCount = 8;
constexpr size_t kMaxWorkspace = size_t(512) << 20;
constexpr int kCUDA = 2;                         // kDLCUDA

struct AlgoPerf {  // cudnnConvolutionFwdAlgoPerf_t
  int algo;
  Status status;
  float time;
  size_t memory;
  int determinism;
  int math_type;
  int reserved[3];
};

struct Api {
  Status (*create)(Handle*) = nullptr;
  Status (*set_stream)(Handle, void*) = nullptr;
  const char* (*error_string)(Status) = nullptr;
  Status (*create_tensor)(Desc*) = nullptr;
  Status (*set_tensor4d)(Desc, int, int, int, int, int, int) = nullptr;
  Status (*create_filter)(Desc*) = nullptr;
  Status (*set_filter4d)(Desc, int, int, int, int, int, int) = nullptr;
  Status (*create_conv)(Desc*) = nullptr;
  Status (*set_conv2d)(Desc, int, int, int, int, int, int, int, int) = nullptr;
  Status (*set_math)(Desc, int) = nullptr;
  Status (*set_groups)(Desc, int) = nullptr;
  Status (*create_act)(Desc*) = nullptr;
  Status (*set_act)(Desc, int, int, double) = nullptr;
  Status (*find_ex)(Handle, Desc, const void*, Desc, const void*, Desc, Desc, void*, int, int*, AlgoPerf*, void*,
                    size_t) = nullptr;
  Status (*ws_size)(Handle, Desc, Desc, Desc, Desc, int, size_t*) = nullptr;
  Status (*forward)(Handle, const void*, Desc, const void*, Desc, const void*, Desc, int, void*, size_t, const void*,
                    Desc, void*) = nullptr;
  Status (*fused)(Handle, const void*, Desc, const void*, Desc, const void*, Desc, int, void*, size_t, const void*,
                  Desc, const void*, Desc, const void*, Desc, Desc, void*) = nullptr;
  Status (*add_tensor)(Handle, const void*, Desc, const void*, const void*, Desc, void*) = nullptr;
  Status (*activation)(Handle, Desc, const void*, Desc, const void*, const void*, Desc, void*) = nullptr;
  void* (*alloc_ws)(int, int, uint64_t, int, int) = nullptr;
  int (*free_ws)(int, int, void*) = nullptr;
  int verbose = 0;  // $DEPLOYTOOL_CUDNN_VERBOSE: 1 plans and fused-call decisions, 2 also every call
  std::string error;
};

template <typename F>
void bind(void* lib, F* fn, const char* name, std::string* missing) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr) *missing += std::string(missing->empty() ? "" : ", ") + name;
}

const Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* verbose = std::getenv("DEPLOYTOOL_CUDNN_VERBOSE");
    a.verbose = verbose == nullptr ? 0 : (verbose[0] == '2' ? 2 : 1);
    std::string tried;
    void* lib = deploytool::dlopen_first("DEPLOYTOOL_CUDNN", {"libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"}, &tried);
    if (lib == nullptr) {
      a.error = "cuDNN not found (tried " + tried +
                "): install it (pip's nvidia-cudnn, as torch does, or the system's libcudnn), or set "
                "DEPLOYTOOL_CUDNN to libcudnn.so's path; or rebuild without --cudnn";
      return;
    }
    std::string missing;
    bind(lib, &a.create, "cudnnCreate", &missing);
    bind(lib, &a.set_stream, "cudnnSetStream", &missing);
    bind(lib, &a.error_string, "cudnnGetErrorString", &missing);
    bind(lib, &a.create_tensor, "cudnnCreateTensorDescriptor", &missing);
    bind(lib, &a.set_tensor4d, "cudnnSetTensor4dDescriptor", &missing);
    bind(lib, &a.create_filter, "cudnnCreateFilterDescriptor", &missing);
    bind(lib, &a.set_filter4d, "cudnnSetFilter4dDescriptor", &missing);
    bind(lib, &a.create_conv, "cudnnCreateConvolutionDescriptor", &missing);
    bind(lib, &a.set_conv2d, "cudnnSetConvolution2dDescriptor", &missing);
    bind(lib, &a.set_math, "cudnnSetConvolutionMathType", &missing);
    bind(lib, &a.set_groups, "cudnnSetConvolutionGroupCount", &missing);
    bind(lib, &a.create_act, "cudnnCreateActivationDescriptor", &missing);
    bind(lib, &a.set_act, "cudnnSetActivationDescriptor", &missing);
    bind(lib, &a.find_ex, "cudnnFindConvolutionForwardAlgorithmEx", &missing);
    bind(lib, &a.ws_size, "cudnnGetConvolutionForwardWorkspaceSize", &missing);
    bind(lib, &a.forward, "cudnnConvolutionForward", &missing);
    bind(lib, &a.fused, "cudnnConvolutionBiasActivationForward", &missing);
    bind(lib, &a.add_tensor, "cudnnAddTensor", &missing);
    bind(lib, &a.activation, "cudnnActivationForward", &missing);
    // TVM's runtime, loaded (globally) by whatever loaded this artifact
    bind(RTLD_DEFAULT, &a.alloc_ws, "TVMBackendAllocWorkspace", &missing);
    bind(RTLD_DEFAULT, &a.free_ws, "TVMBackendFreeWorkspace", &missing);
    if (!missing.empty()) a.error = "the cuDNN / TVM runtime found lacks " + missing;
  });
  return a;
}

void check(Status s, const char* what) {
  if (s != 0) {
    const char* msg = api().error_string ? api().error_string(s) : "";
    TVM_FFI_THROW(RuntimeError) << "deploytool.cudnn.conv2d: " << what << " failed: " << msg << " (status " << s
                                << ")";
  }
}

Handle handle_for(int device) {
  // one handle per device and host thread (cuDNN handles are not thread-safe)
  thread_local std::map<int, Handle> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  Handle h = nullptr;
  check(api().create(&h), "cudnnCreate");
  handles[device] = h;
  return h;
}

struct Workspace {  // TVM's pooled device memory for one call
  int device;
  void* ptr = nullptr;
  Workspace(int dev, size_t bytes) : device(dev) {
    if (bytes > 0) {
      ptr = api().alloc_ws(kCUDA, dev, bytes, 2, 16);
      if (ptr == nullptr) TVM_FFI_THROW(RuntimeError) << "deploytool.cudnn.conv2d: no " << bytes << " B workspace";
    }
  }
  ~Workspace() {
    if (ptr != nullptr) api().free_ws(kCUDA, device, ptr);
  }
};

// what a convolution is, as the cache's key: device, x's and w's shapes, params
using Key = std::tuple<int, std::array<int64_t, 4>, std::array<int64_t, 4>, std::vector<int64_t>>;

// how a plan's epilogue runs: not tried yet (the first call with a bias tries the fused call)
enum class Mode { kUntried, kFused, kSeparate };

struct Plan {
  Desc x, w, y, bias, conv, act_relu, act_identity;
  int algo = 0;
  size_t workspace = 0;
  Mode mode = Mode::kUntried;
};

std::array<int64_t, 4> dims(const DLTensor* t) { return {t->shape[0], t->shape[1], t->shape[2], t->shape[3]}; }

void* data(const DLTensor* t) { return static_cast<char*>(t->data) + t->byte_offset; }

void expect_half(const DLTensor* t, const char* what, int ndim) {
  if (t->ndim != ndim || t->dtype.code != kDLFloat || t->dtype.bits != 16 || t->dtype.lanes != 1 ||
      !tvm::ffi::IsContiguous(*t) || t->device.device_type != kDLCUDA)
    TVM_FFI_THROW(TypeError) << "deploytool.cudnn.conv2d: " << what << " must be a contiguous " << ndim
                             << "-d float16 CUDA tensor";
}

Plan make_plan(Handle h, const std::vector<int64_t>& p, const DLTensor* x, const DLTensor* w, DLTensor* y) {
  const Api& f = api();
  Plan pl;
  const int groups = static_cast<int>(p[6]);
  check(f.create_tensor(&pl.x), "cudnnCreateTensorDescriptor");
  check(f.set_tensor4d(pl.x, kNHWC, kHalf, x->shape[0], x->shape[3], x->shape[1], x->shape[2]), "x descriptor");
  check(f.create_tensor(&pl.y), "cudnnCreateTensorDescriptor");
  check(f.set_tensor4d(pl.y, kNHWC, kHalf, y->shape[0], y->shape[3], y->shape[1], y->shape[2]), "y descriptor");
  check(f.create_tensor(&pl.bias), "cudnnCreateTensorDescriptor");
  check(f.set_tensor4d(pl.bias, kNCHW, kHalf, 1, y->shape[3], 1, 1), "bias descriptor");
  check(f.create_filter(&pl.w), "cudnnCreateFilterDescriptor");
  check(f.set_filter4d(pl.w, kHalf, kNHWC, w->shape[0], w->shape[3], w->shape[1], w->shape[2]), "w descriptor");
  check(f.create_conv(&pl.conv), "cudnnCreateConvolutionDescriptor");
  check(f.set_conv2d(pl.conv, p[2], p[3], p[0], p[1], p[4], p[5], kCrossCorrelation, kFloat), "conv descriptor");
  check(f.set_math(pl.conv, kTensorOpMath), "cudnnSetConvolutionMathType");
  if (groups != 1) check(f.set_groups(pl.conv, groups), "cudnnSetConvolutionGroupCount");
  check(f.create_act(&pl.act_relu), "cudnnCreateActivationDescriptor");
  check(f.set_act(pl.act_relu, kReLU, kNotPropagateNan, 0.0), "activation descriptor");
  check(f.create_act(&pl.act_identity), "cudnnCreateActivationDescriptor");
  check(f.set_act(pl.act_identity, kIdentity, kNotPropagateNan, 0.0), "activation descriptor");
  // the fastest algorithm, timed here on this GPU (y is scratch until the real call)
  size_t most = 0;
  for (int algo = 0; algo < kAlgoCount; ++algo) {
    size_t bytes = 0;
    if (f.ws_size(h, pl.x, pl.w, pl.conv, pl.y, algo, &bytes) == 0 && bytes <= kMaxWorkspace)
      most = std::max(most, bytes);
  }
  AlgoPerf perf[kAlgoCount];
  int found = 0;
  {
    Workspace ws(x->device.device_id, most);
    check(f.find_ex(h, pl.x, data(x), pl.w, data(w), pl.conv, pl.y, data(y), kAlgoCount, &found, perf, ws.ptr, most),
          "cudnnFindConvolutionForwardAlgorithmEx");
  }
  int best = -1;
  for (int i = 0; i < found; ++i) {
    if (perf[i].status == 0) {  // sorted fastest first
      best = i;
      break;
    }
  }
  if (best < 0) TVM_FFI_THROW(RuntimeError) << "deploytool.cudnn.conv2d: cuDNN has no algorithm for this convolution";
  pl.algo = perf[best].algo;
  pl.workspace = perf[best].memory;
  if (f.verbose)
    std::fprintf(stderr,
                 "deploytool.cudnn.conv2d x[%lld,%lld,%lld,%lld] w[%lld,%lld,%lld,%lld]: algo %d, %.3f ms, %zu B\n",
                 (long long)x->shape[0], (long long)x->shape[1], (long long)x->shape[2], (long long)x->shape[3],
                 (long long)w->shape[0], (long long)w->shape[1], (long long)w->shape[2], (long long)w->shape[3],
                 pl.algo, perf[best].time, pl.workspace);
  return pl;
}

Plan& plan_for(Handle h, const std::vector<int64_t>& p, const DLTensor* x, const DLTensor* w, DLTensor* y) {
  static std::mutex mu;
  static std::map<Key, Plan> plans;
  std::lock_guard<std::mutex> lock(mu);
  Key key{x->device.device_id, dims(x), dims(w), p};
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  return plans.emplace(key, make_plan(h, p, x, w, y)).first->second;
}

Status run_fused(Handle h, Plan& pl, bool relu, const DLTensor* x, const DLTensor* w, const DLTensor* bias,
                 const DLTensor* z, DLTensor* y) {
  const float one = 1.0f, zero = 0.0f;
  Workspace ws(x->device.device_id, pl.workspace);
  return api().fused(h, &one, pl.x, data(x), pl.w, data(w), pl.conv, pl.algo, ws.ptr, pl.workspace,
                     z ? &one : &zero, pl.y, z ? data(z) : data(y), pl.bias, data(bias),
                     relu ? pl.act_relu : pl.act_identity, pl.y, data(y));
}

void run_separate(Handle h, Plan& pl, bool relu, const DLTensor* x, const DLTensor* w, const DLTensor* bias,
                  const DLTensor* z, DLTensor* y) {
  const Api& f = api();
  const float one = 1.0f, zero = 0.0f;
  {
    Workspace ws(x->device.device_id, pl.workspace);
    check(f.forward(h, &one, pl.x, data(x), pl.w, data(w), pl.conv, pl.algo, ws.ptr, pl.workspace, &zero, pl.y,
                    data(y)),
          "cudnnConvolutionForward");
  }
  if (bias) check(f.add_tensor(h, &one, pl.bias, data(bias), &one, pl.y, data(y)), "cudnnAddTensor (bias)");
  if (z) check(f.add_tensor(h, &one, pl.y, data(z), &one, pl.y, data(y)), "cudnnAddTensor (residual)");
  if (relu) check(f.activation(h, pl.act_relu, &one, pl.y, data(y), &zero, pl.y, data(y)), "cudnnActivationForward");
}

void Conv2d(tvm::ffi::PackedArgs args, tvm::ffi::Any* /*rv*/) {
  const Api& f = api();
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
  const int device = x->device.device_id;
  Handle h = handle_for(device);
  check(f.set_stream(h, TVMFFIEnvGetStream(kDLCUDA, device)), "cudnnSetStream");
  Plan& pl = plan_for(h, p, x, w, y);
  const bool epilogue = relu || bias || z;
  if (f.verbose == 2)
    std::fprintf(stderr, "deploytool.cudnn.conv2d call: x %p w %p b %p z %p y %p algo %d ws %zu mode %d\n", data(x),
                 data(w), bias ? data(bias) : nullptr, z ? data(z) : nullptr, data(y), pl.algo, pl.workspace,
                 static_cast<int>(pl.mode));
  if (!epilogue) {
    run_separate(h, pl, false, x, w, nullptr, nullptr, y);
    return;
  }
  // the fused call needs a bias; ReLU or identity after it (identity with one algorithm only)
  if (bias && pl.mode == Mode::kUntried) {
    int algo = pl.algo;
    if (!relu) pl.algo = kImplicitPrecompGemm;
    size_t bytes = pl.workspace;
    if (!relu && f.ws_size(h, pl.x, pl.w, pl.conv, pl.y, pl.algo, &bytes) != 0) bytes = 0;
    const size_t kept = pl.workspace;
    pl.workspace = bytes;
    const Status st = run_fused(h, pl, relu, x, w, bias, z, y);
    if (f.verbose)
      std::fprintf(stderr, "deploytool.cudnn.conv2d: fused bias%s%s: %s (status %d)\n", z ? "+residual" : "",
                   relu ? "+relu" : "", st == 0 ? "taken" : "refused, separate calls", st);
    if (st == 0) {
      pl.mode = Mode::kFused;
      return;
    }
    pl.algo = algo;
    pl.workspace = kept;
    pl.mode = Mode::kSeparate;
  } else if (bias && pl.mode == Mode::kFused) {
    check(run_fused(h, pl, relu, x, w, bias, z, y), "cudnnConvolutionBiasActivationForward");
    return;
  }
  run_separate(h, pl, relu, x, w, bias, z, y);
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  refl::GlobalDef().def_packed("deploytool.cudnn.conv2d", Conv2d);
}
