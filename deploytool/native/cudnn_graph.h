// One float16 NHWC convolution with its epilogue (bias, residual, ReLU) as a cuDNN graph, through
// cuDNN's backend ("graph") API, the API torch reaches cuDNN by: cuDNN 9's legacy API
// (cudnnConvolutionForward & co.) offered only its implicit-GEMM algorithms on the H200, at 6-55
// TFLOP/s on ResNet-50's convolutions (deploytool/cudnn.py).
//
// No cuDNN or CUDA header is needed: the entry points are declared here (cudnn_graph.h's values,
// stable across cuDNN 8 and 9) and resolved with dlopen; CUDA events for timing come from the
// driver (libcuda.so.1). Nothing here knows TVM: native/cudnn_conv.cc is the artifact's glue, and
// bench/cudnn_convs.cc drives the same code from torch's buffers.
//
//   y = relu?(conv(x, w) + bias? + z?)       x[N,H,W,C] w[K,R,S,C/g] bias[K] z,y[N,P,Q,K] float16
//
// The convolution accumulates in float32 and the epilogue runs in float32 on the accumulator
// (virtual tensors), one rounding to float16 at the end. A Plan is built once per shape: the
// graph, cuDNN's heuristics (mode A, then the fallback list), and, where more than one engine
// configuration finalizes, each of the first `candidates` timed on the call's own buffers (y is
// scratch until the real call), the fastest kept.
#pragma once

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "dlopen_first.h"

namespace deploytool {
namespace cudnn_graph {

// cudnn_graph.h's values
enum : int { kDataFloat = 0, kDataHalf = 2 };
enum : int { kCrossCorrelation = 1 };
enum : int { kPointwiseAdd = 0, kPointwiseReluFwd = 100 };
enum : int { kHeurModeA = 3, kHeurModeFallback = 2 };
enum : int {  // cudnnBackendAttributeType_t
  kTypeHandle = 0, kTypeDataType = 1, kTypeBoolean = 2, kTypeInt64 = 3, kTypeFloat = 4, kTypeVoidPtr = 6,
  kTypeConvolutionMode = 7, kTypeHeurMode = 8, kTypePointwiseMode = 14, kTypeBackendDescriptor = 15,
};
enum : int {  // cudnnBackendDescriptorType_t
  kPointwiseDesc = 0, kConvolutionDesc = 1, kEngineCfgDesc = 3, kEngineHeurDesc = 4, kExecutionPlanDesc = 5,
  kOpConvForwardDesc = 10, kOpPointwiseDesc = 13, kOpGraphDesc = 15, kVariantPackDesc = 16, kTensorDesc = 17,
};
enum : int {  // cudnnBackendAttributeName_t
  kPointwiseMode = 0, kPointwiseMathPrec = 1,
  kConvCompType = 100, kConvMode = 101, kConvDilations = 102, kConvStrides = 103, kConvPostPad = 104,
  kConvPrePad = 105, kConvSpatialDims = 106,
  kHeurMode = 200, kHeurOpGraph = 201, kHeurResults = 202,
  kPlanHandle = 400, kPlanEngineConfig = 401, kPlanWorkspaceSize = 402,
  kConvFwdAlpha = 700, kConvFwdBeta = 701, kConvFwdConvDesc = 702, kConvFwdW = 703, kConvFwdX = 704, kConvFwdY = 705,
  kOpPwDesc = 750, kOpPwX = 751, kOpPwB = 752, kOpPwY = 753,
  kOpGraphHandle = 800, kOpGraphOps = 801,
  kTensorAlignment = 900, kTensorDataType = 901, kTensorDims = 902, kTensorStrides = 903, kTensorUid = 906,
  kTensorVirtual = 907,
  kPackUids = 1000, kPackPointers = 1001, kPackWorkspace = 1003,
};

using Status = int;
using Handle = void*;
using Desc = void*;

struct Api {
  Status (*create)(Handle*) = nullptr;
  Status (*set_stream)(Handle, void*) = nullptr;
  const char* (*error_string)(Status) = nullptr;
  void (*last_error)(char*, size_t) = nullptr;  // cuDNN 9 only
  Status (*create_desc)(int, Desc*) = nullptr;
  Status (*destroy_desc)(Desc) = nullptr;
  Status (*finalize)(Desc) = nullptr;
  Status (*set)(Desc, int, int, int64_t, const void*) = nullptr;
  Status (*get)(Desc, int, int, int64_t, int64_t*, void*) = nullptr;
  Status (*execute)(Handle, Desc, Desc) = nullptr;
  // the driver's events, for timing candidates
  int (*event_create)(void**, unsigned) = nullptr;
  int (*event_record)(void*, void*) = nullptr;
  int (*event_sync)(void*) = nullptr;
  int (*event_elapsed)(float*, void*, void*) = nullptr;
  int (*event_destroy)(void*) = nullptr;
  void* lib = nullptr;  // libcudnn's handle, for callers that need more of it
  std::string error;    // why cuDNN cannot be used here, or empty
};

template <typename F>
void bind(void* lib, F* fn, const char* name, std::string* missing) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr && missing != nullptr) *missing += std::string(missing->empty() ? "" : ", ") + name;
}

