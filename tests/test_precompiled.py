"""The fixed vLLM wheel in minutes: examples/vllm on the real vLLM 0.33.0 history (made from PyPI's sdists), its
Python-only series built in precompiled mode from vLLM's own released wheels, for x86_64 and, from this x86_64
machine, for aarch64 — with every property proven: tags, byte-identical shared objects, the upstream's
Requires-Dist, the gate, the tree check, verify; and the ways it must refuse."""

from __future__ import annotations

import email.parser
import json
import re
import shutil
import zipfile
from pathlib import Path

import pytest

import realvllm
from carry.binaries import wheelzip
from carry.util import reporter
from helpers import ROOT, assert_bad_input, carry
from lib.vllm import WHEELS, example_project

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples" / "vllm"


@pytest.fixture(scope="module")
def history(vllm_history) -> Path:
    """The run's vLLM history (tests/conftest.py)."""
    return Path(vllm_history["path"])


def make_project(root: Path, history: Path) -> Path:
    """examples/vllm copied, its upstream.url pointing at the history."""
    return example_project(root, history)


@pytest.fixture(scope="module")
def project(tmp_path_factory, history, fixed_wheels):
    """examples/vllm on the history, in a hardlinked copy of the cache where the run's fixed wheels were built;
    removed when the module ends (its rebuilds write about 1.2 GB of their own, docs/testing.md)."""
    root = tmp_path_factory.mktemp("example")
    config = make_project(root / "vllm", history)
    env = {"CARRY_CACHE": str(fixed_wheels.cache_copy(root / "cache")), "CARRY_DOWNLOADS": realvllm.download_store()}
    yield config, env, root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def built(fixed_wheels):
    """Both platforms' fixed wheels, built once for the run (tests/conftest.py `fixed_wheels`): (wheel, what
    `carry wheel` said)."""
    return {platform: (fixed_wheels.wheels[platform], fixed_wheels.results[platform]) for platform in WHEELS}


def example_generated() -> tuple:
    from carry import config as configuration

    return configuration.load(EXAMPLE / "build.yaml").build.generated


def members(wheel: Path) -> dict[str, str]:
    """installed path -> RECORD hash."""
    with zipfile.ZipFile(wheel) as archive:
        info = next(n.split("/")[0] for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        rows = [row.split(",") for row in archive.read(f"{info}/RECORD").decode().splitlines()]
    return {row[0]: row[1] for row in rows if row[1] and ".dist-info/" not in row[0]}


def metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(archive.read(name).decode())


@pytest.mark.parametrize("platform", WHEELS)
def test_the_fixed_wheel_is_what_vllm_would_publish(built, platform):
    wheel, result = built[platform]
    released = realvllm.path(WHEELS[platform])
    machine = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}[platform]
    assert wheel.name == f"vllm-0.33.0+carry.20261201.1-cp38-abi3-manylinux_2_28_{machine}.whl"
    sha = realvllm.pinned(WHEELS[platform]).pinned.sha256
    assert (
        f"precompiled: 13 shared objects from {released.name} (sha256 {sha[:8]}…), compiled inputs identical "
        f"to v0.33.0 ({realvllm.V0_33_0[:12]}); version 0.33.0 is tag v0.33.0"
    ) in result.err
    assert "job(s)" not in result.err and "compiler cache" not in result.err and "nothing compiles" in result.err
    assert "env " in result.err and "torch 2.14.0+cu130" in result.err
    ours, theirs = members(wheel), members(released)
    assert set(ours) == set(theirs), "the same files as vLLM's own wheel for this platform"
    shared = [path for path in theirs if ".so" in Path(path).suffixes]
    assert len(shared) == 13 and all(ours[path] == theirs[path] for path in shared)
    assert ours["vllm/vllm-rs"] == theirs["vllm/vllm-rs"]
    with zipfile.ZipFile(wheel) as archive:
        assert (
            "vllm/_version.py" in theirs
            and "Failed to read the version from vllm/_version.py" in archive.read("vllm/version.py").decode()
        )
        head = archive.read("vllm/_C_stable_libtorch.abi3.so")[:20]
        assert head[18] == {"x86_64": 62, "aarch64": 183}[machine]
        info = json.loads(archive.read(next(n for n in archive.namelist() if n.endswith("carry-buildinfo.json"))))
    requires = metadata(wheel).get_all("Requires-Dist")
    assert requires == metadata(released).get_all("Requires-Dist") and not any("+cpu" in r for r in requires)
    assert any(r.startswith("torch==2.14.0") for r in requires)
    assert info["platform"] == platform and info["precompiled"]["sha256"] == sha
    assert info["precompiled"]["commit"] == realvllm.V0_33_0 and info["gate"]["ok"] and info["tree_check"]["ok"]
    assert f"cpu: 13/13 shared object(s) are {machine} code ({platform})" in result.err
    # vllm/_version.py: not tracked (the history is vLLM's git), excluded by vLLM's .gitignore, written by this
    # build (its content is the build's, not the precompiled wheel's), and no build.generated names it
    assert not example_generated() and info["tree_check"]["ignored"] == ["vllm/_version.py"]
    assert re.search(
        r"tree check passed: \d+ identical to tree \w+, 2147 byte-identical to the precompiled wheel, "
        r"1 generated \(ignored by the upstream's \.gitignore, written by this build: vllm/_version\.py\)",
        result.err,
    )
    with zipfile.ZipFile(wheel) as archive:
        assert "0.33.0+carry.20261201.1" in archive.read("vllm/_version.py").decode()


