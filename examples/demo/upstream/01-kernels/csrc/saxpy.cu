// saxpy: out = a * x + y.
#include "device_buffer.cuh"
#include "pledemo.h"

namespace {

__global__ void saxpy_kernel(float a, const float *x, const float *y,
                             float *out, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = a * x[i] + y[i];
  }
}

}  // namespace

extern "C" const char *pledemo_saxpy(float a, const float *x, const float *y,
                                     float *out, size_t n) {
  if (n == 0) return nullptr;
  pledemo::DeviceBuffer<float> d_x(n), d_y(n), d_out(n);
  PLEDEMO_CUDA_TRY(d_x.allocate());
  PLEDEMO_CUDA_TRY(d_y.allocate());
  PLEDEMO_CUDA_TRY(d_out.allocate());
  PLEDEMO_CUDA_TRY(d_x.upload(x));
  PLEDEMO_CUDA_TRY(d_y.upload(y));
  saxpy_kernel<<<pledemo::blocks_for(n), pledemo::kThreadsPerBlock>>>(
      a, d_x.get(), d_y.get(), d_out.get(), n);
  PLEDEMO_CHECK_LAUNCH();
  PLEDEMO_CUDA_TRY(d_out.download(out));
  return nullptr;
}
