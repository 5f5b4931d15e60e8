"""The demo's CUDA extension built for real with nvcc: arches in the binary, VERSION and provenance, no redone work."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from cuda_tools import counting_cuda_home, cuobjdump
from helpers import ROOT, assert_bad_input, carry

pytestmark = pytest.mark.slow

ARCHES = "9.0,12.0,12.1"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A copy of examples/demo with its own VERSION, cache and dist, built once for the module."""
    base = tmp_path_factory.mktemp("wheel")
    project = base / "demo"
    shutil.copytree(ROOT / "examples" / "demo", project)
    (project / "VERSION").write_text("20261101.3\n")
    calls = base / "nvcc-calls.log"
    env = {
        "CARRY_CACHE": str(base / "cache"),
        "CUDA_HOME": str(counting_cuda_home(base, calls)),
        "CCACHE_DIR": str(base / "ccache"),
    }
    dist = base / "dist"
    first = carry("--config", str(project / "build.yaml"), "wheel", "--arch", ARCHES, "--out", str(dist), env=env)
    assert first.code == 0, first.err
    return {"project": project, "env": env, "dist": dist, "calls": calls, "first": first, "base": base}


def run(demo, *args: str):
    return carry("--config", str(demo["project"] / "build.yaml"), *args, env=demo["env"])


def nvcc_calls(demo) -> int:
    calls = demo["calls"]
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def only_wheel(dist: Path) -> Path:
    wheels = sorted(dist.glob("*.whl"))
    assert len(wheels) == 1, wheels
    assert not [p for p in dist.iterdir() if p.name.startswith(".")], "no temp files left in dist"
    return wheels[0]


def test_wheel_version_carries_VERSION_and_phases_are_printed(demo):
    wheel = only_wheel(demo["dist"])
    assert "+carry.20261101.3" in wheel.name
    assert Path(demo["first"].out.strip()) == wheel
    for phase in ("check", "materialize", "build", "gate", "stamp"):
        assert f"] {phase}:" in demo["first"].err
    # What the gate proved, per .so and arch, as `verify` prints it.
    for _arch, sm in (("9.0", "sm_90"), ("12.0", "sm_120"), ("12.1", "sm_121")):
        assert f"exact {sm}" in demo["first"].err
    assert "gate: arch gate passed: 1 shared object(s), arches 9.0,12.0,12.1" in demo["first"].err
    assert "gate: tree check passed: 10 identical to tree" in demo["first"].err
    assert nvcc_calls(demo) > 0, "the first build must really run nvcc"


def test_so_holds_each_requested_cubin_checked_by_cuobjdump(demo, tmp_path):
    wheel = only_wheel(demo["dist"])
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path)
    shared = [p for p in tmp_path.rglob("*.so")]
    assert shared
    listing = subprocess.run([cuobjdump(), "--list-elf", str(shared[0])], capture_output=True, text=True, check=True)
    for sm in ("sm_90", "sm_120", "sm_121"):
        assert f".{sm}." in listing.stdout, listing.stdout


def test_buildinfo_names_series_hash_arches_and_gate(demo):
    wheel = only_wheel(demo["dist"])
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/carry-buildinfo.json"))
        info = json.loads(archive.read(name))
        record = archive.read(name.replace("carry-buildinfo.json", "RECORD")).decode()
    checked = json.loads(run(demo, "check", "--json").out)
    assert info["series"]["hash"] == checked["series_hash"]
    assert info["tree"] == checked["tree"]
    assert info["version"] == "20261101.3"
    assert info["cuda_arches"] == ARCHES
    assert [p["name"] for p in info["series"]["patches"]] == [p["name"] for p in checked["patches"]]
    assert info["gate"]["ok"] is True
    assert "nvcc_version" in info["toolchain"] and "V13" in info["toolchain"]["nvcc_version"]
    assert "TORCH_CUDA_ARCH_LIST" in info["build_env_keys"]
    assert "carry-buildinfo.json" in record


