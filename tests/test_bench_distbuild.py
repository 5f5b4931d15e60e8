"""bench/distbuild.py's model, without a compile: vLLM 0.33.0's own CMakeLists.txt read by cmake for an arch list
(its generators left out), nvcc --time's phases sorted into client and server steps, and the scheduler on a case
small enough to work out by hand. Its bad input, and bench/disttree.py's: one line, exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

import realvllm
from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import distbuild  # noqa: E402


@pytest.fixture(scope="module")
def vllm_source(tmp_path_factory):
    return distbuild.extract(realvllm.path(realvllm.SDIST_033), tmp_path_factory.mktemp("vllm"))


def test_vllm_cmake_gives_each_source_its_arches(vllm_source):
    build = distbuild.read_build(vllm_source, "9.0 12.1", generators=False)
    units = {unit.path: unit for unit in build.units}
    assert {unit.target for unit in build.units} == {
        "spinloop", "fs_io_C", "cumem_allocator", "_C_stable_libtorch", "_moe_C_stable_libtorch",
    }  # fmt: skip
    # CUDA 13's supported list has no 12.1: vLLM's CMake builds the 12.0 cubin (and 12.0f where a kernel asks)
    assert units["csrc/activation_kernels.cu"].gencodes == (("compute_90", "sm_90"), ("compute_120", "sm_120"))
    assert units["csrc/quantization/w8a8/cutlass/scaled_mm_c3x_sm90.cu"].gencodes == (("compute_90a", "sm_90a"),)
    assert units["csrc/quantization/fp4/nvfp4_quant_kernels.cu"].gencodes == (("compute_120f", "sm_120f"),)
    marlin = units["csrc/quantization/marlin/marlin.cu"]
    assert marlin.virtual == ("compute_80",) and marlin.real == (("compute_80", "sm_80"),), marlin
    assert marlin.flags == ("-static-global-template-stub=false",)  # its own COMPILE_FLAGS (CUDA >= 12.8)
    assert units["csrc/activation_kernels.cu"].flags == ()
    assert "csrc/attention/mla/sm100_cutlass_mla_kernel.cu" not in units  # 10.0f only
    assert "vllm_flash_attn" in build.externals
    assert any(note.startswith("Marlin generation failed") for note in build.notes), build.notes
    assert "-DENABLE_SCALED_MM_SM90=1" in build.flags["_C_stable_libtorch"]
    assert "-DTORCH_TARGET_VERSION=0x020B000000000000ULL" in build.flags["_C_stable_libtorch"]
    blackwell = {u.path for u in distbuild.read_build(vllm_source, "10.0", generators=False).units}
    assert "csrc/attention/mla/sm100_cutlass_mla_kernel.cu" in blackwell
    scanner = distbuild.Includes(vllm_source)
    assert scanner.heavy("csrc/quantization/w8a8/cutlass/scaled_mm_c3x_sm90.cu")
    assert not scanner.heavy("csrc/activation_kernels.cu")
    assert "cublas_v2.h" in scanner.reached("csrc/activation_kernels.cu")


def test_nvcc_time_phases_split_into_the_clients_and_the_servers():
    """Lines of nvcc 13.0's --time CSV for one .cu built for sm_90 and sm_121."""
    csv = """source file name , phase name , phase input files , phase output file , arch , tool, metric , unit
k.cu , gcc (preprocessing 4) , k.cu  , /tmp/k.cpp4.ii ,  , nvcc , 500.0 , ms
k.cu , cudafe++ , /tmp/k.cpp4.ii  , /tmp/k.cudafe1.cpp , compute_121 , nvcc , 2000.0 , ms
k.cu , gcc (preprocessing 1) , k.cu  , /tmp/k.compute_90.cpp1.ii , compute_90 , nvcc , 400.0 , ms
k.cu , cicc ,  /tmp/k.compute_90.cpp1.ii  , /tmp/k.compute_90.ptx , compute_90 , nvcc , 1600.0 , ms
k.cu , ptxas , /tmp/k.compute_90.ptx  , /tmp/k.compute_90.cubin , sm_90 , nvcc , 50.0 , ms
k.cu , gcc (preprocessing 1) , k.cu  , /tmp/k.compute_121.cpp1.ii , compute_121 , nvcc , 600.0 , ms
k.cu , cicc ,  /tmp/k.compute_121.cpp1.ii  , /tmp/k.compute_121.ptx , compute_121 , nvcc , 1700.0 , ms
k.cu , ptxas , /tmp/k.compute_121.ptx  , /tmp/k.compute_121.cubin , sm_121 , nvcc , 20.0 , ms
k.cu , fatbinary , /tmp/k.compute_90.cubin /tmp/k.compute_121.cubin  , /tmp/k.fatbin ,  , nvcc , 10.0 , ms
k.cu , gcc (compiling) ,   , k.o , compute_121 , nvcc , 1900.0 , ms
 , nvcc (driver) ,  , k.o ,  , nvcc , 9.0 , ms
"""
    assert distbuild.phases(csv) == {
        "host_pre": 519.0, "arch_pre": 1000.0, "cudafe": 2000.0, "cicc": 3300.0, "ptxas": 70.0, "host": 1900.0,
    }  # fmt: skip


