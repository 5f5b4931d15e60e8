// What PLE offload needs from CUDA: streams, device and pinned host memory,
// asynchronous copies, two small kernels, and the stream memory operations
// cuStreamWaitValue32 / cuStreamWriteValue32 that make a stream wait on, or
// write, a 32-bit flag.
//
// The stream memory operations belong to the driver API. They are looked up
// through the runtime (cudaGetDriverEntryPoint*), so the extension links only
// the static runtime and builds on machines without a GPU driver.
#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "device_buffer.cuh"
#include "pledemo.h"

namespace {

using StreamValueOp = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using ErrorString = CUresult (*)(CUresult, const char **);

struct DriverOps {
  StreamValueOp wait_value32 = nullptr;
  StreamValueOp write_value32 = nullptr;
  ErrorString error_string = nullptr;
  const char *error = nullptr;
};

cudaError_t entry_point(const char *symbol, void **function) {
  cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
  cudaError_t status =
      cudaGetDriverEntryPointByVersion(symbol, function, 12000, cudaEnableDefault, &found);
#else
  cudaError_t status = cudaGetDriverEntryPoint(symbol, function, cudaEnableDefault, &found);
#endif
  if (status == cudaSuccess && found != cudaDriverEntryPointSuccess) {
    return cudaErrorSymbolNotFound;
  }
  return status;
}

const DriverOps &driver_ops() {
  static DriverOps ops;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaError_t status = entry_point("cuStreamWaitValue32", reinterpret_cast<void **>(&ops.wait_value32));
    if (status == cudaSuccess) {
      status = entry_point("cuStreamWriteValue32", reinterpret_cast<void **>(&ops.write_value32));
    }
    if (status == cudaSuccess) {
      status = entry_point("cuGetErrorString", reinterpret_cast<void **>(&ops.error_string));
    }
    if (status != cudaSuccess) ops.error = cudaGetErrorString(status);
  });
  return ops;
}

// The message of a failed driver call, kept per thread.
const char *driver_error(const DriverOps &ops, const char *call, CUresult result) {
  thread_local char message[160];
  const char *text = nullptr;
  if (ops.error_string == nullptr || ops.error_string(result, &text) != CUDA_SUCCESS) text = nullptr;
  std::snprintf(message, sizeof message, "%s: %s (CUresult %d)", call,
                text != nullptr ? text : "unknown error", static_cast<int>(result));
  return message;
}

cudaStream_t as_stream(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

__global__ void fill_zero_kernel(float *out, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = 0.0f;
  }
}

__global__ void copy_kernel(const float *in, float *out, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = in[i];
  }
}

}  // namespace

extern "C" const char *pledemo_stream_ops_init(void) {
  const DriverOps &ops = driver_ops();
  if (ops.error != nullptr) return ops.error;
  // With lazy module loading (CUDA's default) a kernel's first launch loads
  // it, and a launch queued behind a stream wait can then block the host for
  // good. Launch every kernel of this file once, on an idle stream, first.
  fill_zero_kernel<<<1, 1>>>(nullptr, 0);
  copy_kernel<<<1, 1>>>(nullptr, nullptr, 0);
  PLEDEMO_CHECK_LAUNCH();
  return nullptr;
}

extern "C" const char *pledemo_stream_create(uintptr_t *stream) {
  cudaStream_t created;
  PLEDEMO_CUDA_TRY(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking));
  *stream = reinterpret_cast<uintptr_t>(created);
  return nullptr;
}

extern "C" const char *pledemo_stream_destroy(uintptr_t stream) {
  PLEDEMO_CUDA_TRY(cudaStreamDestroy(as_stream(stream)));
  return nullptr;
}

extern "C" const char *pledemo_stream_wait_idle(uintptr_t stream, double timeout_s, int *idle) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    cudaError_t status = cudaStreamQuery(as_stream(stream));
    if (status == cudaSuccess) {
      *idle = 1;
      return nullptr;
    }
    if (status != cudaErrorNotReady) return cudaGetErrorString(status);
    if (timeout_s >= 0 && std::chrono::steady_clock::now() >= deadline) {
      *idle = 0;
      return nullptr;
    }
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::milliseconds(1)) pause *= 2;
  }
}

