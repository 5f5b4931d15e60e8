"""The synthetic scale upstream: a Python package with N CUDA translation units, a PR and a 2-patch series.

Its build has the demo's interface (setup.py + setuptools, nvcc per .cu file, TORCH_CUDA_ARCH_LIST, CUDA_HOME,
MAX_JOBS, NVCC_THREADS, CMAKE_CUDA_COMPILER_LAUNCHER, SETUPTOOLS_SCM_PRETEND_VERSION) with vLLM's job rule:
MAX_JOBS is the thread budget and the number of parallel nvcc processes is MAX_JOBS // NVCC_THREADS.

History:   main  A---B            refs/pull/1/head = P (the pin), branched from A
                  \
                   P
Series:    0001 changes one .cu (csrc/kKK.cu's kScale) and scalebench/ops.py;
           0002 changes scalebench/offload.py only (Python).
Variants of either patch (a reworded comment in 0002, another kScale in 0001) drive the rebuild cases.
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import gitrepo

PACKAGE = "scalebench"
ARCHES = "9.0,12.0,12.1"

SETUP_PY = '''\
"""Build scalebench and its CUDA extension scalebench._C.

Every csrc/*.cu file is compiled by nvcc into an object, csrc/module.c by the C compiler, and all of it is
linked against the static CUDA runtime. Environment:

  TORCH_CUDA_ARCH_LIST            targets, e.g. "9.0 12.0 12.1+PTX" ('a'/'f' suffixes allowed); default "9.0"
  CUDA_HOME                       the toolkit (nvcc is $CUDA_HOME/bin/nvcc); default /usr/local/cuda
  CMAKE_CUDA_COMPILER_LAUNCHER    put in front of nvcc, e.g. ccache
  CMAKE_C_COMPILER_LAUNCHER       put in front of the C compiler
  MAX_JOBS                        thread budget (default: usable cores); nvcc processes = MAX_JOBS // NVCC_THREADS
  NVCC_THREADS                    nvcc --threads (default 1)
  SETUPTOOLS_SCM_PRETEND_VERSION  the package version (default: scalebench/_version.py)

Compiler commands use paths relative to this directory, so a compiler cache hits in a moved tree.
"""

import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.errors import CompileError, OptionError

NAME = "scalebench"
CUDA_SOURCES = sorted(str(p) for p in Path("csrc").glob("*.cu"))
VERSION_FILE = Path(NAME, "_version.py")
ENTRY = re.compile(r"(?P<major>\\d+)\\.(?P<minor>\\d)(?P<variant>[af]?)(?P<ptx>\\+PTX)?")


def cuda_home():
    return Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")


def version():
    pretend = os.environ.get("SETUPTOOLS_SCM_PRETEND_VERSION")
    return pretend or re.search(r'__version__ = "([^"]+)"', VERSION_FILE.read_text()).group(1)


def env_int(name, default):
    value = os.environ.get(name)
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise OptionError(f"{name}={value!r} must be a positive integer")
    return int(value)


def gencode(arch_list):
    flags = []
    for entry in filter(None, re.split(r"[;\\s]+", arch_list)):
        match = ENTRY.fullmatch(entry)
        if match is None:
            raise OptionError(f"TORCH_CUDA_ARCH_LIST entry {entry!r} is not like 9.0, 12.0f or 12.1a+PTX")
        arch = match["major"] + match["minor"] + match["variant"]
        targets = [f"arch=compute_{arch},code=sm_{arch}"]
        if match["ptx"]:
            targets.append(f"arch=compute_{arch},code=compute_{arch}")
        for target in targets:
            if target not in flags:
                flags += ["-gencode", target]
    return flags


def compile_one(command):
    print(shlex.join(command), file=sys.stderr, flush=True)
    if subprocess.run(command).returncode != 0:
        raise CompileError(f"nvcc failed: {shlex.join(command)}")


class BuildCuda(build_ext):
    def build_extension(self, ext):
        flags = gencode(os.environ.get("TORCH_CUDA_ARCH_LIST") or "9.0")
        threads = env_int("NVCC_THREADS", 1)
        jobs = max(1, env_int("MAX_JOBS", len(os.sched_getaffinity(0))) // threads)
        launcher = shlex.split(os.environ.get("CMAKE_CUDA_COMPILER_LAUNCHER", ""))
        out_dir = Path(self.build_temp, "cuda")
        out_dir.mkdir(parents=True, exist_ok=True)
        commands = [
            [*launcher, str(cuda_home() / "bin" / "nvcc"), "-c", src, "-o", str(out_dir / (Path(src).stem + ".o")),
             "-O3", "-std=c++17", "-Icsrc", "-Xcompiler", "-fPIC", "--threads", str(threads), *flags]
            for src in CUDA_SOURCES
        ]
        print(f"scalebench: {len(commands)} nvcc job(s), {jobs} at a time, {threads} thread(s) each",
              file=sys.stderr, flush=True)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(compile_one, commands))
        ext.extra_objects = [c[c.index("-o") + 1] for c in commands]
        self.force = True
        c_launcher = shlex.split(os.environ.get("CMAKE_C_COMPILER_LAUNCHER", ""))
        self.compiler.compiler_so = [*c_launcher, *self.compiler.compiler_so]
        super().build_extension(ext)


class BuildPy(build_py):
    def run(self):
        super().run()
        Path(self.build_lib, VERSION_FILE).write_text(f"__version__ = {version()!r}\\n")


setup(
    version=version(),
    packages=find_packages(include=[NAME, NAME + ".*"]),
    ext_modules=[Extension(NAME + "._C", sources=["csrc/module.c"], include_dirs=["csrc"],
                           library_dirs=[str(cuda_home() / "lib64")],
                           libraries=["cudart_static", "dl", "pthread", "rt", "stdc++"])],
    cmdclass={"build_ext": BuildCuda, "build_py": BuildPy},
)
'''

PYPROJECT = f"""\
[build-system]
requires = ["setuptools>=61", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "{PACKAGE}"
description = "Synthetic scale upstream for carry's benchmark"
requires-python = ">=3.10"
dynamic = ["version"]
"""

HEADER = """\
// Shared by every kernel file: the CUDA error check and the launch shape.
#pragma once
#include <cuda_runtime.h>

#define SB_TRY(expr)                                   \\
  do {                                                 \\
    cudaError_t sb_status_ = (expr);                   \\
    if (sb_status_ != cudaSuccess) {                   \\
      return cudaGetErrorString(sb_status_);           \\
    }                                                  \\
  } while (0)

constexpr int kThreads = 256;
"""

KERNEL_TU = """\
// Kernels of unit @ID@: a tiled matmul, an RMS norm with warp reductions and a fused SiLU-and-mul,
// each instantiated for float, half and bfloat16 and several tile / block / vector widths.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

#include "scalebench.h"

namespace @ID@ {
constexpr float kScale = 1.0f;

template <typename T> __device__ __forceinline__ float to_f(T v) { return static_cast<float>(v); }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v) { return static_cast<T>(v); }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

template <int TILE, typename T>
__global__ void matmul_tiled(const T* a, const T* b, T* c, int m, int n, int k) {
  __shared__ float sa[TILE][TILE + 1];
  __shared__ float sb[TILE][TILE + 1];
  int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
  float acc = 0.f;
  for (int t = 0; t < k; t += TILE) {
    sa[threadIdx.y][threadIdx.x] = (row < m && t + threadIdx.x < k) ? to_f(a[row * k + t + threadIdx.x]) : 0.f;
    sb[threadIdx.y][threadIdx.x] = (col < n && t + threadIdx.y < k) ? to_f(b[(t + threadIdx.y) * n + col]) : 0.f;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < TILE; ++i) acc += sa[threadIdx.y][i] * sb[i][threadIdx.x];
    __syncthreads();
  }
  if (row < m && col < n) c[row * n + col] = from_f<T>(acc * kScale);
}

template <int BLOCK, typename T>
__global__ void rms_norm(const T* x, const T* w, T* out, int cols, float eps) {
  __shared__ float warp_sums[BLOCK / 32];
  const T* xr = x + blockIdx.x * cols;
  float ss = 0.f;
  for (int c = threadIdx.x; c < cols; c += BLOCK) {
    float v = to_f(xr[c]);
    ss += v * v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    ss = threadIdx.x < BLOCK / 32 ? warp_sums[threadIdx.x] : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x == 0) warp_sums[0] = rsqrtf(ss / cols + eps);
  }
  __syncthreads();
  float inv = warp_sums[0] * kScale;
  for (int c = threadIdx.x; c < cols; c += BLOCK)
    out[blockIdx.x * cols + c] = from_f<T>(to_f(xr[c]) * inv * to_f(w[c]));
}

template <int VEC, typename T>
__global__ void silu_and_mul(const T* x, T* out, int d) {
  int r = blockIdx.x;
  for (int c = threadIdx.x * VEC; c < d; c += blockDim.x * VEC) {
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      if (c + v < d) {
        float g = to_f(x[r * 2 * d + c + v]), u = to_f(x[r * 2 * d + d + c + v]);
        out[r * d + c + v] = from_f<T>(g / (1.f + __expf(-g)) * u * kScale);
      }
    }
  }
}

#define SB_INSTANTIATE(T)                                                                      \\
  template __global__ void matmul_tiled<16, T>(const T*, const T*, T*, int, int, int);        \\
  template __global__ void matmul_tiled<32, T>(const T*, const T*, T*, int, int, int);        \\
  template __global__ void rms_norm<128, T>(const T*, const T*, T*, int, float);               \\
  template __global__ void rms_norm<256, T>(const T*, const T*, T*, int, float);               \\
  template __global__ void rms_norm<1024, T>(const T*, const T*, T*, int, float);              \\
  template __global__ void silu_and_mul<1, T>(const T*, T*, int);                              \\
  template __global__ void silu_and_mul<4, T>(const T*, T*, int);                              \\
  template __global__ void silu_and_mul<8, T>(const T*, T*, int);
SB_INSTANTIATE(float)
SB_INSTANTIATE(__half)
SB_INSTANTIATE(__nv_bfloat16)
}  // namespace @ID@

extern "C" const char* scalebench_@ID@_name(void) { return "@ID@"; }

// out = rms_norm(x) * w for a rows x cols float matrix in host memory.
extern "C" const char* scalebench_@ID@_rms_norm(const float* x, const float* w, float* out, int rows, int cols) {
  float *dx = nullptr, *dw = nullptr, *dout = nullptr;
  size_t bytes = sizeof(float) * rows * cols;
  SB_TRY(cudaMalloc(&dx, bytes));
  SB_TRY(cudaMalloc(&dw, sizeof(float) * cols));
  SB_TRY(cudaMalloc(&dout, bytes));
  SB_TRY(cudaMemcpy(dx, x, bytes, cudaMemcpyHostToDevice));
  SB_TRY(cudaMemcpy(dw, w, sizeof(float) * cols, cudaMemcpyHostToDevice));
  @ID@::rms_norm<kThreads, float><<<rows, kThreads>>>(dx, dw, dout, cols, 1e-6f);
  SB_TRY(cudaGetLastError());
  SB_TRY(cudaMemcpy(out, dout, bytes, cudaMemcpyDeviceToHost));
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dout);
  return nullptr;
}
"""

MODULE_C = """\
/* scalebench._C: names of the compiled kernel units. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

@DECLS@

static const char *(*const NAMES[])(void) = {@TABLE@};

static PyObject *kernels(PyObject *self, PyObject *unused) {
  Py_ssize_t n = sizeof(NAMES) / sizeof(NAMES[0]);
  PyObject *list = PyList_New(n);
  if (list == NULL) return NULL;
  for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(list, i, PyUnicode_FromString(NAMES[i]()));
  return list;
}

static PyMethodDef methods[] = {{"kernels", kernels, METH_NOARGS, "Names of the kernel units."}, {NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};
PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
"""

OPS_PY = '''\
"""Kernel units compiled into scalebench._C."""


def kernels() -> list[str]:
    from scalebench import _C

    return _C.kernels()
'''

OFFLOAD_PY = '''\
"""CPU offload of per-layer tables: the connector that stages a step for the worker."""

import threading


class Connector:
    def __init__(self, layers: int):
        self.layers = layers
        self.ready = [threading.Event() for _ in range(layers)]

    def prepare_forward(self, dummy: bool) -> None:
        if dummy:
            for event in self.ready:
                event.set()
            return
        self._launch()

    def _launch(self) -> None:
        for event in self.ready:
            event.wait(timeout=0)
'''


def unit_id(index: int) -> str:
    return f"k{index:02d}"


def base_files(units: int) -> dict[str, str]:
    ids = [unit_id(i) for i in range(units)]
    files = {
        "setup.py": SETUP_PY,
        "pyproject.toml": PYPROJECT,
        "README.md": f"# {PACKAGE}\n\nA synthetic upstream with {units} CUDA translation units.\n",
        "csrc/scalebench.h": HEADER,
        "csrc/module.c": MODULE_C.replace(
            "@DECLS@", "\n".join(f"const char *scalebench_{i}_name(void);" for i in ids)
        ).replace("@TABLE@", ", ".join(f"scalebench_{i}_name" for i in ids)),
        f"{PACKAGE}/__init__.py": f'"""Synthetic kernels."""\n\nfrom {PACKAGE}._version import __version__\n',
        f"{PACKAGE}/_version.py": '__version__ = "0.0.0"\n',
        f"{PACKAGE}/ops.py": OPS_PY,
    }
    files.update({f"csrc/{i}.cu": KERNEL_TU.replace("@ID@", i) for i in ids})
    return files


@dataclasses.dataclass(frozen=True)
class ScaleProject:
    """A carry project (build.yaml, VERSION, patches/) over a generated upstream repo."""

    root: Path
    upstream: Path
    config: Path
    pin: str
    units: int
    patched_unit: str
    python_variants: tuple[str, ...]  # texts of 0002, each a different Python-only change
    cuda_variants: tuple[str, ...]  # texts of 0001, each a different change to one .cu

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    def use(self, python: int = 0, cuda: int = 0) -> None:
        """Put variant `cuda` of 0001 and variant `python` of 0002 in patches/."""
        (self.patches / "0001-ops-scale-one-kernel-unit.patch").write_text(self.cuda_variants[cuda])
        (self.patches / "0002-offload-reset-before-each-real-step.patch").write_text(self.python_variants[python])


def generate(dest: Path, units: int, variants: int = 4, nvcc_threads: int = 1) -> ScaleProject:
    """The upstream repo under dest/upstream and a carry project under dest/project."""
    upstream = gitrepo.init(dest / "upstream")
    index = dest / "generate.index"
    files = base_files(units)
    base = gitrepo.commit_files(upstream, None, files, "Add kernels, bindings and the setuptools build", index)
    main = gitrepo.commit_files(
        upstream, base, {"README.md": files["README.md"] + "\nBuild: pip wheel .\n"}, "README: how to build", index
    )
    pin = gitrepo.commit_files(
        upstream, base, {f"{PACKAGE}/offload.py": OFFLOAD_PY}, "offload: add the connector", index
    )
    gitrepo.git(upstream, "update-ref", "refs/heads/main", main)
    gitrepo.git(upstream, "update-ref", "refs/pull/1/head", pin)

    patched = unit_id(min(5, units - 1))
    cu_path = f"csrc/{patched}.cu"
    ops = OPS_PY + '\n\ndef scaled_unit() -> str:\n    return "' + patched + '"\n'
    cuda_variants, first_0001 = [], None
    for number in range(variants):
        scale = f"constexpr float kScale = {1.0 + (number + 1) / 8:.3f}f;"
        text = files[cu_path].replace("constexpr float kScale = 1.0f;", scale)
        commit = gitrepo.commit_files(
            upstream,
            pin,
            {cu_path: text, f"{PACKAGE}/ops.py": ops},
            f"ops: scale unit {patched} by {scale.split('= ')[1]}",
            index,
        )
        first_0001 = first_0001 or commit
        cuda_variants.append(gitrepo.format_patch(upstream, commit))
    python_variants = []
    for number in range(variants):
        fixed = OFFLOAD_PY.replace(
            "        self._launch()\n",
            f"        # Reset before each real step (wording {number}): a dummy run leaves every flag set.\n"
            "        for event in self.ready:\n            event.clear()\n        self._launch()\n",
        )
        commit = gitrepo.commit_files(
            upstream, first_0001, {f"{PACKAGE}/offload.py": fixed}, "offload: reset before each real step", index
        )
        python_variants.append(gitrepo.format_patch(upstream, commit))

    root = dest / "project"
    (root / "patches").mkdir(parents=True)
    (root / "VERSION").write_text("20260105.1\n")
    config = root / "build.yaml"
    config.write_text(
        textwrap.dedent(f"""\
        # Generated by bench/scale.py: {units} CUDA units, PR #1 pinned, two patches.
        upstream:
          url: {upstream}
          pr: 1
          commit: {pin}
          main: main
        patches:
          dir: patches
        build:
          cuda_arches: "{ARCHES}"
          env:
            MAX_JOBS: auto
            NVCC_THREADS: "{nvcc_threads}"
          wheel_version: "1.0.0+carry.{{version}}"
          version_env: [SETUPTOOLS_SCM_PRETEND_VERSION]
          build_isolation: false
          compiler_cache: ccache
          generated:
            scalebench/_version.py: setup.py's build_py writes the version it was given
        image:
          name: scalebench
        """)
    )
    project = ScaleProject(root, upstream, config, pin, units, patched, tuple(python_variants), tuple(cuda_variants))
    project.use(0, 0)
    return project