def test_verify_gate_and_a_rerun_of_the_fixed_wheels(project, built):
    config, env, root = project
    for wheel, _ in built.values():
        verified = carry("--config", str(config), "verify", str(wheel), env=env)
        assert verified.code == 0, verified.out + verified.err
        assert "byte-identical to vllm-0.33.0-cp38-abi3-manylinux_2_28" in verified.out and "verified" in verified.out
        assert (
            "1 generated (ignored by the upstream's .gitignore, written by this build: vllm/_version.py)"
            in verified.out
        )
        gated = carry("--config", str(config), "gate", str(wheel), env=env)
        assert gated.code == 0, gated.out + gated.err
    again = carry("--config", str(config), "wheel", "--out", str(root / "dist"), env=env)
    assert again.code == 0 and "reused from cache" in again.err and "materialize" not in again.err


PATCH_HEAD = (
    "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
    "From: carry tests <tests@carry.invalid>\nDate: Tue, 1 Dec 2026 00:00:00 +0000\n"
)


def comment_patch(path: str, subject: str, line: str) -> str:
    """A patch adding `line` above the first line (the SPDX header) of `path`."""
    return (
        PATCH_HEAD + f"Subject: [PATCH] {subject}\n\n---\ndiff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
        f"@@ -1 +1,2 @@\n+{line}\n # SPDX-License-Identifier: Apache-2.0\n"
    )


