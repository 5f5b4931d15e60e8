"""The one placement rule of a wheel (carry/wheelbuild/producer.py): which producer makes each platform's wheel."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from carry.app import App
from carry.platforms import Platform
from carry.wheelbuild import producer
from carry.wheelbuild.producer import Facts, Kind
from cuda_tools import counting_cuda_home
from helpers import ROOT

AMD64, ARM64 = Platform.parse("linux/amd64", "test"), Platform.parse("linux/arm64", "test")


@pytest.mark.parametrize(
    "facts, kind",
    [
        (Facts(platform=AMD64, native=AMD64), Kind.SOURCE),
        (Facts(platform=AMD64, native=AMD64, precompiled=True), Kind.PRECOMPILED),
        (Facts(platform=AMD64, native=AMD64, precompiled=True, derivable=True), Kind.DERIVED),
        (Facts(platform=AMD64, native=AMD64, derivable=True), Kind.SOURCE),  # derives only a precompiled build
        (Facts(platform=ARM64, native=AMD64, precompiled=True), Kind.PRECOMPILED),  # nothing compiles: any CPU
        (Facts(platform=ARM64, native=AMD64), Kind.BUILD_STAGE),
        (Facts(platform=ARM64, native=AMD64, made_here="pkg-1.0-py3-none-any.whl"), Kind.PURE),
        (Facts(platform=ARM64, native=AMD64, made_here="pkg-1.0-cp312-cp312-linux_x86_64.whl"), Kind.BUILD_STAGE),
        (Facts(platform=AMD64, native=AMD64, staged=True), Kind.BUILD_STAGE),  # wheel --platform <this CPU>
        (Facts(platform=AMD64, native=AMD64, staged=True, precompiled=True), Kind.PRECOMPILED),
    ],
)
def test_choose_names_the_producer_of_each_platform_s_wheel(facts, kind):
    assert producer.choose(facts) is kind
    assert producer.here(facts) == (kind in (Kind.SOURCE, Kind.PRECOMPILED, Kind.DERIVED))
    assert producer.takes_precompiled(kind) == (kind in (Kind.PRECOMPILED, Kind.DERIVED))


def test_a_pure_wheel_made_here_never_replaces_a_build_here():
    facts = Facts(platform=AMD64, native=AMD64, made_here="pkg-1.0-py3-none-any.whl")
    assert producer.choose(facts) is Kind.SOURCE
    assert producer.choose(dataclasses.replace(facts, platform=ARM64)) is Kind.PURE


def test_every_platform_s_builder_of_a_command_compiles_with_one_probe(tmp_path, monkeypatch):
    """The App probes nvcc and the host compiler once a command (the `{cuda}` tag and each platform's builder ask
    the same probe); a later command on the same machine reads the probe back without running nvcc."""
    calls = tmp_path / "nvcc-calls.log"
    monkeypatch.setenv("CUDA_HOME", str(counting_cuda_home(tmp_path, calls)))
    monkeypatch.setenv("CARRY_CACHE", str(tmp_path / "cache"))
    project = tmp_path / "demo"
    shutil.copytree(ROOT / "examples" / "demo", project, ignore=shutil.ignore_patterns("*.bundle"))
    app = App.open(project / "build.yaml")
    builders = [app.builder(None, None, platform) for platform in (AMD64, ARM64)]
    assert builders[0].tools is builders[1].tools
    tools = builders[0].tools()
    assert builders[1].tools() is tools and app.toolchain().nvcc_version == tools.nvcc_version
    assert tools.nvcc_version and "release 13" in tools.nvcc_version, tools
    assert calls.read_text().splitlines() == ["--version"]
    again = App.open(project / "build.yaml")
    assert again.builder(None, None, ARM64).tools() == tools
    assert calls.read_text().splitlines() == ["--version"]
