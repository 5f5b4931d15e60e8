"""Pins by name (build.yaml's precompiled wheels, release lists) and a pin's ref held to the wheel's own version:
read from the pin before anything is fetched."""

from __future__ import annotations

import pytest

from carry.config.build import PrecompiledWheel
from carry.platforms import Platform
from carry.source import releases
from carry.util.errors import BadInput
from carry.util.pinned import Pinned
from carry.wheelbuild import precompiled
from helpers import ROOT

SHA = "ab" * 32
WHEEL = "cp38-abi3-manylinux_2_28_x86_64.whl"


def wheel(name_or_requirement: str, ref: str | None) -> PrecompiledWheel:
    if "==" in name_or_requirement:
        pinned = Pinned.by_name(name_or_requirement, SHA, "t", platform=Platform.LINUX_AMD64)
    else:
        pinned = Pinned.parse(f"/wheels/{name_or_requirement}", SHA, "t")
    return PrecompiledWheel(Platform.LINUX_AMD64, pinned, ref)


@pytest.mark.parametrize(
    ("pin", "ref", "resolved", "said"),
    [
        ("vllm==0.33.0", None, "v0.33.0", "version 0.33.0 is tag v0.33.0"),
        ("vllm==0.33.0", "v0.33.0", "v0.33.0", "version 0.33.0 is tag v0.33.0"),
        ("vllm==0.33.0", "0.33.0", "0.33.0", "version 0.33.0 is tag v0.33.0"),
        ("vllm==0.33.0", "refs/tags/v0.33.0", "refs/tags/v0.33.0", "is tag v0.33.0"),
        ("vllm==0.33.0", "4573200f17f9", "4573200f17f9", "is tag v0.33.0"),  # a commit: held to the tag's, in prove
        (f"vllm-0.33.0+cu130-{WHEEL}", None, "v0.33.0", "version 0.33.0+cu130 is tag v0.33.0"),
        (f"vllm-0.33.1.dev12+g4573200f.cu130-{WHEEL}", None, "4573200f", "names commit 4573200f"),
        (f"vllm-0.33.1.dev12+g4573200f-{WHEEL}", "4573200f17f9dba6", "4573200f17f9dba6", "names commit 4573200f"),
        (f"vllm-0.33.1.dev12+g4573200f-{WHEEL}", "main", "main", "names commit 4573200f"),  # resolved, then held
        (
            "vllm==0.33.1.dev5",
            "4573200f17f9",
            "4573200f17f9",
            "ref 4573200f17f9 taken as given (version 0.33.1.dev5 names no commit)",
        ),
    ],
)
def test_a_ref_the_version_allows(pin, ref, resolved, said):
    claim = precompiled.claim(wheel(pin, ref), "build.yaml")
    assert claim.ref == resolved and said in claim.describe()


@pytest.mark.parametrize(
    ("pin", "ref", "needles"),
    [
        (
            "vllm==0.32.0",
            "v0.33.0",
            (
                "the wheel vllm==0.32.0 is version 0.32.0",
                "built from the tag v0.32.0",
                "but ref is v0.33.0",
                "set ref: v0.32.0",
            ),
        ),
        (f"vllm-0.32.0-{WHEEL}", "main", ("version 0.32.0", "but ref is main")),
        (
            f"vllm-0.33.1.dev12+g4573200f-{WHEEL}",
            "d534f23b4782",
            ("built from commit 4573200f", "but ref is d534f23b4782"),
        ),
        ("vllm==0.33.1.dev5", None, ("version 0.33.1.dev5, which does not say which commit", "set ref")),
    ],
)
def test_a_ref_the_version_refuses(pin, ref, needles):
    with pytest.raises(BadInput) as raised:
        precompiled.claim(wheel(pin, ref), "build.yaml: build.precompiled.wheels.linux/amd64")
    for needle in needles:
        assert needle in str(raised.value), str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("requirement", "index", "needle"),
    [
        ("vllm", None, "names no single version"),
        ("vllm>=0.33", None, "names no single version"),
        ("vllm==0.33.*", None, "names no single version"),
        ("vllm==0.33.0", "ftp://mirror/simple", "is not an index URL"),
    ],
)
def test_a_bad_pin_by_name(requirement, index, needle):
    with pytest.raises(BadInput, match=needle.replace(".", r"\.")):
        Pinned.by_name(requirement, SHA, "t", index=index, platform=Platform.LINUX_AMD64)


def test_a_pin_by_name_knows_its_project_and_version():
    pinned = Pinned.by_name("vllm==0.33.1.dev12+g4573200f", SHA, "t", platform=Platform.LINUX_ARM64)
    assert (pinned.project, pinned.version, pinned.name, pinned.source) == ("vllm", "0.33.1.dev12+g4573200f", "", "")
    assert pinned.short() == "vllm==0.33.1.dev12+g4573200f (sha256 abababab…)"


def test_the_release_list_names_files_by_name_version_and_sha256(tmp_path):
    listed = releases.load(ROOT / "examples" / "vllm" / "releases.yaml")
    assert {r.name for r in listed} >= {"vllm-0.33.0.tar.gz", "vllm-0.32.0.tar.gz"}
    for release in listed:
        assert release.pinned.requirement == f"vllm=={release.version}" and release.pinned.name == release.name
        assert not release.pinned.source and release.pinned.size
    bad = tmp_path / "releases.yaml"
    bad.write_text(
        f"files:\n  - {{name: vllm-0.33.0.tar.gz, version: 0.33.0, kind: sdist, sha256: {SHA}, "
        f"url: 'http://mirror.invalid/vllm-0.33.0.tar.gz'}}\n"
    )
    with pytest.raises(BadInput, match="no url"):
        releases.load(bad)
    bad.write_text(f"files:\n  - {{name: vllm-0.33.0.whl, version: 0.33.0, kind: wheel, sha256: {SHA}}}\n")
    with pytest.raises(BadInput, match="needs its platform"):
        releases.load(bad)


def test_build_yaml_takes_one_source_per_wheel(tmp_path):
    from carry import config as configuration

    text = (ROOT / "examples" / "vllm" / "build.yaml").read_text()
    project = tmp_path / "build.yaml"
    (tmp_path / "VERSION").write_text("20261201.1\n")
    project.write_text(
        text.replace(
            "        requirement: vllm==0.33.0\n", "        requirement: vllm==0.33.0\n        path: some.whl\n", 1
        )
    )
    with pytest.raises(BadInput, match="needs one of requirement"):
        configuration.load(project)
    project.write_text(
        text.replace(
            "        requirement: vllm==0.33.0\n",
            "        requirement: vllm==0.33.0\n        index: https://nightly.index.invalid/4573200f/\n",
            1,
        )
    )
    loaded = configuration.load(project).build.precompiled.wheel_for(Platform.LINUX_AMD64).pinned
    assert loaded.index == "https://nightly.index.invalid/4573200f/" and loaded.platform is Platform.LINUX_AMD64
