"""The locked, layered image of examples/vllm on the real vLLM 0.33.0, both platforms, built cold and pushed once per
run (tests/conftest.py `locked_vllm` and `cold_vllm`), for tests/test_locked_image.py and tests/test_verify_vllm.py.
A test that changes the project or what the registry holds under its tags runs after every reader (marker `late`)."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import dockerenv
import realvllm
from carry.image import registryhttp
from helpers import ROOT, carry
from lib.vllm import FixedWheels

EXAMPLE = ROOT / "examples" / "vllm"
PLATFORMS = ("linux/amd64", "linux/arm64")


def image_section(env: dockerenv.DockerEnv, name: str) -> str:
    """examples/vllm's image on the test bases and registry: its runtime packages (what vLLM compiles with at run
    time), lock, entrypoint and CUDA_HOME as the example has them."""
    import yaml

    packages = yaml.safe_load((EXAMPLE / "build.yaml").read_text())["image"]["runtime_packages"]
    return (
        f'image:\n  name: {name}\n  tags: ["{{version}}", latest]\n  runtime_packages: {json.dumps(packages)}\n'
        "  platforms:\n"
        f'    linux/amd64: {{runtime_image: "{env.runtime_base}"}}\n'
        f'    linux/arm64: {{runtime_image: "{env.runtime_base_arm64}"}}\n'
        f"  lock: runtime-lock\n  entrypoint: [vllm, serve]\n"
        f"  env: {{CUDA_HOME: /opt/venv/lib/python3.11/site-packages/nvidia/cu13}}\n"
    )


class Registry:
    """The test registry's repositories the tests made, read over the API and removed at the end."""

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
        """Each repository pushed, then the blobs no other repository links (the registry is shared), and the images
        the smoke test kept in the engine (NAME:VERSION-<arch>); once (tests/conftest.py releases it early)."""
        while self.names:
            dockerenv.forget(self.names.pop())


def make_project(
    root: Path, services: dockerenv.DockerEnv, name: str, history: Path | str | None = None
) -> tuple[Path, dict[str, str]]:
    """examples/vllm in `root` on the real vLLM history (`history`, else one built in root/history), its image section
    pushing to `name` on the test registry, not yet locked: (its build.yaml, carry's environment for it).
    bench/lockedimage.py uses it too."""
    if history is None:
        history = Path(realvllm.build(root / "history")["path"])
    shutil.copytree(
        EXAMPLE, root / "vllm", ignore=shutil.ignore_patterns("upstream.git", "__pycache__", "runtime-lock")
    )  # locked by the caller
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


def locked_project(root: Path, services: dockerenv.DockerEnv, registry: Registry, history: str, wheels: FixedWheels):
    """(config, env, name, root): the project locked, in a hardlinked copy of the fixed wheels' cache (so `lock`
    reuses both wheels)."""
    name = f"{services.registry}/carry-test/locked-{uuid.uuid4().hex[:8]}"
    registry.names.append(name)
    config, env = make_project(root, services, name, history)
    wheels.cache_copy(Path(env["CARRY_CACHE"]))
    locked = carry("--config", str(config), "lock", env=env, timeout=1200)  # uv resolves; the wheels are reused
    assert locked.code == 0, locked.err[-2000:]
    assert carry("keygen", str(root / "keys")).code == 0
    env["CARRY_SIGNING_KEY"] = str(root / "keys" / "carry.key")  # `image --push` signs and attests (carry/trust)
    return config, env, name, root


def push(project, *args: str, timeout: float = 1500):
    config, env, _, _ = project
    return carry("--config", str(config), "image", "--push", "--json", *args, env=env, timeout=timeout)


def cold(project):
    """Both platforms pushed cold (layer cache empty; wheels from the store) and smoke-tested after a pull."""
    result = push(project)
    assert result.code == 0, result.err[-3000:]
    return json.loads(result.out), result