inline const Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    void* lib = a.lib = dlopen_first("DEPLOYTOOL_CUDNN", {"libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"}, &tried);
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
    bind(lib, &a.last_error, "cudnnGetLastErrorString", nullptr);
    bind(lib, &a.create_desc, "cudnnBackendCreateDescriptor", &missing);
    bind(lib, &a.destroy_desc, "cudnnBackendDestroyDescriptor", &missing);
    bind(lib, &a.finalize, "cudnnBackendFinalize", &missing);
    bind(lib, &a.set, "cudnnBackendSetAttribute", &missing);
    bind(lib, &a.get, "cudnnBackendGetAttribute", &missing);
    bind(lib, &a.execute, "cudnnBackendExecute", &missing);
    void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (cuda == nullptr) {
      missing += std::string(missing.empty() ? "" : ", ") + "libcuda.so.1";
    } else {
      bind(cuda, &a.event_create, "cuEventCreate", &missing);
      bind(cuda, &a.event_record, "cuEventRecord", &missing);
      bind(cuda, &a.event_sync, "cuEventSynchronize", &missing);
      bind(cuda, &a.event_elapsed, "cuEventElapsedTime", &missing);
      bind(cuda, &a.event_destroy, "cuEventDestroy_v2", &missing);
    }
    if (!missing.empty()) a.error = "the cuDNN / CUDA driver found lacks " + missing;
  });
  return a;
}

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline std::string describe(Status s) {
  const Api& f = api();
  std::string msg = f.error_string ? f.error_string(s) : "";
  if (f.last_error) {
    char last[512] = {0};
    f.last_error(last, sizeof(last));
    if (last[0]) msg += std::string(": ") + last;
  }
  return msg + " (status " + std::to_string(s) + ")";
}

inline void check(Status s, const std::string& what) {
  if (s != 0) throw Error("cuDNN " + what + " failed: " + describe(s));
}

// What one call computes. Shapes in elements; x is [n, h, w, c], y [n, p, q, k].
struct Conv {
  int64_t n, h, w, c, k, r, s, p, q;
  int64_t stride[2], pad[2], dilation[2], groups;
  bool bias, residual, relu;
};

struct Buffers {
  const void* x;
  const void* w;
  const void* bias;  // or nullptr
  const void* z;     // or nullptr
  void* y;
};

// device memory for workspaces: the caller's pool (TVM's in an artifact, cudaMalloc in the bench)
struct Memory {
  std::function<void*(size_t)> alloc;
  std::function<void(void*)> release;
};