def test_identical_rerun_reuses_and_invokes_no_compiler(demo):
    before = nvcc_calls(demo)
    wheel = only_wheel(demo["dist"])
    digest = wheel.read_bytes()
    result = run(demo, "wheel", "--arch", ARCHES, "--out", str(demo["dist"]))
    assert result.code == 0, result.err
    assert "cache: hit" in result.err and "reused from cache" in result.err
    assert nvcc_calls(demo) == before
    assert only_wheel(demo["dist"]).read_bytes() == digest


def test_python_only_patch_change_rebuilds_without_nvcc(demo):
    before = nvcc_calls(demo)
    patch = next((demo["project"] / "patches").glob("0002-*.patch"))
    original = patch.read_text()
    lines = original.split("\n")
    index = next(
        i
        for i, line in enumerate(lines)
        if line.startswith("+") and not line.startswith("+++") and line.strip("+ ").startswith("#")
    )
    lines[index] = lines[index] + " (reworded comment)"
    patch.write_text("\n".join(lines))
    try:
        result = run(demo, "wheel", "--arch", ARCHES, "--out", str(demo["base"] / "dist2"))
        assert result.code == 0, result.err
        assert "] build:" in result.err, "a changed patch must produce a new build"
        assert nvcc_calls(demo) == before, "a Python-only change must not run nvcc"
    finally:
        patch.write_text(original)


def test_verify_passes_then_fails_after_version_bump(demo):
    wheel = only_wheel(demo["dist"])
    ok = run(demo, "verify", str(wheel))
    assert ok.code == 0, ok.out + ok.err
    assert "verified" in ok.out and "sm_121" in ok.out
    version_file = demo["project"] / "VERSION"
    saved = version_file.read_text()
    try:
        assert run(demo, "version", "bump").code == 0
        bad = run(demo, "verify", str(wheel))
        assert bad.code == 1
        assert "MISMATCH version" in bad.out
    finally:
        version_file.write_text(saved)


def test_verify_rejects_a_tampered_wheel(demo, tmp_path):
    wheel = only_wheel(demo["dist"])
    tampered = tmp_path / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tampered, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename.endswith("__init__.py"):
                data += b"\n# tampered\n"
            dst.writestr(item, data)
    result = run(demo, "verify", str(tampered))
    assert result.code == 1
    assert "Hash mismatch" in result.err


def test_verify_gate_fails_for_an_arch_not_in_the_binary(demo):
    result = run(demo, "verify", str(only_wheel(demo["dist"])), "--arch", "10.0")
    assert result.code == 1
    assert "nothing runs on 10.0" in result.out


@pytest.mark.parametrize("arch", ["9.1", "sm_12x", "12.1+ptxx", "compute_"])
def test_bad_arch_is_exit_2_naming_the_token(demo, arch):
    result = run(demo, "wheel", "--arch", arch, "--out", str(demo["base"] / "never"))
    assert_bad_input(result, repr(arch))
    assert not (demo["base"] / "never").exists()


def test_failed_build_prints_log_tail_and_leaves_no_wheel(demo, tmp_path):
    """A patch that breaks a kernel: exit 1, the compiler's error in the printed tail, nothing in dist."""
    from helpers import git

    clone = tmp_path / "clone"
    pin = next(
        line.split()[1]
        for line in (demo["project"] / "build.yaml").read_text().splitlines()
        if line.strip().startswith("commit:")
    )
    git(tmp_path, "clone", "-q", str(demo["project"] / "upstream.bundle"), str(clone))
    git(clone, "checkout", "-q", pin)
    for patch in sorted((demo["project"] / "patches").glob("*.patch")):
        git(clone, "am", "-q", str(patch))
    kernel = next((clone / "csrc").glob("*.cu"))
    kernel.write_text(kernel.read_text() + "\nthis is not CUDA;\n")
    git(clone, "commit", "-q", "-am", "Break a kernel")
    broken = demo["project"] / "patches" / "0003-break-a-kernel.patch"
    broken.write_text(git(clone, "format-patch", "-1", "--stdout") + "\n")
    out = demo["base"] / "dist-broken"
    try:
        result = run(demo, "wheel", "--arch", "9.0", "--out", str(out))
    finally:
        broken.unlink()
    assert result.code == 1
    assert "the upstream build failed" in result.err and "log:" in result.err
    assert "this is not CUDA" in result.err or "error" in result.err.lower()
    assert not out.exists() or not list(out.iterdir())