def record(wheel: Path) -> dict[str, str]:
    """Every RECORD row but RECORD's own: path -> hash,size."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        rows = [row.split(",", 1) for row in archive.read(name).decode().splitlines() if row]
    return {path: rest for path, rest in rows if path != name}


def test_a_python_only_change_derives_the_fixed_wheel_from_the_last_build(tmp_path, project, built, history):
    """A patch added to the series (a comment in vllm/version.py), on the cache where the committed series was
    built by the upstream's PEP 517 build: each platform's wheel is that wheel with one member replaced, in
    seconds, and passes the same tree check, gate and verify; the upstream's own build of the same tree in a
    fresh cache writes the same RECORD, row for row (the buildinfo included). (When a change cannot be derived:
    tests/test_derive.py.)"""
    _, env, _ = project
    config = make_project(tmp_path / "vllm", history)
    changed = "vllm/version.py"
    (config.parent / "patches" / "0003-version-a-comment.patch").write_text(
        comment_patch(changed, "version: a comment", "# carry: derived")
    )
    derived = {}
    for platform, (before, _) in built.items():
        out = tmp_path / "dist"
        result = carry("--config", str(config), "wheel", "--platform", platform, "--out", str(out), env=env)
        assert result.code == 0, result.err
        assert re.search(
            r"derive: from the PEP 517 build of tree \w+ \(\w+\): 1 member\(s\) replaced \(vllm/version.py\)",
            result.err,
        ), result.err
        assert "build_wheel" not in result.err and "materialize" not in result.err
        assert "tree check passed" in result.err and "arch gate passed" in result.err
        wheel = derived[platform] = Path(result.out.strip())
        ours, theirs = members(wheel), members(before)
        assert set(ours) == set(theirs) and [p for p in ours if ours[p] != theirs[p]] == [changed]
        with zipfile.ZipFile(wheel) as archive:
            assert archive.read(changed).startswith(b"# carry: derived\n")
            info = json.loads(archive.read(next(n for n in archive.namelist() if n.endswith("carry-buildinfo.json"))))
        assert [p["name"] for p in info["series"]["patches"]][-1] == "0003-version-a-comment.patch"
        verified = carry("--config", str(config), "verify", str(wheel), env=env)
        assert verified.code == 0 and "verified" in verified.out, verified.out + verified.err
    fresh = {**env, "CARRY_CACHE": str(tmp_path / "fresh-cache")}
    result = carry("--config", str(config), "wheel", "--out", str(tmp_path / "dist-pep517"), env=fresh)
    assert result.code == 0 and "build: PEP 517 build_wheel" in result.err, result.err
    assert "derive: not derived: no earlier build" in result.err
    assert record(Path(result.out.strip())) == record(derived["linux/amd64"])
    shutil.rmtree(tmp_path / "fresh-cache", ignore_errors=True)


def test_a_series_touching_a_cu_file_stops_before_any_build_work(tmp_path, history):
    config = make_project(tmp_path / "vllm", history)
    cu = "csrc/activation_kernels.cu"
    (config.parent / "patches" / "0003-activation-kernels-comment.patch").write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: carry tests <tests@carry.invalid>\nDate: Tue, 1 Dec 2026 00:00:00 +0000\n"
        "Subject: [PATCH] activation kernels: a comment\n\n---\n"
        f"diff --git a/{cu} b/{cu}\n--- a/{cu}\n+++ b/{cu}\n@@ -1 +1,2 @@\n+// carry: a compiled input changed\n"
        " #include <cuda.h>\n"
    )
    env = {"CARRY_CACHE": str(tmp_path / "cache"), "CARRY_DOWNLOADS": realvllm.download_store()}
    result = carry("--config", str(config), "wheel", "--out", str(tmp_path / "dist"), env=env)
    assert result.code == 1, result.err
    assert (
        f"precompiled: the compiled inputs differ from v0.33.0, which the precompiled wheel was built from: "
        f"{cu} (0003-activation-kernels-comment.patch)"
    ) in result.err
    assert "wheel --from-source" in result.err
    assert "materialize" not in result.err and "env " not in result.err and not (tmp_path / "dist").exists()
    assert not (tmp_path / "cache" / "envs").exists()


def test_another_precompiled_wheel_is_another_build(tmp_path, history, fixed_wheels):
    """The precompiled wheel is in the key: a different file (here vLLM's wheel with one member more) rebuilds, in
    a cache that holds the fixed wheel built from the released one (a copy of the run's, `fixed_wheels`)."""
    config = make_project(tmp_path / "vllm", history)
    cache = fixed_wheels.cache_copy(tmp_path / "cache")
    env = {"CARRY_CACHE": str(cache), "CARRY_DOWNLOADS": realvllm.download_store()}
    other = tmp_path / "wheels" / realvllm.WHEEL_X86
    other.parent.mkdir()
    wheelzip.rewrite(realvllm.path(realvllm.WHEEL_X86), other, {"vllm/third_party/deep_gemm/CARRY_NOTE": b"rebuilt\n"})
    from carry.util.integrity import file_sha256

    text = config.read_text()
    sha = realvllm.pinned(realvllm.WHEEL_X86).pinned.sha256
    config.write_text(
        text.replace(
            f"requirement: vllm==0.33.0\n        sha256: {sha}", f"path: {other}\n        sha256: {file_sha256(other)}"
        )
    )
    assert f"path: {other}" in config.read_text()
    result = carry("--config", str(config), "wheel", "--out", str(tmp_path / "dist"), env=env)
    assert result.code == 0, result.err
    assert "materialize" in result.err and "reused" not in result.err.split("env ")[0]
    assert f"from {other.name} (sha256 {file_sha256(other)[:8]}…)" in result.err
    with zipfile.ZipFile(result.out.strip()) as archive:
        assert archive.read("vllm/third_party/deep_gemm/CARRY_NOTE") == b"rebuilt\n"


SHA_X86 = "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"
SHA_ARM = "e9e404f52c8494b69bd83fe99fe7ecfa9f6b89fbd156d2a9639c24ea41d6d606"
SHA_032_X86 = "5e2ecdc5b0baf72921c288486417ca82778456a448e4fe60b62ee43c0dfc8611"  # vllm 0.32.0's x86_64 wheel
AMD64_PIN = f"linux/amd64:\n        requirement: vllm==0.33.0\n        sha256: {SHA_X86}\n        ref: v0.33.0\n"


def pin_amd64(text: str, *lines: str) -> str:
    """The example's build.yaml with its linux/amd64 pin replaced by `lines`."""
    assert AMD64_PIN in text
    return text.replace(AMD64_PIN, "linux/amd64:\n" + "".join(f"        {line}\n" for line in lines), 1)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (
            lambda text: pin_amd64(text, f"path: {realvllm.path(realvllm.WHEEL_X86)}", f"sha256: {'ab' * 32}"),
            f"sha256 is {SHA_X86}, not the pinned",
        ),
        (
            lambda text: pin_amd64(text, f"path: {realvllm.path(realvllm.WHEEL_ARM)}", f"sha256: {SHA_ARM}"),
            "not a wheel for linux/amd64",
        ),
        (
            lambda text: text.replace(
                'VLLM_PRECOMPILED_WHEEL_LOCATION: "{wheel}"', "VLLM_PRECOMPILED_WHEEL_LOCATION: x"
            ),
            "must hand the wheel to the upstream's build",
        ),
        (lambda text: pin_amd64(text, "requirement: vllm>=0.33.0", f"sha256: {SHA_X86}"), "names no single version"),
        (
            lambda text: pin_amd64(
                text, f"path: {realvllm.path(realvllm.WHEEL_X86)}", "index: file:///nowhere", f"sha256: {SHA_X86}"
            ),
            "index is for a wheel pinned by requirement",
        ),
    ],
)
def test_a_wrong_precompiled_pin_is_bad_input(tmp_path, history, edit, needle):
    config = make_project(tmp_path / "vllm", history)
    config.write_text(edit(config.read_text()))
    env = {"CARRY_CACHE": str(tmp_path / "cache"), "CARRY_DOWNLOADS": realvllm.download_store()}
    assert_bad_input(carry("--config", str(config), "wheel", "--out", str(tmp_path / "dist"), env=env), needle)
    assert not (tmp_path / "dist").exists()


