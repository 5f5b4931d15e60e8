"""Build pledemo and its CUDA extension, pledemo._C.

The .cu files under csrc/ are compiled with nvcc, the bindings in csrc/module.c
with the regular C compiler, and everything is linked against the static CUDA
runtime. The build reads the same environment variables as vLLM's:

  TORCH_CUDA_ARCH_LIST            GPU targets in PyTorch's notation, separated by
                                  spaces or ';': "9.0 12.0 12.1+PTX", "12.0f",
                                  "12.1a". '+PTX' also embeds PTX. Default "9.0".
  CUDA_HOME                       CUDA toolkit; nvcc is $CUDA_HOME/bin/nvcc.
                                  Default /usr/local/cuda.
  CMAKE_CUDA_COMPILER_LAUNCHER    command put in front of nvcc, e.g. "ccache".
  MAX_JOBS                        compile thread budget, as in vLLM: MAX_JOBS // NVCC_THREADS .cu files
                                  are compiled at once. Default: CPU count.
  NVCC_THREADS                    passed to nvcc as --threads.
  SETUPTOOLS_SCM_PRETEND_VERSION  package version. Default: pledemo/_version.py.

Commands use paths relative to this directory so that a compiler cache hits
when the same tree is rebuilt.
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

CUDA_SOURCES = sorted(str(path) for path in Path("csrc").glob("*.cu"))
VERSION_FILE = Path("pledemo", "_version.py")
DEFAULT_ARCH_LIST = "9.0"
ARCH_ENTRY = re.compile(r"(?P<major>\d+)\.(?P<minor>\d)(?P<variant>[af]?)(?P<ptx>\+PTX)?")


def cuda_home() -> Path:
    return Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")


def package_version() -> str:
    pretend = os.environ.get("SETUPTOOLS_SCM_PRETEND_VERSION")
    if pretend:
        return pretend
    match = re.search(r'__version__ = "([^"]+)"', VERSION_FILE.read_text())
    return match.group(1)


def gencode_flags(arch_list: str) -> list[str]:
    """Turn a TORCH_CUDA_ARCH_LIST value into nvcc -gencode flags."""
    entries = [entry for entry in re.split(r"[;\s]+", arch_list) if entry]
    if not entries:
        raise OptionError("TORCH_CUDA_ARCH_LIST is empty; set it like '9.0 12.0 12.1+PTX'")
    flags: list[str] = []
    for entry in entries:
        match = ARCH_ENTRY.fullmatch(entry)
        if match is None:
            raise OptionError(
                f"TORCH_CUDA_ARCH_LIST entry {entry!r} is not MAJOR.MINOR with an optional "
                "'a' or 'f' suffix and an optional '+PTX', e.g. '9.0', '12.0f', '12.1a+PTX'"
            )
        arch = match["major"] + match["minor"] + match["variant"]
        targets = [f"arch=compute_{arch},code=sm_{arch}"]
        if match["ptx"]:
            targets.append(f"arch=compute_{arch},code=compute_{arch}")
        for target in targets:
            if target not in flags:
                flags += ["-gencode", target]
    return flags


def positive_int_env(name: str, default: int | None) -> int | None:
    value = os.environ.get(name)
    if not value:
        return default
    if not value.isdigit() or int(value) < 1:
        raise OptionError(f"{name}={value!r} must be a positive integer")
    return int(value)


class BuildCudaExtension(build_ext):
    """Compile the .cu sources with nvcc, in parallel, before the usual build.

    The extension is always relinked: setuptools' up-to-date check looks at
    module.c only and would keep a library built for other architectures.
    """

    def build_extension(self, ext: Extension) -> None:
        objects = self.compile_cuda(ext.name)
        ext.extra_objects = [*objects, *ext.extra_objects]
        self.force = True
        super().build_extension(ext)

    def compile_cuda(self, name: str) -> list[str]:
        flags = gencode_flags(os.environ.get("TORCH_CUDA_ARCH_LIST") or DEFAULT_ARCH_LIST)
        threads = positive_int_env("NVCC_THREADS", None)
        if threads is not None:
            flags += ["--threads", str(threads)]
        launcher = shlex.split(os.environ.get("CMAKE_CUDA_COMPILER_LAUNCHER", ""))
        nvcc = str(cuda_home() / "bin" / "nvcc")
        out_dir = Path(self.build_temp, *name.split("."))
        jobs = max(1, positive_int_env("MAX_JOBS", os.cpu_count() or 1) // (threads or 1))
        commands = []
        for source in CUDA_SOURCES:
            obj = out_dir / Path(source).with_suffix(".o").name
            obj.parent.mkdir(parents=True, exist_ok=True)
            commands.append(
                [*launcher, nvcc, "-c", source, "-o", str(obj), "-O3", "-std=c++17",
                 "-Icsrc", "-Xcompiler", "-fPIC", *flags]
            )
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(run_compiler, commands))
        return [command[command.index("-o") + 1] for command in commands]


def run_compiler(command: list[str]) -> None:
    print(shlex.join(command), file=sys.stderr, flush=True)
    result = subprocess.run(command)
    if result.returncode != 0:
        raise CompileError(f"nvcc failed with exit code {result.returncode}: {shlex.join(command)}")


class BuildPyWithVersion(build_py):
    """Write the version this build was given into the built _version.py."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib, VERSION_FILE)
        target.write_text(
            '"""Version of this build (written by setup.py)."""\n\n'
            f"__version__ = {package_version()!r}\n"
        )


setup(
    version=package_version(),
    packages=find_packages(include=["pledemo", "pledemo.*"]),
    ext_modules=[
        Extension(
            "pledemo._C",
            sources=["csrc/module.c"],
            include_dirs=["csrc"],
            library_dirs=[str(cuda_home() / "lib64")],
            libraries=["cudart_static", "dl", "pthread", "rt", "stdc++"],
        )
    ],
    cmdclass={"build_ext": BuildCudaExtension, "build_py": BuildPyWithVersion},
)