PROFILE = distbuild.Profile(
    host_pre=1, arch_pre=1, cudafe=2, cicc=4, ptxas=1, host=3, client_per_job=0.25, overhead_per_job=0.5
)
TWO_ARCHES = (("compute_90", "sm_90"), ("compute_120", "compute_120"), ("compute_120", "sm_120"))
NONE = distbuild.Heavy(frozenset(), 1, 1, 1)


def units(*names: str) -> tuple[distbuild.Unit, ...]:
    return tuple(distbuild.Unit(name, "_C", TWO_ARCHES if name.endswith(".cu") else ()) for name in names)


def test_one_file_is_its_jobs_in_order_and_the_cluster_adds_its_overhead_per_job():
    # 1 + 2 + 2 x (1 + 4) + 2 x 1 + 3 CPU-s: a .cu for two arches (compute_120 also as PTX: no ptxas for it)
    alone = distbuild.schedule(distbuild.jobs_for(units("a.cu"), PROFILE, NONE, cluster=False), 1, 0)
    assert alone.wall == 18 and alone.client_busy == 18 and alone.sent == 0
    wide = distbuild.schedule(distbuild.jobs_for(units("a.cu", "b.cu"), PROFILE, NONE, cluster=False), 8, 0)
    assert wide.wall == wide.critical == 1 + 2 + 1 + 4 + 1 + 3
    # sent: cudafe++, 2 cicc, 2 ptxas, the host compile, each 0.5 s longer; the client pays 6 x 0.25 s up front
    jobs = distbuild.jobs_for(units("a.cu"), PROFILE, NONE, cluster=True)
    got = distbuild.schedule(jobs, 8, 8)
    assert (got.sent, got.fallback) == (6, 0)
    assert got.wall == (1 + 1.5) + 2.5 + 1 + 4.5 + 1.5 + 3.5
    assert got.client_busy == 2.5 + 2 and got.server_busy == 6 * 0.5 + 2 + 8 + 2 + 3
    # a .cpp: its preprocessing here, its compile there
    cpp = distbuild.schedule(distbuild.jobs_for(units("t.cpp"), PROFILE, NONE, cluster=True), 1, 1)
    assert (cpp.wall, cpp.sent) == (1.25 + 3.5, 1)


def test_a_distributed_job_runs_on_a_free_client_core_when_no_server_slot_is():
    jobs = distbuild.jobs_for(units("a.cu", "b.cu", "c.cu"), PROFILE, NONE, cluster=True)
    busy = distbuild.schedule(jobs, 4, 1)
    assert busy.fallback > 0 and busy.sent + busy.fallback == 18, busy
    # no server at all: every distributed job runs here, without the overhead (the client still paid its 0.25 s)
    none = distbuild.schedule(jobs, 4, 0)
    assert (none.sent, none.fallback, none.server_busy) == (0, 18, 0)
    assert none.client_busy == 3 * (18 + 6 * 0.25)


