/* pledemo._C: Python bindings of the CUDA kernels.
 *
 * Inputs and outputs are C-contiguous buffers of float32 ('f') or int32 ('i')
 * items, e.g. array.array('f'). Outputs are written in place. A failing CUDA
 * call raises pledemo._C.CudaError (a RuntimeError) carrying the CUDA error
 * string.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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

static PyMethodDef methods[] = {
    {"saxpy", py_saxpy, METH_VARARGS, "saxpy(a, x, y, out): out = a * x + y"},
    {"ple_gather", py_ple_gather, METH_VARARGS,
     "ple_gather(table, dim, indices, out): out rows = table rows at indices"},
    {"row_scale", py_row_scale, METH_VARARGS,
     "row_scale(x, scales, dim, out): out row r = x row r * scales[r]"},
    {"row_sum", py_row_sum, METH_VARARGS, "row_sum(x, dim, out): out[r] = sum of x row r"},
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