// Owns the descriptors of one graph and its plan (a plan refers to the graph's descriptors).
class Plan {
 public:
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (pack_ != nullptr) api().destroy_desc(pack_);
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) api().destroy_desc(*it);
  }

  // Builds the graph for `conv`, takes cuDNN's engine configurations for it (heuristics mode A,
  // then the fallback list), finalizes up to `candidates` of them and times those on `buf`
  // (`repeats` launches each, after one warm-up) on `stream`, keeping the fastest. Without the
  // epilogue in the graph (`fuse` false) only the convolution is planned. Throws Error when no
  // configuration finalizes.
  static std::unique_ptr<Plan> make(Handle h, const Conv& conv, bool fuse, const Buffers& buf, void* stream,
                                    const Memory& mem, int candidates, int repeats, int verbose) {
    std::unique_ptr<Plan> pl(new Plan());
    pl->fused_ = fuse;
    Desc graph = pl->build_graph(h, conv, fuse);
    std::vector<Desc> cfgs = pl->engine_configs(graph, kHeurModeA);
    std::vector<Desc> fallback = pl->engine_configs(graph, kHeurModeFallback);
    cfgs.insert(cfgs.end(), fallback.begin(), fallback.end());
    struct Candidate {
      Desc plan;
      int64_t workspace;
      int index;
    };
    std::vector<Candidate> ok;
    std::string first_error;
    for (size_t i = 0; i < cfgs.size() && static_cast<int>(ok.size()) < std::max(candidates, 1); ++i) {
      Desc plan = pl->make_desc(kExecutionPlanDesc);
      Status st = api().set(plan, kPlanHandle, kTypeHandle, 1, &h);
      if (st == 0) st = api().set(plan, kPlanEngineConfig, kTypeBackendDescriptor, 1, &cfgs[i]);
      if (st == 0) st = api().finalize(plan);
      int64_t ws = 0, n = 0;
      if (st == 0) st = api().get(plan, kPlanWorkspaceSize, kTypeInt64, 1, &n, &ws);
      if (st != 0) {
        if (first_error.empty()) first_error = describe(st);
        continue;
      }
      ok.push_back({plan, ws, static_cast<int>(i)});
    }
    if (ok.empty())
      throw Error("cuDNN has no engine for this convolution" + std::string(fuse ? " with its epilogue" : "") + " (" +
                  std::to_string(cfgs.size()) + " configurations" +
                  (first_error.empty() ? "" : ", the first refused: " + first_error) + ")");
    size_t best = 0;
    std::vector<float> ms(ok.size(), 0.0f);
    if (ok.size() > 1) {
      int64_t most = 0;
      for (const Candidate& c : ok) most = std::max(most, c.workspace);
      void* ws = most > 0 ? mem.alloc(static_cast<size_t>(most)) : nullptr;
      if (most > 0 && ws == nullptr) throw Error("no device memory for a " + std::to_string(most) + " B workspace");
      const Api& f = api();
      void *start = nullptr, *stop = nullptr;
      f.event_create(&start, 0);
      f.event_create(&stop, 0);
      for (size_t i = 0; i < ok.size(); ++i) {
        pl->plan_ = ok[i].plan;
        if (pl->execute(h, buf, ws) != 0) {  // warm-up; a configuration that fails to run is not kept
          ms[i] = -1.0f;
          continue;
        }
        f.event_record(start, stream);
        for (int r = 0; r < repeats; ++r) pl->execute(h, buf, ws);
        f.event_record(stop, stream);
        f.event_sync(stop);
        f.event_elapsed(&ms[i], start, stop);
        ms[i] /= static_cast<float>(std::max(repeats, 1));
        if (ms[best] < 0 || ms[i] < ms[best]) best = i;
      }
      f.event_destroy(start);
      f.event_destroy(stop);
      if (ws != nullptr) mem.release(ws);
      if (ms[best] < 0) throw Error("none of cuDNN's engines for this convolution ran");
    }
    pl->plan_ = ok[best].plan;
    pl->workspace_ = ok[best].workspace;
    pl->chosen_ = ok[best].index;
    pl->configs_ = static_cast<int>(cfgs.size());
    if (verbose) {
      std::fprintf(stderr,
                   "deploytool.cudnn.conv2d x[%lld,%lld,%lld,%lld] w[%lld,%lld,%lld,%lld]%s%s%s: %s configuration %d "
                   "of %d (%zu timed:",
                   (long long)conv.n, (long long)conv.h, (long long)conv.w, (long long)conv.c, (long long)conv.k,
                   (long long)conv.r, (long long)conv.s, (long long)(conv.c / conv.groups),
                   conv.bias ? " +bias" : "", conv.residual ? " +z" : "", conv.relu ? " relu" : "",
                   fuse ? "fused," : "conv alone,", pl->chosen_, pl->configs_, ok.size());
      for (size_t i = 0; i < ok.size(); ++i) std::fprintf(stderr, " #%d %.4f ms", ok[i].index, ms[i]);
      std::fprintf(stderr, "), workspace %lld B\n", (long long)pl->workspace_);
    }
    return pl;
  }

  // one launch on the handle's stream; returns cuDNN's status. The variant pack (the pointers) is
  // kept from the last launch and made again only when a pointer changed: an artifact's buffers
  // stay where its memory plan put them, and a pack costs microseconds of host time to make.
  Status execute(Handle h, const Buffers& buf, void* workspace) const {
    std::array<void*, 6> ptrs{const_cast<void*>(buf.x), const_cast<void*>(buf.w), buf.y,
                              fused_ ? const_cast<void*>(buf.bias) : nullptr,
                              fused_ ? const_cast<void*>(buf.z) : nullptr, workspace};
    std::lock_guard<std::mutex> lock(pack_mu_);
    if (pack_ == nullptr || ptrs != pack_ptrs_) {
      if (pack_ != nullptr) api().destroy_desc(pack_);
      pack_ = nullptr;
      void* data[5];
      int64_t uids[5];
      const int64_t all[5] = {kX, kW, kY, kBias, kZ};
      int n = 0;
      for (int i = 0; i < 5; ++i) {
        if (ptrs[i] == nullptr) continue;
        uids[n] = all[i];
        data[n++] = ptrs[i];
      }
      Desc pack = nullptr;
      Status st = api().create_desc(kVariantPackDesc, &pack);
      if (st != 0) return st;
      st = api().set(pack, kPackPointers, kTypeVoidPtr, n, data);
      if (st == 0) st = api().set(pack, kPackUids, kTypeInt64, n, uids);
      if (st == 0) st = api().set(pack, kPackWorkspace, kTypeVoidPtr, 1, &ptrs[5]);
      if (st == 0) st = api().finalize(pack);
      if (st != 0) {
        api().destroy_desc(pack);
        return st;
      }
      pack_ = pack;
      pack_ptrs_ = ptrs;
    }
    return api().execute(h, plan_, pack_);
  }

  int64_t workspace() const { return workspace_; }
  int chosen() const { return chosen_; }
  int configs() const { return configs_; }

 private:
  enum : int64_t { kX = 1, kW = 2, kBias = 3, kZ = 4, kY = 5, kVirtual = 10 };
  Plan() = default;

  Desc make_desc(int type) {
    Desc d = nullptr;
    check(api().create_desc(type, &d), "cudnnBackendCreateDescriptor(" + std::to_string(type) + ")");
    owned_.push_back(d);
    return d;
  }
  static void set(Desc d, int attr, int type, int64_t count, const void* values) {
    check(api().set(d, attr, type, count, values), "cudnnBackendSetAttribute(" + std::to_string(attr) + ")");
  }
  static void finalize(Desc d, const char* what) { check(api().finalize(d), std::string("finalizing the ") + what); }

  // a 4-d tensor given in NCHW order with NHWC strides (cuDNN's "channels last")
  Desc tensor(int64_t uid, int dtype, int64_t n, int64_t c, int64_t h, int64_t w, bool is_virtual) {
    Desc t = make_desc(kTensorDesc);
    const int64_t dims[4] = {n, c, h, w}, strides[4] = {c * h * w, 1, w * c, c}, align = 16;
    const bool virt = is_virtual;
    set(t, kTensorDataType, kTypeDataType, 1, &dtype);
    set(t, kTensorDims, kTypeInt64, 4, dims);
    set(t, kTensorStrides, kTypeInt64, 4, strides);
    set(t, kTensorUid, kTypeInt64, 1, &uid);
    set(t, kTensorAlignment, kTypeInt64, 1, &align);
    set(t, kTensorVirtual, kTypeBoolean, 1, &virt);
    finalize(t, "tensor descriptor");
    return t;
  }

  Desc pointwise(int mode, Desc x, Desc b, Desc y) {
    Desc pw = make_desc(kPointwiseDesc);
    const int prec = kDataFloat;
    set(pw, kPointwiseMode, kTypePointwiseMode, 1, &mode);
    set(pw, kPointwiseMathPrec, kTypeDataType, 1, &prec);
    finalize(pw, "pointwise descriptor");
    Desc op = make_desc(kOpPointwiseDesc);
    set(op, kOpPwDesc, kTypeBackendDescriptor, 1, &pw);
    set(op, kOpPwX, kTypeBackendDescriptor, 1, &x);
    if (b != nullptr) set(op, kOpPwB, kTypeBackendDescriptor, 1, &b);
    set(op, kOpPwY, kTypeBackendDescriptor, 1, &y);
    finalize(op, "pointwise operation");
    return op;
  }

  Desc build_graph(Handle h, const Conv& cv, bool fuse) {
    const bool epilogue = fuse && (cv.bias || cv.residual || cv.relu);
    int next_virtual = kVirtual;
    // the value after each step: the output y at the last step, a float32 virtual tensor before
    int steps = epilogue ? static_cast<int>(cv.bias) + static_cast<int>(cv.residual) + static_cast<int>(cv.relu) : 0;
    auto out = [&]() {
      return steps-- == 0 ? tensor(kY, kDataHalf, cv.n, cv.k, cv.p, cv.q, false)
                          : tensor(next_virtual++, kDataFloat, cv.n, cv.k, cv.p, cv.q, true);
    };
    Desc x = tensor(kX, kDataHalf, cv.n, cv.c, cv.h, cv.w, false);
    Desc w = tensor(kW, kDataHalf, cv.k, cv.c / cv.groups, cv.r, cv.s, false);
    Desc conv = make_desc(kConvolutionDesc);
    const int64_t dims = 2;
    const int comp = kDataFloat, mode = kCrossCorrelation;
    set(conv, kConvSpatialDims, kTypeInt64, 1, &dims);
    set(conv, kConvCompType, kTypeDataType, 1, &comp);
    set(conv, kConvMode, kTypeConvolutionMode, 1, &mode);
    set(conv, kConvDilations, kTypeInt64, 2, cv.dilation);
    set(conv, kConvStrides, kTypeInt64, 2, cv.stride);
    set(conv, kConvPrePad, kTypeInt64, 2, cv.pad);
    set(conv, kConvPostPad, kTypeInt64, 2, cv.pad);
    finalize(conv, "convolution descriptor");
    Desc y = out();
    Desc op = make_desc(kOpConvForwardDesc);
    const float alpha = 1.0f, beta = 0.0f;
    set(op, kConvFwdX, kTypeBackendDescriptor, 1, &x);
    set(op, kConvFwdW, kTypeBackendDescriptor, 1, &w);
    set(op, kConvFwdY, kTypeBackendDescriptor, 1, &y);
    set(op, kConvFwdConvDesc, kTypeBackendDescriptor, 1, &conv);
    set(op, kConvFwdAlpha, kTypeFloat, 1, &alpha);
    set(op, kConvFwdBeta, kTypeFloat, 1, &beta);
    finalize(op, "convolution operation");
    std::vector<Desc> ops{op};
    if (epilogue && cv.bias) {
      Desc b = tensor(kBias, kDataHalf, 1, cv.k, 1, 1, false);
      Desc next = out();
      ops.push_back(pointwise(kPointwiseAdd, y, b, next));
      y = next;
    }
    if (epilogue && cv.residual) {
      Desc z = tensor(kZ, kDataHalf, cv.n, cv.k, cv.p, cv.q, false);
      Desc next = out();
      ops.push_back(pointwise(kPointwiseAdd, y, z, next));
      y = next;
    }
    if (epilogue && cv.relu) ops.push_back(pointwise(kPointwiseReluFwd, y, nullptr, out()));
    Desc graph = make_desc(kOpGraphDesc);
    set(graph, kOpGraphOps, kTypeBackendDescriptor, static_cast<int64_t>(ops.size()), ops.data());
    set(graph, kOpGraphHandle, kTypeHandle, 1, &h);
    finalize(graph, "operation graph");
    return graph;
  }

  // the engine configurations cuDNN's heuristics give for the graph, best first (none on a refusal)
  std::vector<Desc> engine_configs(Desc graph, int mode) {
    Desc heur = make_desc(kEngineHeurDesc);
    set(heur, kHeurOpGraph, kTypeBackendDescriptor, 1, &graph);
    set(heur, kHeurMode, kTypeHeurMode, 1, &mode);
    if (api().finalize(heur) != 0) return {};
    int64_t count = 0;
    if (api().get(heur, kHeurResults, kTypeBackendDescriptor, 0, &count, nullptr) != 0 || count <= 0) return {};
    std::vector<Desc> cfgs;
    for (int64_t i = 0; i < count; ++i) cfgs.push_back(make_desc(kEngineCfgDesc));
    int64_t got = 0;
    if (api().get(heur, kHeurResults, kTypeBackendDescriptor, count, &got, cfgs.data()) != 0) return {};
    cfgs.resize(static_cast<size_t>(std::max<int64_t>(0, std::min(got, count))));
    return cfgs;
  }

  std::vector<Desc> owned_;
  Desc plan_ = nullptr;
  int64_t workspace_ = 0;
  bool fused_ = true;
  int chosen_ = 0, configs_ = 0;
  mutable std::mutex pack_mu_;
  mutable Desc pack_ = nullptr;
  mutable std::array<void*, 6> pack_ptrs_{};
};

}  // namespace cudnn_graph
}  // namespace deploytool
