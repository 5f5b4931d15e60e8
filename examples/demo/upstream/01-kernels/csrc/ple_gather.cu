// ple_gather: copy one embedding row per index out of a per-layer table.
#include "device_buffer.cuh"
#include "pledemo.h"

namespace {

__global__ void ple_gather_kernel(const float *table, size_t dim,
                                  const int32_t *indices, float *out,
                                  size_t total) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    size_t row = i / dim;
    size_t col = i % dim;
    out[i] = table[static_cast<size_t>(indices[row]) * dim + col];
  }
}

}  // namespace

extern "C" const char *pledemo_ple_gather(const float *table, size_t rows,
                                          size_t dim, const int32_t *indices,
                                          size_t n, float *out) {
  size_t total = n * dim;
  if (total == 0) return nullptr;
  pledemo::DeviceBuffer<float> d_table(rows * dim), d_out(total);
  pledemo::DeviceBuffer<int32_t> d_indices(n);
  PLEDEMO_CUDA_TRY(d_table.allocate());
  PLEDEMO_CUDA_TRY(d_indices.allocate());
  PLEDEMO_CUDA_TRY(d_out.allocate());
  PLEDEMO_CUDA_TRY(d_table.upload(table));
  PLEDEMO_CUDA_TRY(d_indices.upload(indices));
  ple_gather_kernel<<<pledemo::blocks_for(total), pledemo::kThreadsPerBlock>>>(
      d_table.get(), dim, d_indices.get(), d_out.get(), total);
  PLEDEMO_CHECK_LAUNCH();
  PLEDEMO_CUDA_TRY(d_out.download(out));
  return nullptr;
}
