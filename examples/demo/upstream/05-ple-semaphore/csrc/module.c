/* pledemo._C: Python bindings of the CUDA kernels.
 *
 * Inputs and outputs are C-contiguous buffers of float32 ('f') or int32 ('i')
 * items, e.g. array.array('f'). Outputs are written in place. A failing CUDA
 * call raises pledemo._C.CudaError (a RuntimeError) carrying the CUDA error
 * string.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdio.h>
#include <string.h>

#include "pledemo.h"

static PyObject *CudaError;

/* Fill `view` from `obj` if it holds 4-byte items of format `fmt`. */
static int get_buffer(PyObject *obj, Py_buffer *view, const char *fmt,
                      int writable, const char *name) {
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj, view, flags) != 0) return -1;
  const char *got = view->format ? view->format : "B";
  if (got[0] == '@' || got[0] == '=' || got[0] == '<') got++;
  if (strcmp(got, fmt) != 0 || view->itemsize != 4) {
    PyErr_Format(PyExc_TypeError, "%s must hold '%s' items (4 bytes), got '%s'",
                 name, fmt, view->format ? view->format : "B");
    PyBuffer_Release(view);
    return -1;
  }
  return 0;
}

static Py_ssize_t items(const Py_buffer *view) { return view->len / 4; }

static PyObject *finish(const char *kernel, const char *error) {
  if (error != NULL) {
    PyErr_Format(CudaError, "%s: %s", kernel, error);
    return NULL;
  }
  Py_RETURN_NONE;
}

static int check_dim(Py_ssize_t dim) {
  if (dim <= 0) {
    PyErr_SetString(PyExc_ValueError, "dim must be positive");
    return -1;
  }
  return 0;
}

static PyObject *py_saxpy(PyObject *self, PyObject *args) {
  float a;
  PyObject *x_obj, *y_obj, *out_obj;
  Py_buffer x, y, out;
  const char *error;
  if (!PyArg_ParseTuple(args, "fOOO:saxpy", &a, &x_obj, &y_obj, &out_obj)) return NULL;
  if (get_buffer(x_obj, &x, "f", 0, "x") != 0) return NULL;
  if (get_buffer(y_obj, &y, "f", 0, "y") != 0) goto release_x;
  if (get_buffer(out_obj, &out, "f", 1, "out") != 0) goto release_y;
  if (items(&x) != items(&y) || items(&x) != items(&out)) {
    PyErr_SetString(PyExc_ValueError, "x, y and out must have the same length");
    goto release_out;
  }
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_saxpy(a, x.buf, y.buf, out.buf, (size_t)items(&x));
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&out);
  PyBuffer_Release(&y);
  PyBuffer_Release(&x);
  return finish("saxpy", error);
release_out:
  PyBuffer_Release(&out);
release_y:
  PyBuffer_Release(&y);
release_x:
  PyBuffer_Release(&x);
  return NULL;
}

static PyObject *py_ple_gather(PyObject *self, PyObject *args) {
  PyObject *table_obj, *indices_obj, *out_obj;
  Py_ssize_t dim, rows, n, i;
  Py_buffer table, indices, out;
  const char *error;
  if (!PyArg_ParseTuple(args, "OnOO:ple_gather", &table_obj, &dim, &indices_obj, &out_obj))
    return NULL;
  if (check_dim(dim) != 0) return NULL;
  if (get_buffer(table_obj, &table, "f", 0, "table") != 0) return NULL;
  if (get_buffer(indices_obj, &indices, "i", 0, "indices") != 0) goto release_table;
  if (get_buffer(out_obj, &out, "f", 1, "out") != 0) goto release_indices;
  rows = items(&table) / dim;
  n = items(&indices);
  if (items(&table) % dim != 0 || items(&out) != n * dim) {
    PyErr_SetString(PyExc_ValueError,
                    "table must hold whole rows of dim items and out len(indices) rows");
    goto release_out;
  }
  for (i = 0; i < n; i++) {
    int32_t index = ((const int32_t *)indices.buf)[i];
    if (index < 0 || index >= rows) {
      PyErr_Format(PyExc_IndexError, "indices[%zd] = %d is outside the table's %zd rows",
                   i, (int)index, rows);
      goto release_out;
    }
  }
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_ple_gather(table.buf, (size_t)rows, (size_t)dim, indices.buf, (size_t)n,
                             out.buf);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&out);
  PyBuffer_Release(&indices);
  PyBuffer_Release(&table);
  return finish("ple_gather", error);
