"""The locked, layered image on the real vLLM 0.33.0 (examples/vllm): both platforms' images written by carry from
the runtime locks, pushed to the test registry under one multi-platform tag, pulled back and smoke-tested; a
Python-only patch change that ships one small layer; a tampered lock and a stale lock refused, nothing pushed.

One cold build is shared by the run (tests/conftest.py `cold_vllm`, read by tests/test_verify_vllm.py too; the
lock reuses the run's fixed wheels, `fixed_wheels`; the released wheels come from the machine's download store);
every image, registry repository and blob it made is removed afterwards. A fresh runner on this real image (empty
cache and store, the second engine, a Python-only change as VERSION N+1) is measured by bench/freshrunner.py, which
checks what a test would (no PEP 517 build, only the release wheels downloaded, the warm runner's same digests,
`verify --key`); CI's fresh-runner tests run on a small stand-in (tests/test_fresh_runner.py) for time."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
import uuid
from pathlib import Path

import pytest

import dockerenv
from carry.image import registryhttp
from carry.image.locked import registrycache
from helpers import assert_bad_input, carry
from lib.lockedvllm import PLATFORMS, make_project, push  # noqa: F401 - make_project: bench/lockedimage.py

pytestmark = [pytest.mark.slow, pytest.mark.docker]

LAYERS = ["base", "venv", "nvidia", "torch", "deps", "vllm-release", "vllm-fixed"]
PATCHED = "vllm/logger.py"  # no patch of the series touches it


# The shared session fixtures (tests/conftest.py, tests/lib/lockedvllm.py) under this module's names.
@pytest.fixture(scope="module")
def services(vllm_services):
    return vllm_services


@pytest.fixture(scope="module")
def registry(vllm_registry):
    return vllm_registry


@pytest.fixture(scope="module")
def project(locked_vllm):
    return locked_vllm


@pytest.fixture(scope="module")
def cold(cold_vllm):
    return cold_vllm


def image(project, *args: str, timeout: float = 1500):
    return push(project, *args, timeout=timeout)


def test_both_platforms_pushed_layered_and_smoke_tested(project, cold, registry):
    found, result = cold
    _, _, name, _ = project
    by_platform = {p["platform"]: p for p in found["platforms"]}
    assert sorted(by_platform) == sorted(PLATFORMS)
    for outcome in by_platform.values():
        names = [layer["name"] for layer in outcome["layers"]]
        assert names[-6:] == LAYERS[1:] and set(names[:-6]) == {"base"}, names
        assert all(layer["action"] in ("pushed", "already exists") for layer in outcome["layers"])
        sizes = {layer["name"]: layer for layer in outcome["layers"]}
        assert sizes["nvidia"]["installed"] > 2e9 and sizes["torch"]["installed"] > 1e9
        assert sizes["vllm-fixed"]["size"] < 2e6, sizes["vllm-fixed"]  # kilobytes: the patched files + dist-info
        manifest = registry.manifest(name, outcome["refs"][0].rsplit(":", 1)[1])
        assert [layer["digest"] for layer in manifest["layers"]] == [layer["digest"] for layer in outcome["layers"]]
    # the smoke test: amd64 imports vllm natively; arm64 (QEMU) runs only the stdlib check
    assert "import vllm -> 0.33.0+carry.20261201.1" in by_platform["linux/amd64"]["smoke"]
    assert (
        "importlib.metadata 0.33.0+carry.20261201.1 (no torch import under QEMU)" in by_platform["linux/arm64"]["smoke"]
    )
    for outcome in by_platform.values():
        assert "patched file(s) byte-equal to the fixed wheel" in outcome["smoke"]
        assert "#!/opt/venv/bin/python" in outcome["smoke"]
        # what vLLM compiles at run time (issue 47): Triton's C extension on both CPUs (the base derived with
        # image.runtime_packages), CUDA_HOME's nvcc on CCCL code natively; recorded for the fresh runner's light path
        assert "; run-time compilers: cc (cc (Debian 12" in outcome["smoke"], outcome["smoke"]
        assert "built and imported a Python.h extension" in outcome["smoke_record"]["compilers"]
    assert "CUDA_HOME's nvcc 13.0 compiled CUDA with the CCCL headers (sm_90)" in by_platform["linux/amd64"]["smoke"]
    # and links it as FlashInfer's JIT does (-lcudart -lcuda) through the toolkit layout the nvidia layer adds
    assert "needs libcudart.so.13, libcuda.so.1" in by_platform["linux/amd64"]["smoke"], by_platform["linux/amd64"]
    assert "nvcc not run under QEMU" in by_platform["linux/arm64"]["smoke"]
    # this CPU's smoke-tested image stays in the engine, tagged as the Dockerfile path tags; the other CPU's check
    # ran on its base, venv and wheel layers loaded here, and nothing of it is kept (no 9 GB pull)
    client = dockerenv.docker_client()
    outcome = by_platform["linux/amd64"]
    tag = f"{name}:20261201.1-amd64"
    assert outcome["engine"]["refs"] == [tag] and outcome["engine"]["pulled"]["layers"] == len(outcome["layers"])
    assert client.images.get(tag).id == outcome["engine"]["image"]
    assert f"{name}@{outcome['digest']}" in client.images.get(tag).attrs["RepoDigests"]
    assert by_platform["linux/arm64"]["engine"] is None
    assert "(on its base, venv and wheel layers, loaded here)" in by_platform["linux/arm64"]["smoke"]
    assert not client.images.list(name=f"{name}", filters={"label": "io.carry.platform=linux/arm64"})
    # each platform's record beside it: signed, naming the manifest, the smoke test's proof
    for outcome in by_platform.values():
        assert outcome["record"]["signed"] and outcome["smoke_record"]["how"] == "full"
        assert registry.manifest(name, outcome["record"]["tag"])["config"]["mediaType"] == registrycache.RECORD_MEDIA
    # one multi-platform tag for VERSION
    index = registry.manifest(name, "20261201.1")
    assert index["mediaType"] == registryhttp.DOCKER_LIST
    assert sorted(f"{m['platform']['os']}/{m['platform']['architecture']}" for m in index["manifests"]) == sorted(
        PLATFORMS
    )
    assert not found["duplicates"], found["duplicates"][:5]  # no file stored in two layers
    # cuda-python 12.6 ships a copy of cuda/bindings/: kept once, cuda-bindings' own (named like the package)
    assert "installed by two locked wheels, kept once" in result.err


def test_each_platform_is_signed_with_an_exact_sbom_and_the_index_too(project, cold, registry):
    """The cold push signed both platform manifests and the index; each platform's SBOM (dist/ and the `.att`) is
    valid CycloneDX 1.6 with the lock's 197 packages + the fixed wheel, the two patches as its pedigree."""
    from carry.trust import attach, kinds, sbom

    found, result = cold
    _, _, name, root = project
    trust = found["trust"]
    assert trust["signed"] and trust["key"].startswith("sha256:")
    published = {p["platform"]: p for p in trust["published"]}
    assert set(published) == {*PLATFORMS, "index"}
    assert published["index"]["subject"] == found["pushed"][f"{name}:20261201.1"]
    for platform in PLATFORMS:
        entry = published[platform]
        assert entry["components"] == 198, entry
        document = Path(entry["sbom"]).read_bytes()
        assert Path(entry["sbom"]).name == f"vllm-20261201.1-{platform.replace('/', '-')}.cdx.json"
        assert sbom.validate(document) is None
        fixed = sbom.fixed_component(json.loads(document), "vllm")
        assert len(fixed["pedigree"]["patches"]) == 2
        digest = entry["subject"]
        assert registry.manifest(name, attach.sig_tag(digest))["layers"][0]["mediaType"] == attach.SIMPLE_SIGNING
        att = registry.manifest(name, attach.att_tag(digest))
        assert [layer["annotations"]["predicateType"] for layer in att["layers"]] == [
            kinds.SBOM.predicate_type,
            kinds.PROVENANCE.predicate_type,
        ]
    assert sum(trust["seconds"].values()) < 60, trust["seconds"]


