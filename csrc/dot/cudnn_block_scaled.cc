// The cuDNN graph behind csrc/dot/cudnn_block_scaled.h. The only translation unit that includes
// cudnn-frontend (a large header library: compile it as host C++ with g++, REFERENCE section 4).
//
// Graph (cuDNN >= 9.7, frontend >= 1.13, Blackwell; docs.nvidia.com/cudnn "Block Scaling"):
//   A  (B, M, K)  strides (M*K, K, 1)      --block_scale_dequantize(SA)--\
//                                                                       matmul (fp32) [* alpha] -> out
//   Bt (B, K, N)  strides (K*N, 1, K)      --block_scale_dequantize(SB)--/
// Bt is our rhs (B, N, K) read as K x N column-major. Scale tensors carry the padded dims of the
// F8_128x4 layout: SA (B, round_up(M, 128), K/blk), SB (B, K/blk, round_up(N, 128)), the K/blk
// index fastest in memory for both; cuDNN applies the 128x4 tile swizzle (REFERENCE section 3).
#include "csrc/dot/cudnn_block_scaled.h"

#include <cudnn_frontend.h>

#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "csrc/common/cuda_check.h"
#include "csrc/common/open_library.h"
#include "csrc/common/scoped_device.h"

#if !defined(NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)
#error "build with -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING: _cuda must import without libcudnn"
#endif
#if CUDNN_FRONTEND_VERSION < 11300
#error "cudnn-frontend >= 1.13 is needed: block_scale_dequantize with a per-axis block size vector"
#endif

// The frontend declares this handle and resolves every cuDNN entry point through it; we set it
// from our own dlopen of the library Python found.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace gpuext {

namespace {

namespace fe = cudnn_frontend;

Status FeError(const char* what, fe::error_t e) {
  return Status::Error(std::string("cuDNN ") + what + " failed: " + e.get_message());
}

#define GPUEXT_FE_RETURN_IF_ERROR(what, expr)            \
  do {                                                   \
    fe::error_t gpuext_fe_err_ = (expr);                 \
    if (gpuext_fe_err_.is_bad()) return FeError(what, gpuext_fe_err_); \
  } while (0)

#define GPUEXT_CUDNN_RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                              \
    cudnnStatus_t gpuext_cudnn_st_ = (expr);                                                        \
    if (gpuext_cudnn_st_ != CUDNN_STATUS_SUCCESS)                                                   \
      return Status::Error(std::string(GPUEXT_WHERE ": " #expr " failed: ") +                       \
                           fe::detail::get_error_string(gpuext_cudnn_st_));                         \
  } while (0)

Status LoadCudnn(const std::string& path) {
  static std::mutex mu;
  static std::string loaded_path;
  std::lock_guard<std::mutex> lock(mu);
  if (fe::cudnn_dlhandle != nullptr) {
    if (!path.empty() && path != loaded_path) {
      return Status::Error("cuDNN already loaded from " + loaded_path + ", asked for " + path);
    }
    return Status::Ok();
  }
  // cuDNN 9 loads its sub-libraries (libcudnn_graph, engines) from its own directory.
  void* lib = nullptr;
  Status s = OpenLibrary(path, {"libcudnn.so.9"}, &lib, &loaded_path);
  if (!s.ok()) return Status::Error("cuDNN: " + s.message() + " (install nvidia-cudnn-cu13/-cu12)");
  fe::cudnn_dlhandle = lib;
  return Status::Ok();
}

fe::DataType_t ElementType(CudnnElement e) {
  switch (e) {
    case CudnnElement::kE4M3: return fe::DataType_t::FP8_E4M3;
    case CudnnElement::kE5M2: return fe::DataType_t::FP8_E5M2;
    case CudnnElement::kE2M1: return fe::DataType_t::FP4_E2M1;
  }
  return fe::DataType_t::NOT_SET;
}

fe::DataType_t OutType(CudnnOut o) {
  switch (o) {
    case CudnnOut::kBF16: return fe::DataType_t::BFLOAT16;
    case CudnnOut::kF16: return fe::DataType_t::HALF;
    case CudnnOut::kF32: return fe::DataType_t::FLOAT;
  }
  return fe::DataType_t::NOT_SET;
}

int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// MXFP8: one E8M0 scale per 32 elements; NVFP4: one E4M3 scale per 16 (REFERENCE section 3).
struct ScaleSpec {
  int32_t block;
  fe::DataType_t type;
};
ScaleSpec ScaleOf(CudnnElement e) {
  return e == CudnnElement::kE2M1 ? ScaleSpec{16, fe::DataType_t::FP8_E4M3}
                                  : ScaleSpec{32, fe::DataType_t::FP8_E8M0};
}

// The block size per axis of the last two dims, as cudnn-frontend >= 1.13 samples pass it
// (samples/cpp/matmul/blackwell_nvfp4_mxfp8_block_scale_matmul.cpp): A (B, M, K) blocks along its
// last axis, {1, block}; Bt (B, K, N) along its middle one, {block, 1}. The frontend-1.10 scalar
// form left the axis for cuDNN to infer.
std::vector<int32_t> BlockAlongK(int32_t block, bool k_is_last) {
  return k_is_last ? std::vector<int32_t>{1, block} : std::vector<int32_t>{block, 1};
}

// Tensor uids: execute() binds device pointers by uid.
enum Uid : int64_t { kA = 1, kB, kScaleA, kScaleB, kAlpha, kOut };

using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int32_t, int32_t, int32_t, bool, bool, size_t>;

struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace_bytes = 0;
};