release_out:
  PyBuffer_Release(&out);
release_indices:
  PyBuffer_Release(&indices);
release_table:
  PyBuffer_Release(&table);
  return NULL;
}

static PyObject *py_row_scale(PyObject *self, PyObject *args) {
  PyObject *x_obj, *scales_obj, *out_obj;
  Py_ssize_t dim, rows;
  Py_buffer x, scales, out;
  const char *error;
  if (!PyArg_ParseTuple(args, "OOnO:row_scale", &x_obj, &scales_obj, &dim, &out_obj))
    return NULL;
  if (check_dim(dim) != 0) return NULL;
  if (get_buffer(x_obj, &x, "f", 0, "x") != 0) return NULL;
  if (get_buffer(scales_obj, &scales, "f", 0, "scales") != 0) goto release_x;
  if (get_buffer(out_obj, &out, "f", 1, "out") != 0) goto release_scales;
  rows = items(&x) / dim;
  if (items(&x) % dim != 0 || items(&scales) != rows || items(&out) != items(&x)) {
    PyErr_SetString(PyExc_ValueError,
                    "x must hold whole rows of dim items, scales one per row, out as many as x");
    goto release_out;
  }
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_row_scale(x.buf, scales.buf, (size_t)rows, (size_t)dim, out.buf);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&out);
  PyBuffer_Release(&scales);
  PyBuffer_Release(&x);
  return finish("row_scale", error);
release_out:
  PyBuffer_Release(&out);
release_scales:
  PyBuffer_Release(&scales);
release_x:
  PyBuffer_Release(&x);
  return NULL;
}

static PyObject *py_row_sum(PyObject *self, PyObject *args) {
  PyObject *x_obj, *out_obj;
  Py_ssize_t dim, rows;
  Py_buffer x, out;
  const char *error;
  if (!PyArg_ParseTuple(args, "OnO:row_sum", &x_obj, &dim, &out_obj)) return NULL;
  if (check_dim(dim) != 0) return NULL;
  if (get_buffer(x_obj, &x, "f", 0, "x") != 0) return NULL;
  if (get_buffer(out_obj, &out, "f", 1, "out") != 0) goto release_x;
  rows = items(&x) / dim;
  if (items(&x) % dim != 0 || items(&out) != rows) {
    PyErr_SetString(PyExc_ValueError, "x must hold whole rows of dim items, out one per row");
    goto release_out;
  }
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_row_sum(x.buf, (size_t)rows, (size_t)dim, out.buf);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&out);
  PyBuffer_Release(&x);
  return finish("row_sum", error);
release_out:
  PyBuffer_Release(&out);
release_x:
  PyBuffer_Release(&x);
  return NULL;
}

/* Stream and memory bindings for PLE offload: streams and addresses are
 * Python ints. Every call releases the GIL while CUDA runs. */

static int check_size(Py_ssize_t size, const char *name) {
  if (size < 0) {
    PyErr_Format(PyExc_ValueError, "%s must not be negative", name);
    return -1;
  }
  return 0;
}

static PyObject *address_or_error(const char *call, const char *error, uintptr_t address) {
  if (error != NULL) return finish(call, error);
  return PyLong_FromUnsignedLongLong((unsigned long long)address);
}

static PyObject *py_stream_ops_init(PyObject *self, PyObject *args) {
  const char *error;
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_stream_ops_init();
  Py_END_ALLOW_THREADS
  return finish("stream_ops_init", error);
}

static PyObject *py_stream_create(PyObject *self, PyObject *args) {
  uintptr_t stream = 0;
  const char *error;
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_stream_create(&stream);
  Py_END_ALLOW_THREADS
  return address_or_error("stream_create", error, stream);
}

