"""The registry as the only state a fresh runner needs (carry/image/locked/registrycache.py), on a small real locked
image: a pure-Python wheel from a tiny upstream, idna from the runtime lock, on the test runtime base, pushed to the
test registry. Runner A pushes VERSION N cold; a fresh runner (an empty carry cache, an empty download store, the
second Docker engine) takes a Python-only patch change as VERSION N+1: the registry's layers are reused, only the
changed one is written, no locked wheel is downloaded, nothing is pulled. Then what the record must not be trusted
for: a blob deleted from the registry is written again, an entry whose digest is not its image's layer is not
shipped, and an image pushed without a record (an older carry) is one line and a full build. Counted, not timed."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

import dockerenv
from carry.image import publish, registryhttp
from carry.image.locked import registrycache
from helpers import Upstream, carry, write_config

pytestmark = [pytest.mark.slow, pytest.mark.docker]

PYPROJECT = """[build-system]
requires = ["setuptools>=61", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "minifresh"
dynamic = ["version"]
dependencies = ["idna>=3.4"]
"""
SETUP_PY = "import os\nfrom setuptools import setup\nsetup(version=os.environ['MINIFRESH_VERSION'])\n"
INIT = "import importlib.metadata\nimport idna\n__version__ = importlib.metadata.version('minifresh')\n"
FILES = {"pyproject.toml": PYPROJECT, "setup.py": SETUP_PY, "minifresh/__init__.py": INIT}
BUILD = """build:
  cuda_arches: []
  wheel_version: "0.1.0+carry.{version}"
  version_env: [MINIFRESH_VERSION]
  build_isolation: false
  compiler_cache: none
"""
N, N1 = "20261201.1", "20261201.2"


@pytest.fixture(scope="module")
def project(tmp_path_factory, second_engine):
    """A project locked for linux/amd64, runner A's cold push of VERSION N, and a VERSION N+1 with one more patch."""
    env = dockerenv.require()
    root = tmp_path_factory.mktemp("fresh")
    name = f"{env.registry}/carry-test/fresh-{uuid.uuid4().hex[:8]}"
    upstream = Upstream.create(root / "upstream", FILES)
    image = (
        f'image:\n  name: {name}\n  tags: ["{{version}}", latest]\n'
        f"  platforms:\n    linux/amd64: {{runtime_image: {env.runtime_base}}}\n  lock: runtime-lock\n"
    )
    config = write_config(root / "project", str(upstream.path), upstream.head(), extra=BUILD + image)
    (config.parent / "VERSION").write_text(f"{N}\n")
    runner_a = {
        "CARRY_CACHE": str(root / "cache-a"),
        "CARRY_REGISTRY_USER": env.registry_user,
        "CARRY_REGISTRY_PASSWORD": env.registry_password(),
    }
    locked = carry("--config", str(config), "lock", env=runner_a)
    assert locked.code == 0, locked.err
    try:
        cold = push(config, runner_a)
        upstream.make_patch(
            config.parent / "patches" / "0001-say-hello.patch", "Say hello", {"minifresh/hello.py": "import idna\n"}
        )
        (config.parent / "VERSION").write_text(f"{N1}\n")
        yield {"config": config, "a": runner_a, "cold": cold, "name": name, "root": root, "engine": second_engine}
    finally:
        dockerenv.forget(name)
        second_engine.empty()


def push(config: Path, env: dict, *args: str, code: int = 0) -> dict:
    result = carry("--config", str(config), "image", "--push", "--json", *args, env=env, timeout=900)
    assert result.code == code, result.err[-3000:]
    return {**json.loads(result.out), "err": result.err} if code == 0 else {"err": result.err}


def fresh(project, tag: str) -> dict[str, str]:
    """A fresh runner's environment: its own empty carry cache and download store, the second (emptied) engine."""
    project["engine"].empty()
    root = project["root"] / f"fresh-{tag}"
    (root / "downloads").mkdir(parents=True)
    return {
        **project["a"],
        "CARRY_CACHE": str(root / "cache"),
        "CARRY_DOWNLOADS": str(root / "downloads"),
        "DOCKER_HOST": project["engine"].host,
    }


def repo(project) -> registryhttp.Repository:
    env = dockerenv.require()
    return registryhttp.Repository.of(
        project["name"], {"username": env.registry_user, "password": env.registry_password()}
    )


def layers(found: dict) -> dict[str, dict]:
    (platform,) = found["platforms"]
    return {layer["name"]: layer for layer in platform["layers"] if layer["name"] != "base"}


def test_a_fresh_runner_reuses_the_registrys_layers_and_writes_only_the_changed_one(project):
    env = fresh(project, "reuse")
    found = push(project["config"], env)
    cold, now = layers(project["cold"]), layers(found)
    (platform,) = found["platforms"]
    written = [layer["name"] for layer in platform["layers"] if layer["action"] == "pushed"]
    assert written == ["vllm-fixed"], platform["layers"]
    assert "its key differs" in now["vllm-fixed"]["why"]
    for name in ("venv", "nvidia", "torch", "deps", "vllm-fixed"):
        if name != "vllm-fixed":
            assert now[name]["digest"] == cold[name]["digest"] and now[name]["action"] == "already exists"
            assert now[name]["source"].startswith("recorded by"), now[name]
    # no locked wheel downloaded (the deps layer was not read), nothing pulled: the smoke test checked the change
    assert not any(Path(env["CARRY_DOWNLOADS"]).iterdir())
    assert platform["engine"] is None
    assert "light: 2 changed Python file(s) byte-compiled by Python 3.11" in platform["smoke"], platform["smoke"]
    assert "import minifresh -> 0.1.0+carry.20261201.1" in platform["smoke"]
    assert platform["smoke_record"]["how"] == "light"
    assert "previous image" in found["err"] and f"{project['name']}:latest" in found["err"]
    # what was sent: the fixed layer, the config, the manifests and the record; the record names the image
    record = platform["record"]
    assert record["tag"] == registrycache.cache_tag(platform["digest"])
    sent = platform["registry"]["sent"]
    assert sent < now["vllm-fixed"]["size"] + 40_000, (sent, now["vllm-fixed"]["size"])
    project["n1"] = found


def test_a_blob_deleted_from_the_registry_is_written_again(project):
    cold = layers(project["cold"])
    registry = repo(project)
    registry.request("DELETE", f"/v2/{registry.name}/blobs/{cold['deps']['digest']}", ok=(202,))
    env = fresh(project, "deleted")
    found = push(project["config"], env)
    now = layers(found)
    assert now["deps"]["action"] == "pushed" and now["deps"]["digest"] == cold["deps"]["digest"]
    assert "is not in the registry" in now["deps"]["why"], now["deps"]
    assert [p.name for p in Path(env["CARRY_DOWNLOADS"]).glob("*/*.whl")] and now["venv"]["action"] == "already exists"


def test_an_entry_whose_digest_is_not_its_layer_is_not_shipped(project):
    """The latest image's record rewritten: its deps entry names the venv layer's blob (which the registry has, at
    that size). The run does not ship that blob as deps: the entry is not the image's layer at its position."""
    registry = repo(project)
    digest = registryhttp.digest_of(registry.get_manifest("latest")[1])
    artifact = json.loads(registry.get_manifest(registrycache.cache_tag(digest))[1])
    record = registrycache.Record.from_bytes(registry.get_blob(artifact["config"]["digest"]))
    venv = next(entry for entry in record.entries if entry.name == "venv")
    forged = tuple(
        registrycache.Entry(**{**venv.to_json(), "name": "deps", "key": entry.key}) if entry.name == "deps" else entry
        for entry in record.entries
    )
    registrycache.push_record(
        publish.Stage(registry, None),
        registrycache.Record(record.subject, record.platform, forged, record.base, record.wheel, record.smoke),
        {},
    )
    env = fresh(project, "forged")
    found = push(project["config"], env)
    now = layers(found)
    assert now["deps"]["action"] == "pushed" and now["deps"]["digest"] != venv.digest
    assert "does not verify" in now["deps"]["why"] and "is not the image's layer" in now["deps"]["why"], now["deps"]
    manifest = json.loads(registry.get_manifest(found["platforms"][0]["digest"])[1])
    assert [layer["digest"] for layer in manifest["layers"]].count(venv.digest) == 1


def test_an_image_without_a_record_is_one_line_and_a_full_build(project):
    registry = repo(project)
    body = registry.get_manifest("latest")[1]
    digest = registryhttp.digest_of(body)
    cache = registry.get_manifest(registrycache.cache_tag(digest))
    registry.delete_manifest(registryhttp.digest_of(cache[1]))
    env = fresh(project, "older")
    found = push(project["config"], env)
    (platform,) = found["platforms"]
    lines = [line for line in found["err"].splitlines() if "record (pushed by an older carry" in line]
    assert len(lines) == 1, found["err"][-2000:]
    assert all(layer["action"] == "pushed" for layer in platform["layers"] if layer["name"] != "base")
    assert all(not layer["why"] for layer in platform["layers"] if layer["name"] != "base")