struct Device {
  cudnnHandle_t handle = nullptr;
  std::mutex mu;  // cudnnSetStream + execute on the shared handle
};

std::mutex g_mu;
std::map<int, std::unique_ptr<Device>>& Devices() {
  static auto* d = new std::map<int, std::unique_ptr<Device>>();
  return *d;
}
std::map<Key, Entry>& Graphs() {
  static auto* g = new std::map<Key, Entry>();
  return *g;
}

Status Build(const CudnnBlockScaledMatmul& p, int device, cudnnHandle_t handle, Entry* entry) {
  namespace g = fe::graph;
  auto graph = std::make_shared<g::Graph>();
  graph->set_intermediate_data_type(fe::DataType_t::FLOAT).set_compute_data_type(fe::DataType_t::FLOAT);
  // Our own (statically linked) cudart reads the SM version here, so the frontend's shim never
  // dlopens a libcudart.so for it (Context::populate_sm_version_from_device). The shim still does
  // for logging (CUDNN_FRONTEND_LOG_INFO) and error strings, and throws if both .so.12 and .so.13
  // load: gate cudnn_frontend_cudart refuses that environment first; Guarded catches the rest.
  int major = 0, minor = 0;
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  GPUEXT_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  graph->set_sm_version(major * 10 + minor);

  const int64_t b = p.batch, m = p.m, n = p.n, k = p.k;
  const ScaleSpec sa = ScaleOf(p.lhs_type), sb = ScaleOf(p.rhs_type);
  if (k % sa.block || k % sb.block || (k / sa.block) % 4 || (k / sb.block) % 4) {
    return Status::Error("K=" + std::to_string(k) + " must fill whole 4-wide columns of 128x4 scale tiles");
  }
  const int64_t ka = k / sa.block, kb = k / sb.block, mp = RoundUp(m, 128), np = RoundUp(n, 128);

  auto a = graph->tensor(g::Tensor_attributes()
                             .set_name("lhs")
                             .set_uid(kA)
                             .set_data_type(ElementType(p.lhs_type))
                             .set_dim({b, m, k})
                             .set_stride({m * k, k, 1}));
  auto bt = graph->tensor(g::Tensor_attributes()
                              .set_name("rhs")
                              .set_uid(kB)
                              .set_data_type(ElementType(p.rhs_type))
                              .set_dim({b, k, n})
                              .set_stride({k * n, 1, k}));
  auto scale_a = graph->tensor(g::Tensor_attributes()
                                   .set_name("lhs_scale")
                                   .set_uid(kScaleA)
                                   .set_data_type(sa.type)
                                   .set_dim({b, mp, ka})
                                   .set_stride({mp * ka, ka, 1})
                                   .set_reordering_type(fe::TensorReordering_t::F8_128x4));
  auto scale_b = graph->tensor(g::Tensor_attributes()
                                   .set_name("rhs_scale")
                                   .set_uid(kScaleB)
                                   .set_data_type(sb.type)
                                   .set_dim({b, kb, np})
                                   .set_stride({np * kb, 1, kb})
                                   .set_reordering_type(fe::TensorReordering_t::F8_128x4));
  auto dq_a = graph->block_scale_dequantize(
      a, scale_a,
      g::Block_scale_dequantize_attributes()
          .set_name("dq_lhs")
          .set_block_size(BlockAlongK(sa.block, /*k_is_last=*/true))
          .set_compute_data_type(fe::DataType_t::FLOAT));
  auto dq_b = graph->block_scale_dequantize(
      bt, scale_b,
      g::Block_scale_dequantize_attributes()
          .set_name("dq_rhs")
          .set_block_size(BlockAlongK(sb.block, /*k_is_last=*/false))
          .set_compute_data_type(fe::DataType_t::FLOAT));
  auto acc = graph->matmul(dq_a, dq_b,
                           g::Matmul_attributes().set_name("matmul").set_compute_data_type(fe::DataType_t::FLOAT));
  auto out = acc;
  if (p.fuse_alpha) {
    acc->set_data_type(fe::DataType_t::FLOAT);
    // A device scalar (not pass-by-value): the value may change between calls of one graph.
    auto alpha = graph->tensor(g::Tensor_attributes()
                                   .set_name("alpha")
                                   .set_uid(kAlpha)
                                   .set_data_type(fe::DataType_t::FLOAT)
                                   .set_dim({1, 1, 1})
                                   .set_stride({1, 1, 1}));
    out = graph->pointwise(acc, alpha,
                           g::Pointwise_attributes()
                               .set_name("global_scale")
                               .set_mode(fe::PointwiseMode_t::MUL)
                               .set_compute_data_type(fe::DataType_t::FLOAT));
  }
  out->set_output(true).set_uid(kOut).set_data_type(OutType(p.out_type)).set_dim({b, m, n}).set_stride(
      {m * n, n, 1});

  GPUEXT_FE_RETURN_IF_ERROR("validate", graph->validate());
  GPUEXT_FE_RETURN_IF_ERROR("build_operation_graph", graph->build_operation_graph(handle));
  GPUEXT_FE_RETURN_IF_ERROR("create_execution_plans",
                            graph->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}));
  if (p.drop_cublaslt_plans) {
    // Plans that call into cuBLASLt are not safe inside CUDA graphs (REFERENCE section 2).
    graph->deselect_behavior_notes({fe::BehaviorNote_t::CUBLASLT_DEPENDENCY});
  }
  graph->deselect_workspace_greater_than(static_cast<int64_t>(p.workspace_bytes));
  GPUEXT_FE_RETURN_IF_ERROR("check_support", graph->check_support());
  GPUEXT_FE_RETURN_IF_ERROR("build_plans", graph->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE));
  int64_t ws = 0;
  GPUEXT_FE_RETURN_IF_ERROR("get_workspace_size", graph->get_workspace_size(ws));
  if (ws < 0 || static_cast<size_t>(ws) > p.workspace_bytes) {
    return Status::Error("cuDNN plan wants " + std::to_string(ws) + " workspace bytes, the call provides " +
                         std::to_string(p.workspace_bytes));
  }
  entry->graph = std::move(graph);
  entry->workspace_bytes = ws;
  return Status::Ok();
}