static PyObject *py_stream_destroy(PyObject *self, PyObject *args) {
  unsigned long long stream;
  const char *error;
  if (!PyArg_ParseTuple(args, "K:stream_destroy", &stream)) return NULL;
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_stream_destroy((uintptr_t)stream);
  Py_END_ALLOW_THREADS
  return finish("stream_destroy", error);
}

static PyObject *py_stream_wait_idle(PyObject *self, PyObject *args) {
  unsigned long long stream;
  double timeout;
  int idle = 0;
  const char *error;
  if (!PyArg_ParseTuple(args, "Kd:stream_wait_idle", &stream, &timeout)) return NULL;
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_stream_wait_idle((uintptr_t)stream, timeout, &idle);
  Py_END_ALLOW_THREADS
  if (error != NULL) return finish("stream_wait_idle", error);
  return PyBool_FromLong(idle);
}

static PyObject *py_device_alloc(PyObject *self, PyObject *args) {
  Py_ssize_t bytes;
  uintptr_t address = 0;
  const char *error;
  if (!PyArg_ParseTuple(args, "n:device_alloc", &bytes)) return NULL;
  if (check_size(bytes, "bytes") != 0) return NULL;
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_device_alloc((size_t)bytes, &address);
  Py_END_ALLOW_THREADS
  return address_or_error("device_alloc", error, address);
}

static PyObject *py_device_free(PyObject *self, PyObject *args) {
  unsigned long long address;
  const char *error;
  if (!PyArg_ParseTuple(args, "K:device_free", &address)) return NULL;
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_device_free((uintptr_t)address);
  Py_END_ALLOW_THREADS
  return finish("device_free", error);
}

static PyObject *py_host_alloc(PyObject *self, PyObject *args) {
  Py_ssize_t bytes;
  uintptr_t address = 0;
  const char *error;
  if (!PyArg_ParseTuple(args, "n:host_alloc", &bytes)) return NULL;
  if (check_size(bytes, "bytes") != 0) return NULL;
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_host_alloc((size_t)bytes, &address);
  Py_END_ALLOW_THREADS
  return address_or_error("host_alloc", error, address);
}

static PyObject *py_host_free(PyObject *self, PyObject *args) {
  unsigned long long address;
  const char *error;
  if (!PyArg_ParseTuple(args, "K:host_free", &address)) return NULL;
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_host_free((uintptr_t)address);
  Py_END_ALLOW_THREADS
  return finish("host_free", error);
}

static PyObject *py_copy_async(PyObject *self, PyObject *args) {
  unsigned long long dst, src, stream;
  Py_ssize_t bytes;
  const char *error;
  if (!PyArg_ParseTuple(args, "KKnK:copy_async", &dst, &src, &bytes, &stream)) return NULL;
  if (check_size(bytes, "bytes") != 0) return NULL;
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_copy_async((uintptr_t)dst, (uintptr_t)src, (size_t)bytes, (uintptr_t)stream);
  Py_END_ALLOW_THREADS
  return finish("copy_async", error);
}

static PyObject *py_fill_zero_async(PyObject *self, PyObject *args) {
  unsigned long long out, stream;
  Py_ssize_t n;
  const char *error;
  if (!PyArg_ParseTuple(args, "KnK:fill_zero_async", &out, &n, &stream)) return NULL;
  if (check_size(n, "n") != 0) return NULL;
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_fill_zero_async((uintptr_t)out, (size_t)n, (uintptr_t)stream);
  Py_END_ALLOW_THREADS
  return finish("fill_zero_async", error);
}

static PyObject *py_copy_floats_async(PyObject *self, PyObject *args) {
  unsigned long long dst, src, stream;
  Py_ssize_t n;
  const char *error;
  if (!PyArg_ParseTuple(args, "KKnK:copy_floats_async", &dst, &src, &n, &stream)) return NULL;
  if (check_size(n, "n") != 0) return NULL;
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_copy_floats_async((uintptr_t)dst, (uintptr_t)src, (size_t)n, (uintptr_t)stream);
  Py_END_ALLOW_THREADS
  return finish("copy_floats_async", error);
}