def test_a_python_only_build_after_a_precompiled_one_holds_no_shared_object(project, built):
    """The build dir is cleaned: the precompiled build's extracted .so files do not reach a later build."""
    config, env, root = project
    empty = config.with_name("python-only.yaml")
    empty.write_text(config.read_text().replace("VLLM_TARGET_DEVICE: cuda", "VLLM_TARGET_DEVICE: empty"))
    result = carry(
        "--config", str(empty), "wheel", "--from-source", "--arch", "none", "--out", str(root / "dist-empty"), env=env
    )
    assert result.code == 0, result.err
    assert re.search(r"removed \d+ earlier build output\(s\)", result.err) and "Python only" in result.err
    with zipfile.ZipFile(result.out.strip()) as archive:
        assert not [n for n in archive.namelist() if ".so" in Path(n).suffixes]


def test_the_build_context_carries_the_precompiled_wheel(tmp_path, history):
    """A hermetic image build fetches nothing: the context holds each platform's precompiled wheel where the build
    stage's download store ($CARRY_DOWNLOADS=/carry/cache/downloads) looks for it."""
    import os

    from carry import config as configuration
    from carry.image.buildkit import container
    from carry.platforms import Platform
    from carry.source import upstream
    from carry.util.cache import Cache

    project = make_project(tmp_path / "vllm", history)
    os.environ.setdefault("CARRY_DOWNLOADS", realvllm.download_store())
    loaded, cache = configuration.load(project), Cache(tmp_path / "cache")
    mirror = upstream.ensure_base(loaded, cache)
    context = tmp_path / "context"
    container.assemble_context(loaded, cache, mirror, context, [], (Platform.LINUX_ARM64,))
    pinned = realvllm.pinned(realvllm.WHEEL_ARM).pinned
    carried = context / "cache" / "downloads" / pinned.sha256 / pinned.name
    assert carried.stat().st_size == pinned.size
    assert carried.stat().st_ino == realvllm.path(realvllm.WHEEL_ARM).stat().st_ino  # hardlinked, not copied
    assert not (context / "cache" / "downloads" / realvllm.pinned(realvllm.WHEEL_X86).pinned.sha256).exists()
    assert "CARRY_DOWNLOADS=/carry/cache/downloads" in (ROOT / "Dockerfile").read_text()