// The device's handle, created on first use. Caller holds g_mu.
Status DeviceFor(int device, Device** out) {
  auto& devices = Devices();
  auto it = devices.find(device);
  if (it == devices.end()) {
    auto fresh = std::make_unique<Device>();
    GPUEXT_CUDNN_RETURN_IF_ERROR(fe::detail::create_handle(&fresh->handle));
    it = devices.emplace(device, std::move(fresh)).first;
  }
  *out = it->second.get();
  return Status::Ok();
}

// The graph of `p` on `device`, built on first use and cached for the process (one lock for the
// rare builds: at most one build per key). Caller holds g_mu; lock order is g_mu, then dev->mu.
Status CachedGraph(const CudnnBlockScaledMatmul& p, int device, Device* dev, Entry* out) {
  Key key{device,
          p.batch,
          p.m,
          p.n,
          p.k,
          static_cast<int32_t>(p.lhs_type),
          static_cast<int32_t>(p.rhs_type),
          static_cast<int32_t>(p.out_type),
          p.fuse_alpha,
          p.drop_cublaslt_plans,
          p.workspace_bytes};
  auto git = Graphs().find(key);
  if (git == Graphs().end()) {
    Entry fresh;
    // The build uses the device's handle, which Run may be using on another thread (a traced
    // call executing while a new shape is traced): cuDNN forbids sharing a handle concurrently.
    std::lock_guard<std::mutex> handle_lock(dev->mu);
    // Unprefixed: Build's message already names the cuDNN stage that failed, and is what
    // explain and the probe show.
    Status built = Build(p, device, dev->handle, &fresh);
    if (!built.ok()) return built;
    git = Graphs().emplace(key, std::move(fresh)).first;
  }
  *out = git->second;
  return Status::Ok();
}

