"""The arch gate on vLLM 0.33.0's real released wheels (x86_64 and aarch64, 13 shared objects each): the root
build.yaml's policy passes them for 12.1, 10.0 and 9.0; the strict rule fails them with the table; a copy whose
_C was swapped for a .so without 12.x code fails naming it."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

import cuda_tools
import realvllm
from carry.binaries import wheelzip
from helpers import ROOT, assert_bad_input, carry

ROOT_CONFIG = str(ROOT / "build.yaml")
WHEELS = {"linux/amd64": realvllm.WHEEL_X86, "linux/arm64": realvllm.WHEEL_ARM}


def gate(*args: str, config: str = ROOT_CONFIG):
    return carry("--config", config, "gate", *args)


def cells(report: dict, path: str) -> dict[str, str]:
    entry = next(e for e in report["files"] if e["path"] == path)
    return {target: cell["text"] for target, cell in entry["targets"].items()}


@pytest.mark.slow  # reads vLLM's 330 MB wheels
@pytest.mark.parametrize("platform", WHEELS)
def test_the_root_policy_passes_vllms_release_and_prints_the_table(platform):
    wheel = realvllm.path(WHEELS[platform])
    result = gate(str(wheel))
    assert result.code == 0, result.out + result.err
    lines = result.out.splitlines()
    assert lines[:2] == [
        "arch gate passed: 13 shared object(s), arches 12.1,10.0,9.0",
        "policy: 6 rule(s) from build.yaml build.gate",
    ]
    assert lines[2].split() == ["12.1", "10.0", "9.0"] and all(len(line) <= 80 for line in lines), lines
    assert re.search(r"^_C_stable_libtorch, +compat sm_120 +exact sm_100 +exact sm_90$", result.out, re.M)
    assert re.search(r"^vllm_flash_attn/_vllm_fa3_C +by design +by design +exact sm_90a$", result.out, re.M)
    assert re.search(r"^vllm_flash_attn/_vllm_fa2_C +JIT compute_80 +JIT compute_80 +JIT compute_80$", result.out, re.M)
    machine = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}[platform]
    assert f"cpu: 13/13 shared object(s) are {machine} code ({platform})" in result.out
    report = json.loads(gate(str(wheel), "--json").out)
    assert report["ok"] and report["platform"] == platform
    assert cells(report, "vllm/_moe_C_stable_libtorch.abi3.so") == {
        "12.1": "compat sm_120",
        "10.0": "exact sm_100",
        "9.0": "exact sm_90",
    }
    assert cells(report, "vllm/_qutlass_C.abi3.so") == {
        "12.1": "by design",
        "10.0": "exact sm_100f",
        "9.0": "by design",
    }
    assert report["unmatched_rules"] == []


@pytest.mark.slow  # reads vLLM's 330 MB wheels
@pytest.mark.parametrize("platform", WHEELS)
def test_the_strict_rule_fails_the_release_with_the_whole_table(platform):
    wheel = str(realvllm.path(WHEELS[platform]))
    result = gate(wheel, "--strict")
    assert result.code == 1, result.out + result.err
    assert result.out.startswith(
        "arch gate FAILED (11 problem(s)): 13 shared object(s), arches 12.1,10.0,9.0\npolicy: strict (no gate rules)\n"
    )
    assert re.search(r"^vllm_flash_attn/_vllm_fa3_C +NOTHING ! +NOTHING ! +exact sm_90a$", result.out, re.M)
    assert "FAIL vllm/_qutlass_C.abi3.so: nothing runs on 12.1 (sm_121); the fatbin holds sm_100f" in result.out
    assert "what each shared object holds:" in result.out and "  vllm/_deepselect_C.abi3.so: sm_100f" in result.out
    only_gb10 = gate(wheel, "--strict", "--arch", "12.1")
    assert only_gb10.code == 1 and only_gb10.out.startswith("arch gate FAILED (6 problem(s))")
    # Without a config there is no policy: the built-in strict rule, with the arches given.
    no_config = gate(wheel, "--arch", "12.1,10.0,9.0", config=str(ROOT / "no-such" / "build.yaml"))
    assert no_config.code == 1 and "strict (no gate rules)" in no_config.out


@pytest.mark.slow  # reads vLLM's 330 MB wheels
def test_a_core_without_12x_code_fails_naming_the_so_and_the_arch(tmp_path):
    """Swap _C_stable_libtorch for a real .so built for 9.0 only: the rules do not excuse the core."""
    source = tmp_path / "k.cu"
    source.write_text("__global__ void k(float *x) { x[0] = 1; }\n")
    hopper_only = tmp_path / "hopper.so"
    subprocess.run(
        [
            cuda_tools.nvcc(),
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-o",
            str(hopper_only),
            str(source),
            "-gencode=arch=compute_90,code=sm_90",
            "-gencode=arch=compute_100,code=sm_100",
        ],
        check=True,
    )
    wheel = realvllm.path(realvllm.WHEEL_X86)
    doctored = tmp_path / wheel.name
    wheelzip.rewrite(wheel, doctored, {"vllm/_C_stable_libtorch.abi3.so": hopper_only.read_bytes()})
    result = gate(str(doctored))
    assert result.code == 1, result.out + result.err
    assert result.out.startswith("arch gate FAILED (1 problem(s))")
    assert (
        "FAIL vllm/_C_stable_libtorch.abi3.so: nothing runs on 12.1 (sm_121); the fatbin holds sm_90, sm_100"
        in result.out
    )
    assert re.search(r"^_C_stable_libtorch +NOTHING ! +exact sm_100 +exact sm_90$", result.out, re.M)


@pytest.mark.slow  # reads vLLM's 330 MB wheels
def test_an_unpacked_tree_and_so_files_are_gated_too(tmp_path):
    import zipfile

    with zipfile.ZipFile(realvllm.path(realvllm.WHEEL_ARM)) as archive:
        for name in ("vllm/_flashmla_extension_C.abi3.so", "vllm/_deepselect_C.abi3.so", "vllm/spinloop.abi3.so"):
            archive.extract(name, tmp_path / "tree")
    tree = gate(str(tmp_path / "tree"), "--arch", "12.1,10.0", "--platform", "linux/arm64")
    assert tree.code == 0, tree.out + tree.err
    assert re.search(r"^_deepselect_C, _flashmla_extension_C +by design +exact sm_100f$", tree.out, re.M)
    assert "rule matched no shared object: vllm/_qutlass_C.*so: for 10.0f" in tree.out
    assert "no CUDA code: spinloop" in tree.out and "cpu: 3/3 shared object(s) are aarch64 code" in tree.out
    wrong_cpu = gate(
        str(tmp_path / "tree" / "vllm" / "_deepselect_C.abi3.so"), "--arch", "10.0", "--platform", "linux/amd64"
    )
    assert wrong_cpu.code == 1
    assert "is aarch64 code (ELF e_machine 183), not x86_64 (62) as linux/amd64 needs" in wrong_cpu.out


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("/no/such/vllm.whl",), "/no/such/vllm.whl does not exist"),
        (("--arch", "12.9", "{wheel}"), "cuda_arches: '12.9' is not a compute capability"),
        (("{text}",), "is not an ELF shared object"),
        (("{wheel}", "{wheel}"), "gate one wheel at a time"),
        (("{wheel}", "--platform", "linux/sparc"), "unknown platform 'linux/sparc'"),
    ],
)
def test_bad_input_is_one_line(tmp_path, args, needle):
    text = tmp_path / "notes.txt"
    text.write_text("not a binary\n")
    filled = [arg.format(wheel=realvllm.path(realvllm.WHEEL_X86), text=text) for arg in args]
    assert_bad_input(gate(*filled), needle)


def test_a_config_without_arches_and_no_arch_is_bad_input(tmp_path):
    config = tmp_path / "build.yaml"
    config.write_text(f"upstream:\n  url: https://example.invalid/x.git\n  commit: '{'a' * 40}'\n")
    assert_bad_input(gate(str(realvllm.path(realvllm.WHEEL_X86)), config=str(config)), "pass --arch LIST")