def test_the_heavy_factor_is_fitted_to_the_anchor():
    both = units("plain.cu", "heavy.cu")

    def shape(k: float) -> distbuild.Heavy:
        return distbuild.Heavy(frozenset({"heavy.cu"}), k, k, 1.0)

    # one core: 18 (plain) + 3 (the heavy one's client part) + 15 k (2 k + 2 x 4 k + 2 x k + 3 k)
    assert distbuild.calibrate(both, PROFILE, shape, 1, 51.0) == pytest.approx(2.0, abs=1e-6)
    assert distbuild.calibrate(both, PROFILE, shape, 1, 20.0) is None  # the plain one alone takes longer


@pytest.mark.parametrize(
    "script, args, needle",
    [
        ("distbuild", ["--port", "10600"], "--port 10600"),
        ("distbuild", ["--model-only"], "--model-only needs --measured"),
        ("distbuild", ["--sdist", str(ROOT / "VERSION")], "not vllm-0.33.0.tar.gz"),
        ("distbuild", ["--port", "x"], "argument --port: invalid int value: 'x'"),
        ("disttree", ["--units", "1"], "--units 1: at least 2"),
        ("disttree", ["--port", "10800"], "--port 10800: use 10900"),
        ("disttree", ["--units", "many"], "argument --units: invalid int value: 'many'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(script, args, needle, tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{script}.py"), *args, "--keep", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and needle in lines[0], done.stderr


def test_a_measured_marlin_file_costs_its_own_steps_per_arch(tmp_path):
    csv = """source file name , phase name , phase input files , phase output file , arch , tool, metric , unit
k.cu , cudafe++ , /tmp/k.cpp4.ii  , /tmp/k.cudafe1.cpp , compute_90 , nvcc , 2000.0 , ms
k.cu , cicc ,  /tmp/k.compute_90.cpp1.ii  , /tmp/k.compute_90.ptx , compute_90 , nvcc , 1600.0 , ms
k.cu , ptxas , /tmp/k.compute_90.ptx  , /tmp/k.compute_90.cubin , sm_90 , nvcc , 50.0 , ms
k.cu , cicc ,  /tmp/k.compute_120.cpp1.ii  , /tmp/k.compute_120.ptx , compute_120 , nvcc , 1700.0 , ms
"""
    got = distbuild.arch_phases(csv)
    assert got["cudafe"] == {"": 2000.0} and got["ptxas"] == {"sm_90": 50.0}
    assert got["cicc"] == {"compute_90": 1600.0, "compute_120": 1700.0}
    # a generated file of 2 kernels, costed from the measured one of 4 in its folder: the sample's + half the excess
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "a.cu").write_text("template __global__ void K<1>(int);\n" * 2)
    measured = {"host_pre": {"": 3}, "cudafe": {"": 6}, "host": {"": 7}, "arch_pre": {"compute_90": 1}}
    measured |= {"cicc": {"compute_90": 20, "compute_120": 10}, "ptxas": {"sm_90": 5}}
    steps = {"m/c.cu": {"instances": 4, "steps": measured}}
    costs = distbuild.marlin_costs(tmp_path, {"m/a.cu", "b.cu"}, steps, PROFILE)
    assert list(costs) == ["m/a.cu"]
    own = costs["m/a.cu"]
    assert (own.host_pre, own.cudafe, own.host, own.cicc) == (2, 4, 5, {"compute_90": 12, "compute_120": 7})
    # sm_120's ptxas and compute_120's preprocessing were not measured: the mean of the arches that were
    heavy = distbuild.Heavy(frozenset(), 1, 1, 1, costs)
    alone = distbuild.schedule(distbuild.jobs_for(units("m/a.cu"), PROFILE, heavy, cluster=False), 1, 0)
    assert alone.wall == 2 + 4 + (1 + 12) + (1 + 7) + 3 + 3 + 5
