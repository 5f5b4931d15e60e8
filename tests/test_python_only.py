"""A Python-only wheel (`cuda_arches: []`) of a real upstream that builds like vLLM's python-only mode, and the
two ways carry runs its PEP 517 build (the backend hook directly, or `python -m build` with isolation)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from helpers import Upstream, carry, write_config

pytestmark = pytest.mark.slow

# Like vLLM's setup.py: VLLM_TARGET_DEVICE=empty builds no extension, VLLM_VERSION_OVERRIDE is the version
# as given, and otherwise a CUDA extension is compiled by nvcc for TORCH_CUDA_ARCH_LIST, which, as in
# PyTorch, must not be set to an empty string.
SETUP_PY = """\
import os
import subprocess
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import OptionError

TARGET = os.environ.get("VLLM_TARGET_DEVICE", "cuda")
ARCH_LIST = os.environ.get("TORCH_CUDA_ARCH_LIST")
print(f"minivllm: target {TARGET}, TORCH_CUDA_ARCH_LIST={ARCH_LIST!r}, "
      f"CMAKE_CUDA_ARCHITECTURES={os.environ.get('CMAKE_CUDA_ARCHITECTURES')!r}", flush=True)


def version():
    override = os.environ.get("VLLM_VERSION_OVERRIDE")
    if override:
        return override
    return "0.1.0+empty" if TARGET == "empty" else "0.1.0+cu130"


class BuildCuda(build_ext):
    def build_extension(self, ext):
        if ARCH_LIST is not None and not ARCH_LIST.strip():
            raise OptionError("Unknown CUDA arch () or GPU not supported")
        arch = (ARCH_LIST or "9.0").split()[0].replace(".", "")
        obj = Path(self.build_temp, "ops.o")
        obj.parent.mkdir(parents=True, exist_ok=True)
        nvcc = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda", "bin", "nvcc")
        subprocess.run([str(nvcc), "-c", "csrc/ops.cu", "-o", str(obj), "-Xcompiler", "-fPIC",
                        f"-gencode=arch=compute_{arch},code=sm_{arch}"], check=True)
        ext.extra_objects = [str(obj)]
        super().build_extension(ext)


cuda = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
extensions = [] if TARGET == "empty" else [
    Extension("minivllm._C", ["csrc/module.c"], library_dirs=[str(cuda / "lib64")],
              libraries=["cudart_static", "dl", "pthread", "rt", "stdc++"])
]
setup(version=version(), packages=find_packages(), ext_modules=extensions, cmdclass={"build_ext": BuildCuda})
"""

FILES = {
    "setup.py": SETUP_PY,
    "pyproject.toml": '[build-system]\nrequires = ["setuptools>=61", "wheel"]\n'
    'build-backend = "setuptools.build_meta"\n\n'
    '[project]\nname = "minivllm"\ndynamic = ["version"]\n',
    "minivllm/__init__.py": '"""A tiny engine."""\n',
    "minivllm/connector.py": "def prepare_forward(dummy):\n    if dummy:\n        return None\n"
    "    return launch()\n\n\n"
    "def launch():\n    return 'launched'\n",
    "csrc/ops.cu": "__global__ void scale(float *x, float s) { x[threadIdx.x] *= s; }\n"
    'extern "C" void launch_scale(float *x, float s) { scale<<<1, 32>>>(x, s); }\n',
    "csrc/module.c": "#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n"
    'static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, NULL};\n'
    "PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }\n",
}

BUILD = """build:
  cuda_arches: []
  env:
    VLLM_TARGET_DEVICE: empty
  wheel_version: "0.1.0+carry.{version}"
  version_env: [VLLM_VERSION_OVERRIDE]
  build_isolation: false
  compiler_cache: none