static PyObject *py_stream_write_value32(PyObject *self, PyObject *args) {
  unsigned long long stream, address;
  unsigned int value;
  const char *error;
  if (!PyArg_ParseTuple(args, "KKI:stream_write_value32", &stream, &address, &value)) return NULL;
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_stream_write_value32((uintptr_t)stream, (uintptr_t)address, value);
  Py_END_ALLOW_THREADS
  return finish("stream_write_value32", error);
}

static PyObject *py_stream_wait_value32(PyObject *self, PyObject *args) {
  unsigned long long stream, address;
  unsigned int value;
  const char *error;
  if (!PyArg_ParseTuple(args, "KKI:stream_wait_value32", &stream, &address, &value)) return NULL;
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_stream_wait_value32((uintptr_t)stream, (uintptr_t)address, value);
  Py_END_ALLOW_THREADS
  return finish("stream_wait_value32", error);
}

static PyObject *py_device_info(PyObject *self, PyObject *args) {
  char name[256], capability[32];
  int major = 0, minor = 0, driver = 0;
  const char *error;
  Py_BEGIN_ALLOW_THREADS
  error = pledemo_device_info(name, sizeof name, &major, &minor, &driver);
  Py_END_ALLOW_THREADS
  if (error != NULL) return finish("device_info", error);
  snprintf(capability, sizeof capability, "%d.%d", major, minor);
  return Py_BuildValue("{s:s,s:s,s:i}", "name", name, "capability", capability, "driver_cuda", driver);
}

static PyMethodDef methods[] = {
    {"saxpy", py_saxpy, METH_VARARGS, "saxpy(a, x, y, out): out = a * x + y"},
    {"ple_gather", py_ple_gather, METH_VARARGS,
     "ple_gather(table, dim, indices, out): out rows = table rows at indices"},
    {"row_scale", py_row_scale, METH_VARARGS,
     "row_scale(x, scales, dim, out): out row r = x row r * scales[r]"},
    {"row_sum", py_row_sum, METH_VARARGS, "row_sum(x, dim, out): out[r] = sum of x row r"},
    {"stream_ops_init", py_stream_ops_init, METH_NOARGS,
     "stream_ops_init(): find the stream memory operations and load every stream kernel"},
    {"stream_create", py_stream_create, METH_NOARGS, "stream_create() -> a non-blocking stream"},
    {"stream_destroy", py_stream_destroy, METH_VARARGS, "stream_destroy(stream)"},
    {"stream_wait_idle", py_stream_wait_idle, METH_VARARGS,
     "stream_wait_idle(stream, timeout) -> True once its work is done, False after timeout s"},
    {"device_alloc", py_device_alloc, METH_VARARGS, "device_alloc(bytes) -> address of zeroed memory"},
    {"device_free", py_device_free, METH_VARARGS, "device_free(address)"},
    {"host_alloc", py_host_alloc, METH_VARARGS, "host_alloc(bytes) -> address of pinned memory"},
    {"host_free", py_host_free, METH_VARARGS, "host_free(address)"},
    {"copy_async", py_copy_async, METH_VARARGS, "copy_async(dst, src, bytes, stream)"},
    {"fill_zero_async", py_fill_zero_async, METH_VARARGS, "fill_zero_async(out, n, stream): n floats"},
    {"copy_floats_async", py_copy_floats_async, METH_VARARGS,
     "copy_floats_async(dst, src, n, stream): a kernel copies n floats"},
    {"stream_write_value32", py_stream_write_value32, METH_VARARGS,
     "stream_write_value32(stream, address, value): cuStreamWriteValue32"},
    {"stream_wait_value32", py_stream_wait_value32, METH_VARARGS,
     "stream_wait_value32(stream, address, value): cuStreamWaitValue32, until equal"},
    {"device_info", py_device_info, METH_NOARGS,
     "device_info() -> {'name', 'capability', 'driver_cuda'} of the current device"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "pledemo._C", "CUDA kernels of pledemo.", -1, methods,
};

PyMODINIT_FUNC PyInit__C(void) {
  PyObject *m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  CudaError = PyErr_NewException("pledemo._C.CudaError", PyExc_RuntimeError, NULL);
  if (CudaError == NULL || PyModule_AddObjectRef(m, "CudaError", CudaError) != 0) {
    Py_XDECREF(CudaError);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
