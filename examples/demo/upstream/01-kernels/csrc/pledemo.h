/* Host entry points of the pledemo kernels.
 *
 * Every function copies its inputs to the GPU, runs one kernel, copies the
 * result back into `out` and returns NULL, or returns the CUDA error string
 * (cudaGetErrorString) of the first call that failed.
 */
#ifndef PLEDEMO_H
#define PLEDEMO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[i] = a * x[i] + y[i] for i < n. */
const char *pledemo_saxpy(float a, const float *x, const float *y, float *out,
                          size_t n);

/* out[r, :] = table[indices[r], :] for r < n; table has `rows` rows of `dim`.
 * The caller checks that every index is below `rows`. */
const char *pledemo_ple_gather(const float *table, size_t rows, size_t dim,
                               const int32_t *indices, size_t n, float *out);

/* out[r, c] = x[r, c] * scales[r] for a rows x dim matrix. */
const char *pledemo_row_scale(const float *x, const float *scales, size_t rows,
                              size_t dim, float *out);

/* out[r] = sum over c of x[r, c] for a rows x dim matrix. */
const char *pledemo_row_sum(const float *x, size_t rows, size_t dim,
                            float *out);

#ifdef __cplusplus
}
#endif

#endif
