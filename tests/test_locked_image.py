"""The locked, layered image on the real vLLM 0.33.0 (examples/vllm): both platforms' images written by carry from
the runtime locks, pushed to the test registry under one multi-platform tag, pulled back and smoke-tested; a
Python-only patch change that ships one small layer; a tampered lock and a stale lock refused, nothing pushed.

One cold build is shared by the module (its wheels come from the machine's download store, so only the first run
on a machine downloads them); every image, registry repository and blob it made is removed afterwards."""

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
import realvllm
from carry.image import registryhttp
from helpers import ROOT, assert_bad_input, carry

pytestmark = [pytest.mark.slow, pytest.mark.docker]

EXAMPLE = ROOT / "examples" / "vllm"
PLATFORMS = ("linux/amd64", "linux/arm64")
LAYERS = ["base", "venv", "nvidia", "torch", "deps", "vllm-release", "vllm-fixed"]
PATCHED = "vllm/logger.py"  # no patch of the series touches it


def image_section(env: dockerenv.DockerEnv, name: str) -> str:
    return (
        f'image:\n  name: {name}\n  tags: ["{{version}}", latest]\n  platforms:\n'
        f'    linux/amd64: {{runtime_image: "{env.runtime_base}"}}\n'
        f'    linux/arm64: {{runtime_image: "{env.runtime_base_arm64}"}}\n'
        f"  lock: runtime-lock\n  entrypoint: [vllm, serve]\n"
        f"  env: {{CUDA_HOME: /opt/venv/lib/python3.11/site-packages/nvidia/cu13}}\n"
    )


class Registry:
    """The test registry's repositories this module made, read over the API and removed at the end."""

    def __init__(self, env: dockerenv.DockerEnv):
        self.env = env
        self.names: list[str] = []

    def repo(self, name: str) -> registryhttp.Repository:
        return registryhttp.Repository.of(
            name, {"username": self.env.registry_user, "password": self.env.registry_password()}
        )

    def manifest(self, name: str, reference: str) -> dict | None:
        found = self.repo(name).get_manifest(reference)
        return json.loads(found[1]) if found else None

    def blob(self, name: str, digest: str) -> bytes:
        _, _, data = self.repo(name).request("GET", f"/v2/{self.repo(name).name}/blobs/{digest}")
        return data

    def remove(self) -> None:
        """Each repository this module pushed, then the blobs no other repository links (the registry is shared),
        and the images the smoke test kept in the engine."""
        for name in self.names:
            dockerenv.forget(name)


@pytest.fixture(scope="module")
def services():
    return dockerenv.require()


@pytest.fixture(scope="module")
def registry(services):
    found = Registry(services)
    yield found
    found.remove()


def make_project(root: Path, services: dockerenv.DockerEnv, name: str) -> tuple[Path, dict[str, str]]:
    """examples/vllm in `root` on the real vLLM history built there, its image section pushing to `name` on the
    test registry, not yet locked: (its build.yaml, carry's environment for it). bench/lockedimage.py uses it too."""
    history = Path(realvllm.build(root / "history")["path"])
    shutil.copytree(
        EXAMPLE, root / "vllm", ignore=shutil.ignore_patterns("upstream.git", "__pycache__", "runtime-lock")
    )  # locked by the caller, here
    config = root / "vllm" / "build.yaml"
    text = config.read_text().replace("  url: upstream.git", f"  url: {history}")
    config.write_text(text[: text.index("\nimage:\n") + 1] + image_section(services, name))
    env = {
        "CARRY_CACHE": str(root / "cache"),
        "CARRY_DOWNLOADS": realvllm.download_store(),
        "CARRY_REGISTRY_USER": services.registry_user,
        "CARRY_REGISTRY_PASSWORD": services.registry_password(),
    }
    return config, env


@pytest.fixture(scope="module")
def project(tmp_path_factory, services, registry):
    root = tmp_path_factory.mktemp("locked")
    name = f"{services.registry}/carry-test/locked-{uuid.uuid4().hex[:8]}"
    registry.names.append(name)
    config, env = make_project(root, services, name)
    locked = carry("--config", str(config), "lock", env=env, timeout=1200)  # the fixed wheels, then uv
    assert locked.code == 0, locked.err[-2000:]
    return config, env, name, root


