"""`carry pin`'s pieces without a server: the nightly block as build.yaml gives it, ${NAME} expansion, what a
nightly's version names, the refusals summed up, and the pins written into build.yaml in place, whatever shape
the file has. (On the real vLLM wheels and history, served: tests/test_nightly_pin.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from carry import config as configuration
from carry.config.build import Nightly
from carry.platforms import Platform
from carry.util import indexurl
from carry.util.errors import BadInput
from carry.wheelbuild import nightly, pins

X86, ARM = Platform.LINUX_AMD64, Platform.LINUX_ARM64
C = "53da57354abe834f1dc760b951cf23f097b5f91b"
SHA = "942f215ab5621c5f1e4bd8f2b0d0cc2b76dd1b2cd41f8b3b8c3bb2d7b9f0c8a1"

HEAD = """\
# a project
upstream:
  url: /nowhere
  commit: 4573200f17f9dba6ef84c3ce59fb24d5a81e9a51
build:
  precompiled:
    env: {VLLM_USE_PRECOMPILED: "1", VLLM_PRECOMPILED_WHEEL_LOCATION: "{wheel}"}
    inputs:
      "csrc/**": the CUDA sources
"""
TAIL = "\n# the image\nimage:\n  name: demo\n"


def load(tmp_path: Path, text: str):
    path = tmp_path / "build.yaml"
    path.write_text(text)
    return configuration.load(path)


def test_a_nightly_block_without_wheels_loads_with_its_defaults(tmp_path):
    loaded = load(tmp_path, HEAD + "    nightly:\n      index: ${VLLM_NIGHTLY_INDEX}/\n" + TAIL)
    settings = loaded.build.precompiled
    assert settings.wheels == () and settings.nightly == Nightly("${VLLM_NIGHTLY_INDEX}", None, 50)
    loaded = load(tmp_path, HEAD + "    nightly: {index: 'https://wheels.example/', variant: cu130, max_walk: 3}\n")
    assert loaded.build.precompiled.nightly == Nightly("https://wheels.example", "cu130", 3)


@pytest.mark.parametrize(
    ("block", "needle"),
    [
        ("nightly: {variant: cu130}", "build.precompiled.nightly.index is required"),
        ("nightly:", "build.precompiled.nightly.index is required"),
        ("nightly: {index: ftp://x/y}", "is not an index URL"),
        ("nightly: {index: $VLLM_INDEX}", "a '$' outside ${NAME}"),
        ("nightly: {index: 'https://x', variant: cu130/x}", "variant 'cu130/x' is not a variant name"),
        ("nightly: {index: 'https://x', variant: ..}", "variant '..' is not a variant name"),
        ("nightly: {index: 'https://x', max_walk: 0}", "max_walk must be a positive integer"),
        ("nightly: {index: 'https://x', walk: 3}", "unknown key build.precompiled.nightly.walk"),
    ],
)
def test_a_bad_nightly_block_is_bad_input(tmp_path, block, needle):
    with pytest.raises(BadInput, match=None) as raised:
        load(tmp_path, HEAD + f"    {block}\n")
    assert needle in str(raised.value), raised.value


def test_without_nightly_the_wheels_stay_required(tmp_path):
    with pytest.raises(BadInput) as raised:
        load(tmp_path, HEAD)
    assert "build.precompiled.wheels must be a mapping of platform" in str(raised.value)


def test_an_index_from_the_environment(monkeypatch):
    monkeypatch.setenv("VLLM_NIGHTLY_INDEX", "https://user:token@wheels.example/root")
    assert indexurl.expand("${VLLM_NIGHTLY_INDEX}/abc/", "w") == "https://user:token@wheels.example/root/abc/"
    monkeypatch.setenv("VLLM_NIGHTLY_INDEX", "not a url")
    with pytest.raises(BadInput, match="is not an index URL"):
        indexurl.expand("${VLLM_NIGHTLY_INDEX}", "w")
    monkeypatch.delenv("VLLM_NIGHTLY_INDEX")
    with pytest.raises(BadInput, match=r"but \$VLLM_NIGHTLY_INDEX is not set; export VLLM_NIGHTLY_INDEX="):
        indexurl.expand("${VLLM_NIGHTLY_INDEX}", "w")
    assert indexurl.expand("https://plain/", "w") == "https://plain/"


@pytest.mark.parametrize(
    ("filename", "named"),
    [
        ("vllm-0.11.2.dev278+gdbc3d9991-cp38-abi3-manylinux1_x86_64.whl", ("dbc3d9991", None)),
        ("vllm-0.11.1rc8.dev14+gaa384b3c0.cu130-cp38-abi3-manylinux1_x86_64.whl", ("aa384b3c0", "cu130")),
        ("vllm-0.10.2rc2+cu129-cp38-abi3-manylinux2014_aarch64.whl", (None, "cu129")),
        ("vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl", (None, None)),
    ],
)
def test_what_a_nightly_version_names(filename, named):
    match = nightly.WHEEL_RE.match(filename)
    entry = nightly.Entry(filename, "u", "vllm", match.group("version"), match.group("platform"))
    assert entry.names() == named


def entry(version: str, tag: str = "manylinux_2_28_x86_64") -> nightly.Entry:
    return nightly.Entry(f"vllm-{version}-cp38-abi3-{tag}.whl", "u", "vllm", version, tag)


def test_a_listed_wheel_must_be_this_commits_of_this_variant():
    def tagged(release: str) -> tuple[str, str | None]:
        return {"0.33.0": ("v0.33.0", C), "0.32.0": ("v0.32.0", "d534f23b" * 5)}.get(release, (f"v{release}", None))

    def names(version: str, variant: str | None) -> tuple[str, str | None]:
        return pins._names(entry(version), C, variant, tagged)

    assert names(f"0.33.1.dev1+g{C[:9]}.cu130", "cu130") == (f"commit {C[:9]}", None)
    assert names(f"0.33.1.dev1+g{C[:9]}", None) == (f"commit {C[:9]}", None)
    assert names(f"0.33.1.dev1+g{C[:9]}", "cu130") == (f"commit {C[:9]}", None)  # an alias of the default
    assert names("0.33.0", None) == ("tag v0.33.0", None)  # a release built at its tagged commit
    assert names("0.33.0+cu130", "cu130") == ("tag v0.33.0", None)
    assert "a wheel of variant cu129, on the cu130 variant's page" in names(f"0.33.1.dev1+g{C[:9]}.cu129", "cu130")[1]
    assert "a wheel of variant cu130, on the default variant's page" in names(f"0.33.1.dev1+g{C[:9]}.cu130", None)[1]
    assert "a wheel of variant cu130, on the default variant's page" in names("0.33.0+cu130", None)[1]
    assert "names commit 4573200f1, not this one" in names("0.33.1.dev1+g4573200f1", None)[1]
    assert "names no commit (+g<sha>) and no release" in names("0.33.1.dev1", None)[1]
    assert "the release 0.32.0, whose tag v0.32.0 is commit d534f23bd534, not this commit" in names("0.32.0", None)[1]
    assert "the release 0.34.0, whose tag v0.34.0 is not upstream" in names("0.34.0", None)[1]


def test_the_wheel_pip_would_take_for_a_platform():
    listing = nightly.Listing(
        "u",
        (
            entry("0.33.1.dev1+gabc", "manylinux_2_31_x86_64"),
            entry("0.33.1.dev1+gabc", "manylinux_2_28_aarch64"),
            entry("0.33.1.dev1+gabc", "manylinux_2_39_aarch64"),  # newer than the images' glibc 2.36
        ),
    )
    assert listing.wheel_for("vllm", X86).platform_tag == "manylinux_2_31_x86_64"
    assert listing.wheel_for("vllm", ARM).platform_tag == "manylinux_2_28_aarch64"
    assert listing.wheel_for("other", X86) is None


def test_refusals_are_summed_up_in_runs():
    refused = [pins.Refused(c * 40, r) for c, r in (("a", "no cu130 wheels (404)"), ("b", "no cu130 wheels (404)"))]
    refused.append(pins.Refused("c" * 40, "inputs differ at csrc/x.cu"))
    assert pins.summary(refused) == (
        f"{'a' * 12}..{'b' * 12} (2 commits): no cu130 wheels (404); {'c' * 12}: inputs differ at csrc/x.cu"
    )
    many = [pins.Refused(f"{i:040x}", f"reason {i}") for i in range(30)]
    assert pins.summary(many).endswith("… 21 more run(s)")


def fields(name: str) -> dict[str, str]:
    return {"requirement": f"vllm=={name}", "index": "${IDX}/" + C + "/cu130/", "sha256": SHA, "ref": C}


@pytest.mark.parametrize(
    "wheels",
    [
        "",  # no wheels key: added after the last key of build.precompiled
        "    wheels:   # carry pin writes these\n",
        "    wheels: {}\n",
        "    wheels:\n      linux/amd64: {path: /x.whl, sha256: " + "cd" * 32 + "}\n",
        "    wheels:\n      linux/amd64:\n        requirement: vllm==0.33.0  # the release\n        sha256: "
        + "cd" * 32
        + "\n        ref: v0.33.0\n      linux/arm64:\n        path: /y.whl\n        sha256: "
        + "cd" * 32
        + "\n",
    ],
    ids=["absent", "null-with-comment", "empty-flow", "flow-entry", "block-entries"],
)
def test_pins_are_written_in_place_whatever_shape_the_file_has(tmp_path, wheels):
    text = HEAD + "    nightly:\n      index: ${IDX}  # the per-commit index\n      variant: cu130\n" + wheels + TAIL
    path = tmp_path / "build.yaml"
    path.write_text(text)
    wanted = {X86: fields("1.dev1+gabc.cu130"), ARM: fields("1.dev2+gdef.cu130")}
    assert pins.write(path, wanted) is True
    written = path.read_text()
    data = yaml.safe_load(written)
    assert data["build"]["precompiled"]["wheels"] == {str(p): f for p, f in wanted.items()}
    assert written.startswith(HEAD) and written.endswith(TAIL)  # the rest of the file as it was
    assert "# the per-commit index" in written and 'index: "${IDX}/' in written
    if "# the release" in wheels:
        assert "requirement: vllm==1.dev1+gabc.cu130  # the release" in written  # a value replaced, its comment kept
    loaded = configuration.load(path)
    assert loaded.build.precompiled.wheel_for(ARM).pinned.index == "${IDX}/" + C + "/cu130/"
    assert pins.write(path, wanted) is False and path.read_text() == written  # the same pins: no byte rewritten


def test_a_shallow_boundary_whose_parent_came_later_is_settled(tmp_path):
    """A pin fetched at depth 1 stays marked shallow after main brings its parent: git then finds no merge base
    (no --deepen changes it) until the mark is dropped (git.settle_shallow; upstream.merge_base does it)."""
    from carry.source import git
    from helpers import Upstream
    from helpers import git as run_git

    upstream = Upstream.create(tmp_path / "upstream", {"a.py": "a = 1\n"})
    base = upstream.commit("base", {"a.py": "a = 2\n"})
    run_git(upstream.path, "checkout", "-q", "-b", "pr")
    pr = upstream.commit("pr", {"b.py": "b = 1\n"})
    run_git(upstream.path, "checkout", "-q", "main")
    mirror = tmp_path / "mirror.git"
    git.init_bare(mirror)
    git.fetch(mirror, str(upstream.path), pr, depth=1)
    git.fetch(mirror, str(upstream.path), "+refs/heads/main:refs/heads/main")
    assert git.shallow_commits(mirror) == {pr} and git.merge_base(mirror, pr, base) is None
    assert git.settle_shallow(mirror) is True
    assert git.shallow_commits(mirror) == set() and git.merge_base(mirror, pr, base) == base
    assert git.settle_shallow(mirror) is False


def test_a_release_pin_moved_in_place_adds_no_key_it_does_not_name(tmp_path):
    """`follow` moves a release pin (requirement, sha256, ref; no index) written as a block mapping: each value is
    replaced in place, its comment kept, and no other key is added."""
    entry = (
        "    wheels:\n      linux/amd64:\n        requirement: vllm==0.32.0  # the release\n"
        "        sha256: " + "cd" * 32 + "\n        ref: v0.32.0\n"
    )
    path = tmp_path / "build.yaml"
    path.write_text(HEAD + entry + TAIL)
    moved = {"requirement": "vllm==0.33.0", "sha256": SHA, "ref": "v0.33.0"}
    assert pins.write(path, {X86: moved}) is True
    written = path.read_text()
    assert "requirement: vllm==0.33.0  # the release\n" in written and "index" not in written, written
    assert yaml.safe_load(written)["build"]["precompiled"]["wheels"] == {str(X86): moved}
