// deploytool.cublas.matmul: the float16 matmuls of a --cublas CUDA build, on cuBLAS's tensor-core
// GEMMs (see deploytool/cublas.py). Linked into the artifact; registers the function when the .so
// is loaded.
//
// It needs no CUDA toolkit to build: the few cuBLAS entry points it calls are declared here and
// resolved with dlopen at the first call (libcublas.so.13, .so.12, .so, or $DEPLOYTOOL_CUBLAS),
// so a machine without a GPU still builds GPU artifacts.
//
// C[..., M, N] = A[..., M, K] @ B[K, N] (one GEMM over all of A's leading rows), or with B[..., K, N]
// of the same leading dims as A (strided batched GEMM). Row-major tensors; in cuBLAS's
// column-major terms C^T = B^T A^T, so B is passed first. float16 operands; float16 or float32
// output; float32 accumulation (what torch and onnxruntime do for float16 GEMMs).

#include <dlfcn.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

#include "dlopen_first.h"
#include "register_once.h"

namespace {

using Handle = void*;
using Status = int;
constexpr int kOpN = 0;                 // CUBLAS_OP_N
constexpr int kR16F = 2, kR32F = 0;     // CUDA_R_16F, CUDA_R_32F
constexpr int kCompute32F = 68;         // CUBLAS_COMPUTE_32F
constexpr int kGemmDefaultTensorOp = 99;  // CUBLAS_GEMM_DEFAULT_TENSOR_OP

using CreateFn = Status (*)(Handle*);
using SetStreamFn = Status (*)(Handle, void*);
using GemmExFn = Status (*)(Handle, int, int, int, int, int, const void*, const void*, int, int, const void*, int,
                            int, const void*, void*, int, int, int, int);
using GemmBatchedFn = Status (*)(Handle, int, int, int, int, int, const void*, const void*, int, int, long long,
                                 const void*, int, int, long long, const void*, void*, int, int, long long, int, int,
                                 int);

struct Api {
  CreateFn create = nullptr;
  SetStreamFn set_stream = nullptr;
  GemmExFn gemm = nullptr;
  GemmBatchedFn gemm_batched = nullptr;
  std::string error;
};

const Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    std::string tried;
    void* lib =
        deploytool::dlopen_first("DEPLOYTOOL_CUBLAS", {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}, &tried);
    if (lib == nullptr) {
      a.error = "cuBLAS not found (tried " + tried +
                "): install it (the CUDA toolkit, or pip's nvidia-cublas), or set DEPLOYTOOL_CUBLAS to "
                "libcublas.so's path; or rebuild without --cublas";
      return;
    }
    a.create = reinterpret_cast<CreateFn>(dlsym(lib, "cublasCreate_v2"));
    a.set_stream = reinterpret_cast<SetStreamFn>(dlsym(lib, "cublasSetStream_v2"));
    a.gemm = reinterpret_cast<GemmExFn>(dlsym(lib, "cublasGemmEx"));
    a.gemm_batched = reinterpret_cast<GemmBatchedFn>(dlsym(lib, "cublasGemmStridedBatchedEx"));
    if (!a.create || !a.set_stream || !a.gemm || !a.gemm_batched) a.error = "libcublas lacks cublasGemmEx";
  });
  return a;
}

Handle handle_for(int device) {
  // one handle per device and host thread (cuBLAS handles are not thread-safe)
  thread_local std::unordered_map<int, Handle> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  Handle h = nullptr;
  Status s = api().create(&h);
  if (s != 0) TVM_FFI_THROW(RuntimeError) << "cublasCreate failed (status " << s << ")";
  handles[device] = h;
  return h;
}

int cuda_type(const DLTensor* t, const char* what) {
  if (t->dtype.code == kDLFloat && t->dtype.bits == 16 && t->dtype.lanes == 1) return kR16F;
  if (t->dtype.code == kDLFloat && t->dtype.bits == 32 && t->dtype.lanes == 1) return kR32F;
  TVM_FFI_THROW(TypeError) << "deploytool.cublas.matmul: " << what << " must be float16 or float32";
  return -1;
}

void* data(const DLTensor* t) { return static_cast<char*>(t->data) + t->byte_offset; }

void Matmul(DLTensor* a, DLTensor* b, DLTensor* c) {
  const Api& f = api();
  if (!f.error.empty()) TVM_FFI_THROW(RuntimeError) << f.error;
  if (a->ndim < 2 || b->ndim < 2 || c->ndim != a->ndim)
    TVM_FFI_THROW(ValueError) << "deploytool.cublas.matmul: A[..., M, K] @ B[K, N] or B[..., K, N] expected";
  if (!tvm::ffi::IsContiguous(*a) || !tvm::ffi::IsContiguous(*b) || !tvm::ffi::IsContiguous(*c))
    TVM_FFI_THROW(ValueError) << "deploytool.cublas.matmul: contiguous tensors expected";
  const int64_t m = a->shape[a->ndim - 2], k = a->shape[a->ndim - 1], n = b->shape[b->ndim - 1];
  if (b->shape[b->ndim - 2] != k || c->shape[c->ndim - 1] != n || c->shape[c->ndim - 2] != m)
    TVM_FFI_THROW(ValueError) << "deploytool.cublas.matmul: shapes do not match";
  int64_t batch = 1;
  for (int i = 0; i < a->ndim - 2; ++i) batch *= a->shape[i];
  const int ta = cuda_type(a, "A"), tb = cuda_type(b, "B"), tc = cuda_type(c, "C");
  if (ta != kR16F || tb != kR16F) TVM_FFI_THROW(TypeError) << "deploytool.cublas.matmul: float16 operands expected";
  Handle h = handle_for(a->device.device_id);
  void* stream = TVMFFIEnvGetStream(kDLCUDA, a->device.device_id);
  Status s = f.set_stream(h, stream);
  if (s != 0) TVM_FFI_THROW(RuntimeError) << "cublasSetStream failed (status " << s << ")";
  const float alpha = 1.0f, beta = 0.0f;
  if (b->ndim == 2) {  // one GEMM over every row of A
    s = f.gemm(h, kOpN, kOpN, static_cast<int>(n), static_cast<int>(batch * m), static_cast<int>(k), &alpha, data(b),
               tb, static_cast<int>(n), data(a), ta, static_cast<int>(k), &beta, data(c), tc, static_cast<int>(n),
               kCompute32F, kGemmDefaultTensorOp);
  } else {
    int64_t b_batch = 1;
    for (int i = 0; i < b->ndim - 2; ++i) b_batch *= b->shape[i];
    if (b->ndim != a->ndim || b_batch != batch)
      TVM_FFI_THROW(ValueError) << "deploytool.cublas.matmul: batched B must have A's leading dims";
    s = f.gemm_batched(h, kOpN, kOpN, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, data(b),
                       tb, static_cast<int>(n), k * n, data(a), ta, static_cast<int>(k), m * k, &beta, data(c), tc,
                       static_cast<int>(n), m * n, static_cast<int>(batch), kCompute32F, kGemmDefaultTensorOp);
  }
  if (s != 0) TVM_FFI_THROW(RuntimeError) << "cublasGemmEx failed (status " << s << ")";
}

}  // namespace

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  if (deploytool::first_to_register("deploytool.cublas.matmul", reinterpret_cast<const void*>(&Matmul)))
    refl::GlobalDef().def("deploytool.cublas.matmul", Matmul);
}