def image(project, *args: str, timeout: float = 1500):
    config, env, _, _ = project
    return carry("--config", str(config), "image", "--push", "--json", *args, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def cold(project):
    """Both platforms pushed cold (layer cache empty; wheels from the store) and smoke-tested after a pull."""
    result = image(project)
    assert result.code == 0, result.err[-3000:]
    return json.loads(result.out), result


def test_both_platforms_pushed_layered_and_smoke_tested(project, cold, registry):
    found, result = cold
    _, _, name, _ = project
    by_platform = {p["platform"]: p for p in found["platforms"]}
    assert sorted(by_platform) == sorted(PLATFORMS)
    for platform, outcome in by_platform.items():
        names = [layer["name"] for layer in outcome["layers"]]
        assert names[-6:] == LAYERS[1:] and set(names[:-6]) == {"base"}, names
        assert all(layer["action"] in ("pushed", "already exists") for layer in outcome["layers"])
        sizes = {layer["name"]: layer for layer in outcome["layers"]}
        assert sizes["nvidia"]["installed"] > 2e9 and sizes["torch"]["installed"] > 1e9
        assert sizes["vllm-fixed"]["size"] < 2e6, sizes["vllm-fixed"]  # kilobytes: the patched files + dist-info
        manifest = registry.manifest(name, outcome["refs"][0].rsplit(":", 1)[1])
        assert [layer["digest"] for layer in manifest["layers"]] == [l["digest"] for l in outcome["layers"]]
    # the smoke test: amd64 imports vllm natively; arm64 (QEMU) runs only the stdlib check
    assert "import vllm -> 0.33.0+carry.20261201.1" in by_platform["linux/amd64"]["smoke"]
    assert (
        "importlib.metadata 0.33.0+carry.20261201.1 (no torch import under QEMU)" in by_platform["linux/arm64"]["smoke"]
    )
    for outcome in by_platform.values():
        assert "patched file(s) byte-equal to the fixed wheel" in outcome["smoke"]
        assert "#!/opt/venv/bin/python" in outcome["smoke"]
    # the smoke-tested images stay in the engine, tagged per platform as the Dockerfile path tags
    client = dockerenv.docker_client()
    for platform, outcome in by_platform.items():
        tag = f"{name}:20261201.1-{platform.split('/')[1]}"
        assert outcome["engine"]["refs"] == [tag] and outcome["engine"]["pulled"]["layers"] == len(outcome["layers"])
        assert client.images.get(tag).id == outcome["engine"]["image"]
        assert f"{name}@{outcome['digest']}" in client.images.get(tag).attrs["RepoDigests"]
    # one multi-platform tag for VERSION
    index = registry.manifest(name, "20261201.1")
    assert index["mediaType"] == registryhttp.DOCKER_LIST
    assert sorted(f"{m['platform']['os']}/{m['platform']['architecture']}" for m in index["manifests"]) == sorted(
        PLATFORMS
    )
    assert not found["duplicates"], found["duplicates"][:5]  # no file stored in two layers
    # cuda-python 12.6 ships a copy of cuda/bindings/: kept once, cuda-bindings' own (named like the package)
    assert "installed by two locked wheels, kept once" in result.err


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
    for path, (info, _) in fixed.items():
        assert info.uid == info.gid == 0 and info.mtime == 0
    venv = _members(registry.blob(name, layers["venv"]["digest"]))
    assert venv["opt/venv/bin/python"][0].linkname == "/usr/bin/python3"
    assert b"include-system-site-packages = false" in venv["opt/venv/pyvenv.cfg"][1]


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
            assert [l["digest"] for l in new[:-1]] == [l["digest"] for l in old[:-1]]
            assert new[-1]["digest"] != old[-1]["digest"]
            assert [l["action"] for l in new] == ["already exists"] * (len(new) - 1) + ["pushed"]
            pushed = sum(l["size"] for l in new if l["action"] == "pushed")
            image_size = sum(l["size"] for l in new)
            assert pushed <= 0.15 * image_size and pushed < 2e6, (pushed, image_size)
            members = _members(registry.blob(name, new[-1]["digest"]))
            text = members[f"opt/venv/lib/python3.11/site-packages/{PATCHED}"][1]
            assert b"carried by carry" in text
    finally:
        patch.unlink()


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
    lock.write_text("\n".join(_one_hash(lines, next(i for i, l in enumerate(lines) if l.startswith("idna==")))) + "\n")
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
    """A patch adding a comment line to vllm/version.py (Python only), made with git against the pinned tree."""
    import subprocess

    work = root / "patchwork"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(_history_path(root)), str(work)], check=True)
    subprocess.run(["git", "-C", str(work), "checkout", "-q", realvllm.V0_33_0, "--", PATCHED], check=True)
    target = work / PATCHED
    target.write_text(target.read_text() + "# carried by carry\n")
    diff = subprocess.run(
        ["git", "-C", str(work), "diff", "--", PATCHED], capture_output=True, text=True, check=True
    ).stdout
    shutil.rmtree(work)
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: carry tests "
        "<tests@carry>\nSubject: [PATCH] version: say it is carried\n\nUpstream-Status: Inappropriate [test]\n"
        "---\n" + diff
    )


def _history_path(root: Path) -> Path:
    config = (root / "vllm" / "build.yaml").read_text()
    return Path(config.split("  url: ", 1)[1].split("\n", 1)[0].strip())
