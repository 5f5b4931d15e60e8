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

/* Streams, memory and stream memory operations for PLE offload (ple_stream.cu).
 * Streams and addresses travel as integers. Each call returns NULL or the
 * error string of the CUDA call that failed. */

/* Look up the driver's stream memory operations and load every kernel of
 * ple_stream.cu; call once before queueing work behind a stream wait. */
const char *pledemo_stream_ops_init(void);
/* A non-blocking stream: it never waits on the legacy default stream. */
const char *pledemo_stream_create(uintptr_t *stream);
const char *pledemo_stream_destroy(uintptr_t stream);
/* Poll until the stream has no work left (*idle = 1) or timeout_s seconds
 * passed (*idle = 0); a negative timeout waits for good. */
const char *pledemo_stream_wait_idle(uintptr_t stream, double timeout_s, int *idle);
/* Device memory, zeroed. */
const char *pledemo_device_alloc(size_t bytes, uintptr_t *address);
const char *pledemo_device_free(uintptr_t address);
/* Page-locked host memory. */
const char *pledemo_host_alloc(size_t bytes, uintptr_t *address);
const char *pledemo_host_free(uintptr_t address);
/* cudaMemcpyAsync in either direction, queued on `stream`. */
const char *pledemo_copy_async(uintptr_t dst, uintptr_t src, size_t bytes, uintptr_t stream);
/* Kernels queued on `stream`: out[:n] = 0, and dst[:n] = src[:n] (float32). */
const char *pledemo_fill_zero_async(uintptr_t out, size_t n, uintptr_t stream);
const char *pledemo_copy_floats_async(uintptr_t dst, uintptr_t src, size_t n, uintptr_t stream);
/* cuStreamWriteValue32(address = value) and cuStreamWaitValue32(address ==
 * value) queued on `stream`; `address` is a device address of an int32. */
const char *pledemo_stream_write_value32(uintptr_t stream, uintptr_t address, uint32_t value);
const char *pledemo_stream_wait_value32(uintptr_t stream, uintptr_t address, uint32_t value);
/* The current device's name, compute capability and the driver's CUDA version. */
const char *pledemo_device_info(char *name, size_t name_size, int *major, int *minor,
                                int *driver_version);

#ifdef __cplusplus
}
#endif

#endif