def test_the_layers_are_what_pip_installs(project, cold, registry):
    """The fixed layer holds the new dist-info with INSTALLER and a RECORD of every installed file, and whiteouts
    the release's dist-info; the release layer's console script points at the image's interpreter."""
    found, _ = cold
    _, _, name, _ = project
    amd64 = next(p for p in found["platforms"] if p["platform"] == "linux/amd64")
    layers = {layer["name"]: layer for layer in amd64["layers"]}
    fixed = _members(registry.blob(name, layers["vllm-fixed"]["digest"]))
    site = "opt/venv/lib/python3.11/site-packages"
    assert f"{site}/.wh.vllm-0.33.0.dist-info" in fixed
    dist_info = f"{site}/vllm-0.33.0+carry.20261201.1.dist-info"
    assert fixed[f"{dist_info}/INSTALLER"][1] == b"carry\n"
    record = fixed[f"{dist_info}/RECORD"][1].decode()
    assert "../../../bin/vllm,sha256=" in record and "vllm-0.33.0+carry.20261201.1.dist-info/RECORD,," in record
    assert not any(path.endswith(".pyc") for path in fixed)
    for info, _ in fixed.values():
        assert info.uid == info.gid == 0 and info.mtime == 0
    venv = _members(registry.blob(name, layers["venv"]["digest"]))
    assert venv["opt/venv/bin/python"][0].linkname == "/usr/bin/python3"
    assert b"include-system-site-packages = false" in venv["opt/venv/pyvenv.cfg"][1]