Status Run(const std::string& library_path, int device_ordinal, const CudnnBlockScaledMatmul& p,
           cudaStream_t stream) {
  GPUEXT_RETURN_IF_ERROR(LoadCudnn(library_path));
  ScopedDevice scoped;  // the stream's device, whichever device this thread had current
  int device = 0;
  GPUEXT_RETURN_IF_ERROR(scoped.Enter(device_ordinal, &device));

  Device* dev = nullptr;
  Entry entry;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    GPUEXT_RETURN_IF_ERROR(DeviceFor(device, &dev));
    Status cached = CachedGraph(p, device, dev, &entry);  // normally built at trace time
    if (!cached.ok()) return cached;
  }

  std::unordered_map<int64_t, void*> ptrs = {
      {kA, const_cast<void*>(p.lhs)},
      {kB, const_cast<void*>(p.rhs)},
      {kScaleA, const_cast<void*>(p.lhs_scale)},
      {kScaleB, const_cast<void*>(p.rhs_scale)},
      {kOut, p.out},
  };
  if (p.fuse_alpha) ptrs[kAlpha] = const_cast<float*>(p.alpha);
  std::lock_guard<std::mutex> lock(dev->mu);
  GPUEXT_CUDNN_RETURN_IF_ERROR(fe::detail::set_stream(dev->handle, stream));
  GPUEXT_FE_RETURN_IF_ERROR("execute", entry.graph->execute(dev->handle, ptrs, p.workspace));
  return Status::Ok();
}

Status Prepare(const std::string& library_path, int device, const CudnnBlockScaledMatmul& p,
               int64_t* workspace_bytes) {
  GPUEXT_RETURN_IF_ERROR(LoadCudnn(library_path));
  ScopedDevice scoped;
  int current = 0;
  GPUEXT_RETURN_IF_ERROR(scoped.Enter(device, &current));
  std::lock_guard<std::mutex> lock(g_mu);
  Device* dev = nullptr;
  GPUEXT_RETURN_IF_ERROR(DeviceFor(current, &dev));
  Entry entry;
  Status cached = CachedGraph(p, current, dev, &entry);
  if (!cached.ok()) return cached;
  *workspace_bytes = entry.workspace_bytes;
  return Status::Ok();
}

// The frontend's dynamic-loading shim throws std::runtime_error (missing symbol, no libcudart);
// nothing may cross the FFI or nanobind boundary as an exception.
template <typename Fn>
Status Guarded(const char* what, Fn fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    const std::string message = e.what();
    const bool cudart = message.find("libcudart") != std::string::npos;
    return Status::Error(std::string(what) + " threw: " + message +
                         (cudart ? " (cudnn-frontend's shim dlopens libcudart.so.12/.13 by name: make exactly the "
                                   "one matching jaxlib's CUDA loadable; gate cudnn_frontend_cudart)"
                                 : ""));
  } catch (...) {
    return Status::Error(std::string(what) + " threw a non-standard exception");
  }
}

}  // namespace

Status PrepareCudnnBlockScaledMatmul(const std::string& library_path, int device, const CudnnBlockScaledMatmul& p,
                                     int64_t* workspace_bytes) {
  return Guarded("cuDNN block-scaled matmul preparation",
                 [&] { return Prepare(library_path, device, p, workspace_bytes); });
}

Status RunCudnnBlockScaledMatmul(const std::string& library_path, int device_ordinal, const CudnnBlockScaledMatmul& p,
                                 cudaStream_t stream) {
  return Guarded("cuDNN block-scaled matmul", [&] { return Run(library_path, device_ordinal, p, stream); });
}

}  // namespace gpuext