def test_a_pin_by_name_resolves_the_file_the_url_pin_did(tmp_path):
    """`requirement: vllm==0.33.0` with its sha256: pip, with this machine's own index configuration and nothing
    carry wrote, fetches the very file releases.yaml pins (the one the URL pin named): same name, size, sha256;
    the second time from the store, asking no index."""
    from carry import config as configuration
    from carry.platforms import Platform
    from carry.util.download import Store
    from carry.util.integrity import file_sha256

    loaded = configuration.load(EXAMPLE / "build.yaml")
    pinned = loaded.build.precompiled.wheel_for(Platform.LINUX_AMD64).pinned
    assert pinned.requirement == "vllm==0.33.0" and not pinned.source and not pinned.name
    released = realvllm.pinned(realvllm.WHEEL_X86).pinned
    store = Store(tmp_path / "store")
    try:
        with reporter.recording() as said:
            got = store.get(pinned)
        assert got.name == realvllm.WHEEL_X86 == released.name
        assert got.stat().st_size == released.size and file_sha256(got) == released.sha256 == pinned.sha256
        assert got == store.root / released.sha256 / released.name
        assert len(said) == 1 and "(vllm==0.33.0 for linux/amd64) with pip from" in said[0]
        assert "sha256 4b6bdec4" in said[0]
        with reporter.recording() as again:
            assert store.get(pinned) == got
        assert again == []
        # no pip scratch dir left: the file under its sha256, and its stamp (checked/) from the one hash made
        assert sorted(p.name for p in store.root.iterdir()) == sorted([released.sha256, "checked"])
        assert len(list((store.root / "checked").iterdir())) == 1
    finally:
        shutil.rmtree(tmp_path / "store", ignore_errors=True)