extern "C" const char *pledemo_device_alloc(size_t bytes, uintptr_t *address) {
  void *memory = nullptr;
  PLEDEMO_CUDA_TRY(cudaMalloc(&memory, bytes));
  cudaError_t status = cudaMemset(memory, 0, bytes);
  if (status == cudaSuccess) status = cudaDeviceSynchronize();
  if (status != cudaSuccess) {
    cudaFree(memory);
    return cudaGetErrorString(status);
  }
  *address = reinterpret_cast<uintptr_t>(memory);
  return nullptr;
}

extern "C" const char *pledemo_device_free(uintptr_t address) {
  PLEDEMO_CUDA_TRY(cudaFree(reinterpret_cast<void *>(address)));
  return nullptr;
}

extern "C" const char *pledemo_host_alloc(size_t bytes, uintptr_t *address) {
  void *memory = nullptr;
  PLEDEMO_CUDA_TRY(cudaHostAlloc(&memory, bytes, cudaHostAllocDefault));
  *address = reinterpret_cast<uintptr_t>(memory);
  return nullptr;
}

extern "C" const char *pledemo_host_free(uintptr_t address) {
  PLEDEMO_CUDA_TRY(cudaFreeHost(reinterpret_cast<void *>(address)));
  return nullptr;
}

extern "C" const char *pledemo_copy_async(uintptr_t dst, uintptr_t src, size_t bytes,
                                          uintptr_t stream) {
  PLEDEMO_CUDA_TRY(cudaMemcpyAsync(reinterpret_cast<void *>(dst), reinterpret_cast<void *>(src),
                                   bytes, cudaMemcpyDefault, as_stream(stream)));
  return nullptr;
}

extern "C" const char *pledemo_fill_zero_async(uintptr_t out, size_t n, uintptr_t stream) {
  if (n == 0) return nullptr;
  fill_zero_kernel<<<pledemo::blocks_for(n), pledemo::kThreadsPerBlock, 0, as_stream(stream)>>>(
      reinterpret_cast<float *>(out), n);
  PLEDEMO_CUDA_TRY(cudaGetLastError());
  return nullptr;
}

extern "C" const char *pledemo_copy_floats_async(uintptr_t dst, uintptr_t src, size_t n,
                                                 uintptr_t stream) {
  if (n == 0) return nullptr;
  copy_kernel<<<pledemo::blocks_for(n), pledemo::kThreadsPerBlock, 0, as_stream(stream)>>>(
      reinterpret_cast<const float *>(src), reinterpret_cast<float *>(dst), n);
  PLEDEMO_CUDA_TRY(cudaGetLastError());
  return nullptr;
}

extern "C" const char *pledemo_stream_write_value32(uintptr_t stream, uintptr_t address,
                                                    uint32_t value) {
  const DriverOps &ops = driver_ops();
  if (ops.error != nullptr) return ops.error;
  CUresult result = ops.write_value32(reinterpret_cast<CUstream>(stream),
                                      static_cast<CUdeviceptr>(address), value, 0);
  return result == CUDA_SUCCESS ? nullptr : driver_error(ops, "cuStreamWriteValue32", result);
}

extern "C" const char *pledemo_stream_wait_value32(uintptr_t stream, uintptr_t address,
                                                   uint32_t value) {
  const DriverOps &ops = driver_ops();
  if (ops.error != nullptr) return ops.error;
  CUresult result = ops.wait_value32(reinterpret_cast<CUstream>(stream),
                                     static_cast<CUdeviceptr>(address), value,
                                     CU_STREAM_WAIT_VALUE_EQ);
  return result == CUDA_SUCCESS ? nullptr : driver_error(ops, "cuStreamWaitValue32", result);
}

extern "C" const char *pledemo_device_info(char *name, size_t name_size, int *major, int *minor,
                                           int *driver_version) {
  int device = 0;
  cudaDeviceProp properties;
  PLEDEMO_CUDA_TRY(cudaGetDevice(&device));
  PLEDEMO_CUDA_TRY(cudaGetDeviceProperties(&properties, device));
  PLEDEMO_CUDA_TRY(cudaDriverGetVersion(driver_version));
  std::snprintf(name, name_size, "%s", properties.name);
  *major = properties.major;
  *minor = properties.minor;
  return nullptr;
}
