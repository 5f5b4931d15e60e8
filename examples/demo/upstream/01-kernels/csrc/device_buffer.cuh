// Small helpers shared by the kernel files: an owning device allocation and
// an early return on the first failing CUDA call.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

// Return the error string of `expr` from the enclosing host wrapper if it
// did not succeed.
#define PLEDEMO_CUDA_TRY(expr)                      \
  do {                                              \
    cudaError_t pledemo_status_ = (expr);           \
    if (pledemo_status_ != cudaSuccess) {           \
      return cudaGetErrorString(pledemo_status_);   \
    }                                               \
  } while (0)

// Launch errors surface on cudaGetLastError, execution errors on the next
// synchronising call; check both.
#define PLEDEMO_CHECK_LAUNCH()                      \
  do {                                              \
    PLEDEMO_CUDA_TRY(cudaGetLastError());           \
    PLEDEMO_CUDA_TRY(cudaDeviceSynchronize());      \
  } while (0)

namespace pledemo {

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) : count_(count) {}
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }

  cudaError_t allocate() {
    return cudaMalloc(reinterpret_cast<void **>(&ptr_), bytes());
  }
  cudaError_t upload(const T *host) {
    return cudaMemcpy(ptr_, host, bytes(), cudaMemcpyHostToDevice);
  }
  cudaError_t download(T *host) const {
    return cudaMemcpy(host, ptr_, bytes(), cudaMemcpyDeviceToHost);
  }
  T *get() const { return ptr_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  size_t count_;
  T *ptr_ = nullptr;
};

constexpr int kThreadsPerBlock = 256;

inline unsigned int blocks_for(size_t n) {
  size_t blocks = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned int>(blocks < 65535 ? blocks : 65535);
}

}  // namespace pledemo