@pytest.mark.late  # it pushes the changed image under the shared tags: after every reader of the cold image
def test_a_python_only_patch_change_pushes_one_small_layer(project, cold, registry):
    config, env, name, root = project
    found, _ = cold
    before = {p["platform"]: p for p in found["platforms"]}
    patch = root / "vllm" / "patches" / "0003-version-say-carry.patch"
    patch.write_text(_patch_adding_a_line(root))
    try:
        result = image(project, "--no-smoke")
        assert result.code == 0, result.err[-3000:]
        after = {p["platform"]: p for p in json.loads(result.out)["platforms"]}
        for platform in PLATFORMS:
            old, new = before[platform]["layers"], after[platform]["layers"]
            assert [layer["digest"] for layer in new[:-1]] == [layer["digest"] for layer in old[:-1]]
            assert new[-1]["digest"] != old[-1]["digest"]
            assert [layer["action"] for layer in new] == ["already exists"] * (len(new) - 1) + ["pushed"]
            pushed = sum(layer["size"] for layer in new if layer["action"] == "pushed")
            image_size = sum(layer["size"] for layer in new)
            assert pushed <= 0.15 * image_size and pushed < 2e6, (pushed, image_size)
            members = _members(registry.blob(name, new[-1]["digest"]))
            text = members[f"opt/venv/lib/python3.11/site-packages/{PATCHED}"][1]
            assert b"carried by carry" in text
    finally:
        patch.unlink()


@pytest.mark.late  # it pushes under the shared tags (latest): after every reader of the cold image
@pytest.mark.parametrize("case", ["edited", "module", "dropped"])
def test_a_fresh_runner_derives_an_edited_a_module_adding_and_a_dropped_patch(project, cold, registry, case, tmp_path):
    """Issue 49, counted: from the cold VERSION N, with an empty carry cache, (b) the series' 0002 edited in place,
    (c) a new patch that adds a Python module, (d) 0002 dropped: the fixed wheel derives from VERSION N's, rebuilt
    from its image (its tree made from the patches its record carries), no build environment is made and no PEP 517
    build runs, and only the fixed layer is written."""
    from lib import vllmpatches

    config, env, name, root = project
    changed = tmp_path / "project"
    shutil.copytree(config.parent, changed, ignore=shutil.ignore_patterns("dist"))
    patches = changed / "patches"
    second = next(patches.glob("0002-*.patch"))
    history = _history_path(root)
    version = {"edited": "20261201.3", "module": "20261201.4", "dropped": "20261201.5"}[case]
    if case == "edited":
        second.write_text(vllmpatches.edited(history, second))
    elif case == "module":
        (patches / "0003-vllm-add-carry-probe.patch").write_text(vllmpatches.adding_a_module(history))
    else:
        second.unlink()
    (changed / "VERSION").write_text(version + "\n")
    fresh = {**env, "CARRY_CACHE": str(tmp_path / "cache")}
    # run in the copy: its fixed wheels (670 MB) go to the copy's dist/, not the checkout's
    result = carry(
        "--config", str(changed / "build.yaml"), "image", "--push", "--json", "--no-smoke", "--cache-from",
        f"{name}:20261201.1", env=fresh, timeout=1500, cwd=changed,
    )  # fmt: skip
    assert result.code == 0, result.err[-3000:]
    assert "build: PEP 517" not in result.err and "env: making" not in result.err, result.err[-3000:]
    assert result.err.count("derive: from VERSION 20261201.1's wheel, rebuilt from") == 2, result.err[-3000:]
    before = {p["platform"]: p for p in cold[0]["platforms"]}
    for outcome in json.loads(result.out)["platforms"]:
        layers = outcome["layers"]
        assert [layer["action"] for layer in layers] == ["already exists"] * (len(layers) - 1) + ["pushed"]
        assert [x["digest"] for x in layers[:-1]] == [x["digest"] for x in before[outcome["platform"]]["layers"][:-1]]
        members = _members(registry.blob(name, layers[-1]["digest"]))
        site = "opt/venv/lib/python3.11/site-packages/"
        cuda = members.get(site + "vllm/platforms/cuda.py")
        if case == "edited":
            assert cuda is not None and b"# carried by carry: the fix, refined" in cuda[1]
        elif case == "module":
            assert members[site + vllmpatches.MODULE][1].endswith(b"PROBE = 1\n") and cuda is not None
        else:
            assert cuda is None  # back to the release's: no longer in the fixed layer
        assert (site + vllmpatches.MODULE in members) == (case == "module")


