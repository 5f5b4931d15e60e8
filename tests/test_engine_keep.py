"""The locked image's smoke test keeps what it pulled (carry.image.locked.engineimage), on a small real locked image: a
pure-Python wheel built from a tiny upstream, idna from the runtime lock, on the test runtime base, pushed to the
test registry by `image --push --platform linux/amd64` (its config lists linux/arm64 too, so the image is tagged
`NAME:VERSION-amd64` as with several platforms). Cold; a Python-only patch change, whose pull fetches only the
new last layer because the cold image was kept; a VERSION bump, which untags the older VERSION (an image a user
tagged stays); then the same VERSION loaded without --push, the very image pushed (the same ID). After each run the
engine holds one image of the platform in NAME, and the test removes it and the registry repository."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

import dockerenv
from helpers import Upstream, carry, write_config

pytestmark = [pytest.mark.slow, pytest.mark.docker]

PYPROJECT = """[build-system]
requires = ["setuptools>=61", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "minikeep"
dynamic = ["version"]
dependencies = ["idna>=3.4"]
"""
SETUP_PY = "import os\nfrom setuptools import setup\nsetup(version=os.environ['MINIKEEP_VERSION'])\n"
INIT = "import importlib.metadata\n__version__ = importlib.metadata.version('minikeep')\n"
FILES = {"pyproject.toml": PYPROJECT, "setup.py": SETUP_PY, "minikeep/__init__.py": INIT}
BUILD = """build:
  cuda_arches: []
  wheel_version: "0.1.0+carry.{version}"
  version_env: [MINIKEEP_VERSION]
  build_isolation: false
  compiler_cache: none
"""


@pytest.fixture
def project(tmp_path):
    env = dockerenv.require()
    name = f"{env.registry}/carry-test/keep-{uuid.uuid4().hex[:8]}"
    upstream = Upstream.create(tmp_path / "upstream", FILES)
    image = (
        f"image:\n  name: {name}\n  platforms:\n    linux/amd64: {{runtime_image: {env.runtime_base}}}\n"
        f"    linux/arm64: {{runtime_image: {env.runtime_base_arm64}}}\n  lock: runtime-lock\n"
    )
    config = write_config(tmp_path / "project", str(upstream.path), upstream.head(), extra=BUILD + image)
    (config.parent / "VERSION").write_text("20261201.1\n")
    carry_env = {
        "CARRY_CACHE": str(tmp_path / "cache"),
        "CARRY_REGISTRY_USER": env.registry_user,
        "CARRY_REGISTRY_PASSWORD": env.registry_password(),
    }
    locked = carry("--config", str(config), "lock", "--platform", "linux/amd64", env=carry_env)
    assert locked.code == 0, locked.err
    try:
        yield config, carry_env, upstream, name
    finally:
        subprocess.run([dockerenv.DOCKER_CLI, "rmi", f"{name}:mine"], capture_output=True)
        dockerenv.forget(name)


def image(config, env, *args: str) -> dict:
    result = carry("--config", str(config), "image", "--platform", "linux/amd64", "--json", *args, env=env)
    assert result.code == 0, result.err[-3000:]
    (found,) = json.loads(result.out)["platforms"]
    return found


def engine(name: str) -> dict[str, list[str]]:
    """image ID -> tags, for every image of repository `name` in the engine (digest references included)."""
    client = dockerenv.docker_client()
    return {i.id: sorted(i.tags) for i in client.images.list(name=name)}


def test_the_smoke_test_keeps_one_image_per_platform_and_pulls_only_what_changed(project):
    config, env, upstream, name = project
    v1, v2 = f"{name}:20261201.1-amd64", f"{name}:20261201.2-amd64"

    cold = image(config, env, "--push")
    kept = cold["engine"]
    layers = {layer["digest"] for layer in cold["layers"]}  # the empty nvidia and torch layers are one blob
    assert kept["refs"] == [v1] and kept["pulled"]["layers"] == len(cold["layers"])
    assert kept["pulled"]["fetched"] >= 1 and kept["pulled"]["bytes"] >= cold["layers"][-1]["size"]
    assert engine(name) == {kept["image"]: [v1]}
    assert "import minikeep -> 0.1.0+carry.20261201.1" in cold["smoke"]

    # a Python-only patch change: only the new last layer is fetched, the cold image is removed
    upstream.make_patch(
        config.parent / "patches" / "0001-say-hello.patch", "Say hello", {"minikeep/hello.py": "HELLO = 1\n"}
    )
    patched = image(config, env, "--push")
    fixed = patched["layers"][-1]
    assert fixed["action"] == "pushed" and fixed["digest"] not in layers
    assert [layer["action"] for layer in patched["layers"][:-1]] == ["already exists"] * (len(cold["layers"]) - 1)
    pulled = patched["engine"]["pulled"]
    assert (pulled["fetched"], pulled["bytes"]) == (1, fixed["size"]), pulled
    assert patched["engine"]["removed"] == [kept["image"]] and not patched["engine"]["untagged"]
    assert engine(name) == {patched["engine"]["image"]: [v1]}

    # a VERSION bump: the older VERSION's tag is removed; an image the user tagged is left, and said
    subprocess.run([dockerenv.DOCKER_CLI, "tag", v1, f"{name}:mine"], check=True, capture_output=True)
    (config.parent / "VERSION").write_text("20261201.2\n")
    bumped = image(config, env, "--push")
    assert bumped["engine"]["refs"] == [v2] and bumped["engine"]["untagged"] == [v1]
    assert bumped["engine"]["pulled"]["fetched"] == 1  # the new dist-info: only the last layer differs
    assert any(f"(tagged {name}:mine)" in why for why in bumped["engine"]["left"]), bumped["engine"]
    assert engine(name) == {bumped["engine"]["image"]: [v2], patched["engine"]["image"]: [f"{name}:mine"]}
    subprocess.run([dockerenv.DOCKER_CLI, "rmi", f"{name}:mine"], check=True, capture_output=True)
    assert engine(name) == {bumped["engine"]["image"]: [v2]}

    # without --push the loaded image is the pushed one: the same config (created from the pin, not the clock) and
    # layers, so the same image ID under the same tag, nothing removed
    loaded = image(config, env)
    assert loaded["engine"]["pulled"] is None and loaded["engine"]["refs"] == [v2]
    assert loaded["engine"]["image"] == bumped["engine"]["image"] and loaded["engine"]["removed"] == []
    assert engine(name) == {loaded["engine"]["image"]: [v2]}