"""


@pytest.fixture
def project(tmp_path):
    upstream = Upstream.create(tmp_path / "upstream", FILES)
    pin = upstream.head()
    config = write_config(tmp_path / "project", str(upstream.path), pin, extra=BUILD)
    (config.parent / "VERSION").write_text("20261101.2\n")
    new = FILES["minivllm/connector.py"].replace("    return launch()", "    reset()\n    return launch()")
    upstream.make_patch(
        config.parent / "patches" / "0001-reset-before-launch.patch",
        "Reset before launch",
        {"minivllm/connector.py": new + "\n\ndef reset():\n    return None\n"},
    )
    # The caller's shell has CUDA arches exported: a Python-only build must not hand them on.
    env = {"CARRY_CACHE": str(tmp_path / "cache"), "TORCH_CUDA_ARCH_LIST": "9.0", "CMAKE_CUDA_ARCHITECTURES": "90"}
    return config, env, tmp_path / "dist"


def test_python_only_wheel_carries_version_records_none_and_verifies(project):
    config, env, dist = project
    built = carry("--config", str(config), "wheel", "--out", str(dist), env=env)
    assert built.code == 0, built.err
    wheel = Path(built.out.strip())
    assert wheel.name == "minivllm-0.1.0+carry.20261101.2-py3-none-any.whl"
    assert "arches none" in built.err
    assert (
        "gate: arch gate passed: no CUDA code expected (cuda_arches none), none found in the wheel (no shared objects)"
    ) in built.err
    assert "gate: tree check passed" in built.err
    log = next((Path(env["CARRY_CACHE"]) / "logs").glob("wheel-*.log")).read_text()
    assert "minivllm: target empty, TORCH_CUDA_ARCH_LIST=None, CMAKE_CUDA_ARCHITECTURES=None" in log
    with zipfile.ZipFile(wheel) as archive:
        info = json.loads(archive.read("minivllm-0.1.0+carry.20261101.2.dist-info/carry-buildinfo.json"))
        assert "reset()" in archive.read("minivllm/connector.py").decode()
    assert info["cuda_arches"] == "none" and info["gate"]["cuda_arches"] == "none"
    assert info["gate"]["ok"] is True and info["gate"]["files"] == []
    assert "TORCH_CUDA_ARCH_LIST" not in info["build_env_keys"]
    verified = carry("--config", str(config), "verify", str(wheel), env=env)
    assert verified.code == 0, verified.out + verified.err
    assert "arches none" in verified.out and "no CUDA code expected" in verified.out
    assert verified.out.rstrip().endswith("verified")


def test_cuda_code_in_a_wheel_that_expects_none_fails_the_gate(project):
    config, env, dist = project
    # Without VLLM_TARGET_DEVICE=empty the upstream compiles its kernel: --arch none says no CUDA code is wanted.
    config.write_text(config.read_text().replace("    VLLM_TARGET_DEVICE: empty\n", "    MAX_JOBS: 1\n"))
    built = carry("--config", str(config), "wheel", "--arch", "none", "--out", str(dist), env=env)
    assert built.code == 1, built.err
    assert "FAIL CUDA code in a wheel that expects none: minivllm/_C" in built.err
    assert "holds sm_90" in built.err and "set build.cuda_arches" in built.err
    assert not dist.exists() or not list(dist.iterdir())


def test_isolated_build_goes_through_python_m_build(project):
    config, env, dist = project
    config.write_text(config.read_text().replace("build_isolation: false", "build_isolation: true"))
    built = carry("--config", str(config), "wheel", "--out", str(dist), env=env)
    assert built.code == 0, built.err
    assert Path(built.out.strip()).name == "minivllm-0.1.0+carry.20261101.2-py3-none-any.whl"
    log = next((Path(env["CARRY_CACHE"]) / "logs").glob("wheel-*.log")).read_text()
    assert " -m build --wheel --outdir " in log and "Successfully built" in log


def test_a_backend_that_cannot_be_imported_fails_with_the_log_tail(project, tmp_path):
    config, env, dist = project
    upstream = Upstream(tmp_path / "upstream")
    pyproject = FILES["pyproject.toml"].replace("setuptools.build_meta", "nosuch_backend")
    pin = upstream.commit("Use another backend", {"pyproject.toml": pyproject})
    config.write_text(config.read_text().replace(config.read_text().split("commit: ")[1].split()[0], pin))
    built = carry("--config", str(config), "wheel", "--out", str(dist), env=env)
    assert built.code == 1, built.err
    assert "the upstream build failed (exit 1)" in built.err
    assert "the build backend could not run" in built.err and "nosuch_backend" in built.err
    assert not dist.exists()