@pytest.fixture()
def local_index(tmp_path):
    """A simple-API index (PEP 503, file://) that serves vLLM 0.33.0's x86_64 wheel only."""
    files, project = tmp_path / "index" / "files", tmp_path / "index" / "simple" / "vllm"
    files.mkdir(parents=True)
    project.mkdir(parents=True)
    import os

    os.link(realvllm.path(realvllm.WHEEL_X86), files / realvllm.WHEEL_X86)
    (project / "index.html").write_text(
        f'<html><body><a href="../../files/{realvllm.WHEEL_X86}#sha256={SHA_X86}">'
        f"{realvllm.WHEEL_X86}</a></body></html>\n"
    )
    yield f"file://{tmp_path / 'index' / 'simple'}"
    shutil.rmtree(tmp_path / "index", ignore_errors=True)


def test_a_pin_names_its_index(tmp_path, local_index, history):
    """`index:` (vLLM's per-commit nightly index, a mirror): pip is told that index, and the wheel comes from it."""
    from carry.platforms import Platform
    from carry.util.download import Store
    from carry.util.pinned import Pinned

    pinned = Pinned.by_name("vllm==0.33.0", SHA_X86, "test", index=local_index, platform=Platform.LINUX_AMD64)
    try:
        with reporter.recording() as said:
            got = Store(tmp_path / "store").get(pinned)
        assert got.name == realvllm.WHEEL_X86 and local_index in said[0]
    finally:
        shutil.rmtree(tmp_path / "store", ignore_errors=True)


@pytest.mark.parametrize(
    ("lines", "needles"),
    [
        (
            ("requirement: vllm==0.32.0", f"sha256: {SHA_032_X86}", "ref: v0.32.0"),
            ("no wheel of vllm==0.32.0 for linux/amd64", "no such version, or none for that platform"),
        ),
        (
            ("requirement: vllm==0.33.0", f"sha256: {'ab' * 32}"),
            (f"serves vllm==0.33.0 for linux/amd64 with sha256 {SHA_X86}", f"not the pinned {'ab' * 32}"),
        ),
    ],
)
def test_what_the_index_does_not_serve_is_bad_input(tmp_path, local_index, history, lines, needles):
    config = make_project(tmp_path / "vllm", history)
    config.write_text(pin_amd64(config.read_text(), *lines, f"index: {local_index}"))
    env = {"CARRY_CACHE": str(tmp_path / "cache"), "CARRY_DOWNLOADS": str(tmp_path / "store")}
    result = carry("--config", str(config), "wheel", "--out", str(tmp_path / "dist"), env=env)
    assert_bad_input(result, *needles, local_index, "build.precompiled.wheels.linux/amd64")
    assert not (tmp_path / "dist").exists() and not list((tmp_path / "store").glob("*/*"))


def test_no_wheel_for_the_platform_is_bad_input(tmp_path, local_index, history):
    config = make_project(tmp_path / "vllm", history)
    arm = f"linux/arm64:\n        requirement: vllm==0.33.0\n        sha256: {SHA_ARM}\n"
    text = config.read_text()
    assert arm in text
    config.write_text(text.replace(arm, arm + f"        index: {local_index}\n"))
    env = {"CARRY_CACHE": str(tmp_path / "cache"), "CARRY_DOWNLOADS": str(tmp_path / "store")}
    result = carry(
        "--config", str(config), "wheel", "--platform", "linux/arm64", "--out", str(tmp_path / "dist"), env=env
    )
    assert_bad_input(result, "no wheel of vllm==0.33.0 for linux/arm64", "manylinux", local_index)
    assert not (tmp_path / "dist").exists()


