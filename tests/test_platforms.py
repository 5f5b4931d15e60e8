"""Platforms: the grammar, the CPU facts, and the binfmt_misc test that decides whether another CPU's programs
run here — against this kernel's real handlers, and against handler files in the kernel's format in a tmp dir."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from carry.binaries.sharedobjects import elf_machine
from carry.config import load
from carry.platforms import BINFMT_DIR, Emulation, Platform
from carry.util.errors import BadInput
from helpers import ROOT, write_config

# What qemu-user-static registers for aarch64 on Debian (the mask ignores the ELF header's OS/ABI bytes).
AARCH64_HANDLER = """enabled
interpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P
flags: {flags}
offset 0
magic 7f454c460201010000000000000000000200b700
mask ffffffffffffff00fffffffffffffffffeffffff
"""


def handler_dir(tmp_path: Path, text: str, name: str = "qemu-aarch64") -> Path:
    directory = tmp_path / "binfmt_misc"
    directory.mkdir(exist_ok=True)
    (directory / "status").write_text("enabled\n")
    (directory / name).write_text(text)
    return directory


@pytest.mark.parametrize(
    "text, expected",
    [
        ("linux/arm64", Platform.LINUX_ARM64),
        ("linux/aarch64", Platform.LINUX_ARM64),
        ("linux/arm64/v8", Platform.LINUX_ARM64),
        ("Linux/AMD64", Platform.LINUX_AMD64),
        ("linux/arm/v7", Platform.LINUX_ARM_V7),
    ],
)
def test_parse_accepts_the_platforms_and_their_aliases(text, expected):
    assert Platform.parse(text, "--platform") is expected


@pytest.mark.parametrize("text", ["arm64", "linux", "linux/mips", "windows/amd64", "linux/arm64/v9"])
def test_parse_refuses_others_listing_what_is_allowed(text):
    with pytest.raises(BadInput) as error:
        Platform.parse(text, "--platform")
    message = str(error.value)
    assert f"unknown platform {text!r}" in message and "linux/amd64, linux/arm64" in message


def test_facts_of_arm64():
    arm64 = Platform.LINUX_ARM64
    assert (arm64.machine, arm64.e_machine, arm64.tag, arm64.qemu) == ("aarch64", 183, "arm64", "qemu-aarch64")
    assert Platform.LINUX_ARM_V7.tag == "arm-v7" and Platform.LINUX_ARM_V7.variant == "v7"
    assert Platform.from_wheel_tag("manylinux_2_17_aarch64") is arm64
    assert Platform.from_wheel_tag("linux_x86_64") is Platform.LINUX_AMD64
    assert Platform.from_wheel_tag("any") is None


def test_native_is_what_uname_says():
    machine = subprocess.run(["uname", "-m"], capture_output=True, text=True, check=True).stdout.strip()
    assert Platform.native().machine == machine


def test_elf_machine_of_real_binaries(tmp_path):
    from carry.arch import ArchList
    from carry.binaries import gate
    from carry.binaries import sharedobjects as binaries
    from carry.binaries.gatepolicy import GatePolicy

    assert elf_machine(Path("/bin/true").read_bytes()[:64]) == Platform.native().e_machine
    assert elf_machine(b"not an ELF file at all\n") is None
    arm = tmp_path / "arm.so"
    arm.write_bytes(Platform.LINUX_ARM64.elf_header() + bytes(64))
    assert elf_machine(arm.read_bytes()) == 183
    report = gate.check(binaries.from_paths([tmp_path]), GatePolicy(ArchList.parse("none")), Platform.LINUX_AMD64)
    assert [f.message for f in report.failures] == [
        "arm.so is aarch64 code (ELF e_machine 183), not x86_64 (62) as linux/amd64 needs"
    ]


def test_this_kernel_runs_arm64_through_qemu_and_nothing_for_riscv64():
    """ci/qemu.sh enabled the aarch64 handler (with F); riscv64 has none. The tests of foreign builds rely on it."""
    emulation = Emulation()
    found = emulation.handler(Platform.LINUX_ARM64)
    assert found is not None and found[1], f"no usable aarch64 handler in {BINFMT_DIR}"
    emulation.require(Platform.LINUX_ARM64)
    emulation.require(Platform.native())
    assert emulation.handler(Platform.LINUX_RISCV64) is None
    with pytest.raises(BadInput) as error:
        emulation.require(Platform.LINUX_RISCV64)
    assert "update-binfmts --enable qemu-riscv64" in str(error.value)


def test_handler_matching_follows_magic_and_mask(tmp_path):
    directory = handler_dir(tmp_path, AARCH64_HANDLER.format(flags="PF"))
    emulation = Emulation(directory)
    assert emulation.handler(Platform.LINUX_ARM64) == ("qemu-aarch64", True)
    assert emulation.handler(Platform.LINUX_RISCV64) is None
    assert emulation.handler(Platform.LINUX_S390X) is None


def test_a_disabled_handler_does_not_count(tmp_path):
    directory = handler_dir(tmp_path, AARCH64_HANDLER.format(flags="PF").replace("enabled", "disabled", 1))
    assert Emulation(directory).handler(Platform.LINUX_ARM64) is None


def test_a_handler_without_the_f_flag_is_refused_for_containers(tmp_path):
    directory = handler_dir(tmp_path, AARCH64_HANDLER.format(flags="P"))
    if Platform.native() is Platform.LINUX_ARM64:
        pytest.skip("arm64 is native here")
    with pytest.raises(BadInput) as error:
        Emulation(directory).require(Platform.LINUX_ARM64)
    assert "lacks the F flag" in str(error.value)


def test_config_platform_entries_carry_their_own_settings(tmp_path):
    config = write_config(
        tmp_path,
        "upstream.bundle",
        "a" * 40,
        extra=(
            "build:\n  cuda_arches: '9.0,12.0'\nimage:\n  base_image: base:shared\n  platforms:\n"
            "    linux/amd64: {}\n    linux/aarch64:\n      cuda_arches: '12.1'\n      base_image: base:arm\n"
        ),
    )
    loaded = load(config)
    assert [str(t.platform) for t in loaded.image.platforms] == ["linux/amd64", "linux/arm64"]
    assert str(loaded.arches_for(Platform.LINUX_ARM64)) == "12.1"
    assert str(loaded.arches_for(Platform.LINUX_AMD64)) == "9.0,12.0"
    assert loaded.target(Platform.LINUX_ARM64).base_image == "base:arm"
    assert loaded.target(Platform.LINUX_AMD64).base_image is None


def test_a_platform_listed_twice_is_bad_input(tmp_path):
    config = write_config(
        tmp_path,
        "upstream.bundle",
        "a" * 40,
        extra="image:\n  platforms:\n    linux/arm64: {}\n    linux/aarch64: {}\n",
    )
    with pytest.raises(BadInput) as error:
        load(config)
    assert "names linux/arm64 twice" in str(error.value)


def test_demo_builds_gb10_with_its_own_short_arch_list():
    demo = load(ROOT / "examples" / "demo" / "build.yaml")
    assert [str(t.platform) for t in demo.image.platforms] == ["linux/amd64", "linux/arm64"]
    assert str(demo.arches_for(Platform.LINUX_ARM64)) == "12.1"


def test_the_default_docker_is_the_first_on_path_that_builds_with_buildkit(monkeypatch):
    """This machine kind has a newer Docker CLI without buildx before Debian's docker.io on PATH."""
    from carry.image.buildkit import container

    newer, debian = Path("/usr/local/bin/docker"), Path("/usr/bin/docker")
    if not (newer.exists() and debian.exists()):
        pytest.skip("needs both /usr/local/bin/docker and /usr/bin/docker")
    if subprocess.run([str(newer), "buildx", "version"], capture_output=True).returncode == 0:
        pytest.skip("/usr/local/bin/docker has buildx here")
    demo = load(ROOT / "examples" / "demo" / "build.yaml")
    monkeypatch.delenv("CARRY_DOCKER", raising=False)
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    assert container.resolve_builder(demo, ()) == container.Builder(str(debian), False)
    monkeypatch.setenv("CARRY_DOCKER", str(newer))
    with pytest.raises(BadInput) as error:
        container.resolve_builder(demo, ())
    assert "lack(s) the buildx plugin" in str(error.value) and "$CARRY_DOCKER" in str(error.value)


def test_shared_tags_with_cuda_need_an_nvcc_to_name_the_release(tmp_path):
    """A `{cuda}` tag is never published as `cunone`: without an nvcc, `manifest` stops before any registry work."""
    from helpers import assert_bad_input, carry

    result = carry(
        "--config",
        str(ROOT / "examples" / "demo" / "build.yaml"),
        "manifest",
        env={"CUDA_HOME": str(tmp_path / "no-cuda"), "PATH": "/usr/bin:/bin", "CARRY_CACHE": str(tmp_path / "cache")},
    )
    assert_bad_input(result, "image.tags uses {cuda}", "nvidia-cuda-nvcc")
