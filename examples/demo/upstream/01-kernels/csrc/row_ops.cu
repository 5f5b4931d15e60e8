// Row-wise operations on a rows x dim matrix: scale each row, sum each row.
#include "device_buffer.cuh"
#include "pledemo.h"

namespace {

__global__ void row_scale_kernel(const float *x, const float *scales,
                                 size_t dim, float *out, size_t total) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = x[i] * scales[i / dim];
  }
}

// One block per row: each thread sums a strided slice, then the block
// folds the partial sums in shared memory.
__global__ void row_sum_kernel(const float *x, size_t dim, float *out) {
  __shared__ float partial[pledemo::kThreadsPerBlock];
  const float *row = x + static_cast<size_t>(blockIdx.x) * dim;
  float sum = 0.0f;
  for (size_t c = threadIdx.x; c < dim; c += blockDim.x) sum += row[c];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

}  // namespace

extern "C" const char *pledemo_row_scale(const float *x, const float *scales,
                                         size_t rows, size_t dim, float *out) {
  size_t total = rows * dim;
  if (total == 0) return nullptr;
  pledemo::DeviceBuffer<float> d_x(total), d_scales(rows), d_out(total);
  PLEDEMO_CUDA_TRY(d_x.allocate());
  PLEDEMO_CUDA_TRY(d_scales.allocate());
  PLEDEMO_CUDA_TRY(d_out.allocate());
  PLEDEMO_CUDA_TRY(d_x.upload(x));
  PLEDEMO_CUDA_TRY(d_scales.upload(scales));
  row_scale_kernel<<<pledemo::blocks_for(total), pledemo::kThreadsPerBlock>>>(
      d_x.get(), d_scales.get(), dim, d_out.get(), total);
  PLEDEMO_CHECK_LAUNCH();
  PLEDEMO_CUDA_TRY(d_out.download(out));
  return nullptr;
}

extern "C" const char *pledemo_row_sum(const float *x, size_t rows, size_t dim,
                                       float *out) {
  if (rows == 0) return nullptr;
  if (rows > 2147483647u) return "too many rows for one launch";
  pledemo::DeviceBuffer<float> d_x(rows * dim), d_out(rows);
  PLEDEMO_CUDA_TRY(d_x.allocate());
  PLEDEMO_CUDA_TRY(d_out.allocate());
  if (dim > 0) PLEDEMO_CUDA_TRY(d_x.upload(x));
  row_sum_kernel<<<static_cast<unsigned int>(rows),
                   pledemo::kThreadsPerBlock>>>(d_x.get(), dim, d_out.get());
  PLEDEMO_CHECK_LAUNCH();
  PLEDEMO_CUDA_TRY(d_out.download(out));
  return nullptr;
}