def test_a_tampered_lock_fails_naming_the_package_nothing_pushed(project, registry, services):
    config, env, name, root = project
    tampered = root / "tampered"
    shutil.copytree(config.parent, tampered)
    other = f"{services.registry}/carry-test/locked-tampered-{uuid.uuid4().hex[:8]}"
    registry.names.append(other)
    text = (tampered / "build.yaml").read_text().replace(name, other)
    (tampered / "build.yaml").write_text(text)
    lock = tampered / "runtime-lock" / "linux-arm64.txt"
    lines = lock.read_text().splitlines()
    lock.write_text(
        "\n".join(_one_hash(lines, next(i for i, entry in enumerate(lines) if entry.startswith("idna==")))) + "\n"
    )
    result = carry("--config", str(tampered / "build.yaml"), "image", "--push", env=env, timeout=900)
    assert result.code == 1, result.err[-2000:]
    assert "idna==" in result.err.strip().splitlines()[-1] and "relock" in result.err
    assert registry.manifest(other, "20261201.1") is None
    assert not (Path("/tmp/carry-ci/registry/data/docker/registry/v2/repositories") / other.split("/", 1)[1]).exists()


def test_a_stale_lock_is_refused_before_any_work(project, tmp_path):
    config, env, _, root = project
    stale = tmp_path / "stale"
    shutil.copytree(config.parent, stale)
    lock = stale / "runtime-lock" / "linux-amd64.txt"
    text = lock.read_text()
    head, _, rest = text.partition("# requires-dist: sha256:")
    lock.write_text(head + "# requires-dist: sha256:" + "1" * 64 + rest[64:])
    result = carry(
        "--config", str(stale / "build.yaml"), "image", "--push", env={**env, "CARRY_CACHE": str(tmp_path / "c")}
    )
    assert_bad_input(result, "linux-amd64.txt", "is stale", "requires-dist", " lock`")
    assert not (tmp_path / "c" / "image-layers").exists()


# -- helpers ---------------------------------------------------------------------------------------------------


def _members(blob: bytes) -> dict[str, tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob))) as archive:
        return {m.name.rstrip("/"): (m, archive.extractfile(m).read() if m.isfile() else b"") for m in archive}


def _one_hash(lines: list[str], at: int) -> list[str]:
    """`idna`'s entry with a single, wrong hash (a tampered lock)."""
    out = lines[:at]
    name = lines[at].split(" ")[0]
    out.append(f"{name} \\")
    out.append("    --hash=sha256:" + "0" * 64)
    rest = at + 1
    while rest < len(lines) and lines[rest].startswith("    --hash"):
        rest += 1
    return out + lines[rest:]


def _patch_adding_a_line(root: Path) -> str:
    """A patch adding a comment line to vllm/logger.py (Python only), made with git against the pinned tree."""
    from lib import vllmpatches

    return vllmpatches.adding_a_line(_history_path(root), PATCHED, "version: say it is carried")


def _history_path(root: Path) -> Path:
    config = (root / "vllm" / "build.yaml").read_text()
    return Path(config.split("  url: ", 1)[1].split("\n", 1)[0].strip())