def test_a_pins_ref_is_proven_before_any_work(tmp_path, history):
    """0.32.0's released x86_64 wheel (its real sha256) pinned as `ref: v0.33.0`: the pin's own version says
    0.32.0, so it is refused before anything is fetched, checked or built."""
    config = make_project(tmp_path / "vllm", history)
    config.write_text(
        pin_amd64(config.read_text(), "requirement: vllm==0.32.0", f"sha256: {SHA_032_X86}", "ref: v0.33.0")
    )
    env = {"CARRY_CACHE": str(tmp_path / "cache"), "CARRY_DOWNLOADS": str(tmp_path / "store")}
    result = carry("--config", str(config), "wheel", "--out", str(tmp_path / "dist"), env=env)
    assert_bad_input(
        result,
        "is version 0.32.0",
        "built from the tag v0.32.0",
        "but ref is v0.33.0",
        "build.precompiled.wheels.linux/amd64",
    )
    assert not (tmp_path / "store").exists() and not (tmp_path / "dist").exists()
    assert not (tmp_path / "cache" / "mirrors").exists() and not (tmp_path / "cache" / "envs").exists()


def test_an_own_series_on_the_honest_history_builds_both_cpus(tmp_path, history):
    """A series of our own (a file under vllm/ changed, a module added) with build.generated naming
    vllm/_version.py: the build's copy wins over the precompiled wheel's; both CPUs' wheels build, verify, gate."""
    config = make_project(tmp_path / "vllm", history)
    for patch in (config.parent / "patches").glob("*.patch"):
        patch.unlink()
    head = (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: carry tests <tests@carry.invalid>\nDate: Tue, 1 Dec 2026 00:00:00 +0000\n"
    )
    changed = "vllm/version.py"
    (config.parent / "patches" / "0001-version-a-comment.patch").write_text(
        head + f"Subject: [PATCH 1/2] version: a comment\n\n---\ndiff --git a/{changed} b/{changed}\n"
        f"--- a/{changed}\n+++ b/{changed}\n@@ -1 +1,2 @@\n+# carry: a line of the series\n"
        " # SPDX-License-Identifier: Apache-2.0\n"
    )
    (config.parent / "patches" / "0002-add-a-module.patch").write_text(
        head + "Subject: [PATCH 2/2] add a module\n\n---\ndiff --git a/vllm/carry_note.py b/vllm/carry_note.py\n"
        "new file mode 100644\n--- /dev/null\n+++ b/vllm/carry_note.py\n@@ -0,0 +1 @@\n+NOTE = 'carried'\n"
    )
    text = config.read_text()
    config.write_text(
        text.replace(
            "  precompiled:\n", "  generated:\n    vllm/_version.py: setuptools-scm writes it\n  precompiled:\n", 1
        )
    )
    env = {"CARRY_CACHE": str(tmp_path / "cache"), "CARRY_DOWNLOADS": realvllm.download_store()}
    for platform in WHEELS:
        result = carry(
            "--config", str(config), "wheel", "--platform", platform, "--out", str(tmp_path / "dist"), env=env
        )
        assert result.code == 0, result.err
        assert re.search(
            r"tree check passed: \d+ identical to tree \w+, 2147 byte-identical to the precompiled "
            r"wheel, 1 generated by the build \(build.generated\)",
            result.err,
        ), result.err
        wheel = Path(result.out.strip())
        with zipfile.ZipFile(wheel) as archive:
            assert "# carry: a line of the series" in archive.read(changed).decode()
            assert archive.read("vllm/carry_note.py") == b"NOTE = 'carried'\n"
            assert "+carry." in archive.read("vllm/_version.py").decode()
        assert set(members(wheel)) == set(members(realvllm.path(WHEELS[platform]))) | {"vllm/carry_note.py"}
        verified = carry("--config", str(config), "verify", str(wheel), env=env)
        assert verified.code == 0 and "verified" in verified.out, verified.out + verified.err
        gated = carry("--config", str(config), "gate", str(wheel), env=env)
        assert gated.code == 0, gated.out + gated.err
    shutil.rmtree(tmp_path / "dist", ignore_errors=True)
