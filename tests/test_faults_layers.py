"""A remembered layer that is not what was recorded is noticed before it is used (docs/reliability.md, "Cache and
disk"): a small real locked image (a Python-only wheel made here, idna from the runtime lock, on the test runtime
base) pushed to the test registry, then a byte flipped in one of `$CARRY_CACHE/image-layers/` entries (a wrong
diff_id there would give an image whose config does not match its layers). The next `image --push` says which
entry, writes that layer again and pushes the same layers and manifest layers as the first run; a flipped byte in
a stored download (the locked idna wheel) is downloaded again. In SERIAL_MODULES: it pushes to the test registry."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import pytest

import dockerenv
from helpers import Upstream, carry, write_config
from test_faults_cache import flip

pytestmark = [pytest.mark.docker]

PYPROJECT = """[build-system]
requires = ["setuptools>=61", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "minilayers"
dynamic = ["version"]
dependencies = ["idna>=3.4"]
"""
FILES = {
    "pyproject.toml": PYPROJECT,
    "setup.py": "import os\nfrom setuptools import setup\nsetup(version=os.environ['MINILAYERS_VERSION'])\n",
    "minilayers/__init__.py": "import importlib.metadata\n__version__ = importlib.metadata.version('minilayers')\n",
}
NOT_USED = "not used (the layer is written again, or taken from the registry's record)"
BUILD = """build:
  cuda_arches: []
  wheel_version: "0.1.0+carry.{version}"
  version_env: [MINILAYERS_VERSION]
  build_isolation: false
  compiler_cache: none
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    env = dockerenv.require()
    monkeypatch.chdir(tmp_path)  # the fixed wheel and the SBOM go into ./dist
    name = f"{env.registry}/carry-test/faults-layers-{uuid.uuid4().hex[:8]}"
    upstream = Upstream.create(tmp_path / "upstream", FILES)
    image = (
        f"image:\n  name: {name}\n  platforms:\n    linux/amd64: {{runtime_image: {env.runtime_base}}}\n"
        f"  lock: runtime-lock\n"
    )
    config = write_config(tmp_path / "project", str(upstream.path), upstream.head(), extra=BUILD + image)
    (config.parent / "VERSION").write_text("20261201.1\n")
    carry_env = {
        "CARRY_CACHE": str(tmp_path / "cache"),
        "CARRY_DOWNLOADS": str(tmp_path / "downloads"),  # its own: a wheel in it is corrupted on purpose
        "SOURCE_DATE_EPOCH": "1767225600",
        "CARRY_REGISTRY_USER": env.registry_user,
        "CARRY_REGISTRY_PASSWORD": env.registry_password(),
    }
    locked = carry("--config", str(config), "lock", env=carry_env)
    assert locked.code == 0, locked.err
    try:
        yield config, carry_env, tmp_path / "cache", name
    finally:
        dockerenv.forget(name)
        dockerenv.forget(f"{name}-again")


def push(config: Path, env: dict) -> tuple[dict, str]:
    result = carry("--config", str(config), "image", "--push", "--json", env=env)
    assert result.code == 0, result.err[-3000:]
    (platform,) = json.loads(result.out)["platforms"]
    return platform, result.err


def test_a_flipped_byte_in_a_remembered_layer_or_a_stored_wheel_is_made_again(project, tmp_path):
    config, env, cache, name = project
    cold, _ = push(config, env)
    digests = [layer["digest"] for layer in cold["layers"]]
    remembered = sorted((cache / "image-layers").glob("*.json"))
    assert remembered, "the push remembers its layers' digests"
    own = next(  # the layer of the fixed wheel: its entry names its digest
        path for path in remembered if json.loads(path.read_text())["written"]["digest"] == digests[-1]
    )
    text = own.read_text()
    at = text.index('"diff_id": "sha256:') + len('"diff_id": "sha256:') + 5
    own.write_text(text[:at] + ("0" if text[at] != "0" else "1") + text[at + 1 :])  # one hex digit of its diff_id
    (idna,) = (tmp_path / "downloads").glob("*/idna-*.whl")
    flip(idna)
    # into another repository of the registry: no record of the first push to reuse (the registry as the cache
    # would otherwise take the layer from it, and the deps layer without reading idna), so both are made again
    config.write_text(config.read_text().replace(f"name: {name}", f"name: {name}-again"))

    again, said = push(config, env)
    lines = [line for line in said.splitlines() if "corrupt cache entry" in line]
    assert len(lines) == 2, said[-3000:]
    assert any(f"layer: {own}: sha256 " in line and line.endswith(f"removed; {NOT_USED}") for line in lines)
    assert any(
        f"download: {idna}: sha256 " in line and line.endswith("removed; downloading it again") for line in lines
    )
    assert [layer["digest"] for layer in again["layers"]] == digests
    assert [layer["diff_id"] for layer in again["layers"]] == [layer["diff_id"] for layer in cold["layers"]]
    assert json.loads(own.read_text())["written"]["diff_id"] == cold["layers"][-1]["diff_id"]
    assert idna.is_file() and idna.parent.name == hashlib.sha256(idna.read_bytes()).hexdigest()
