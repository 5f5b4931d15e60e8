"""The runtime base with Python, made by carry (image.runtime_python, carry/image/locked/runtimebase.py): one locked
two-platform image on runtime images without python3 -- a minimal Debian (.ci/base-images.sh) standing in for
NVIDIA's CUDA runtime images -- derived per platform (arm64 under QEMU), locked, pushed, pulled back, smoke-tested
and verified; the derivation reused, then made again as a fresh runner would, with the lock still fresh; a runtime
image missing from the engine pulled by its digest; `off` and bad values refused.

The project is small (a pure-Python wheel whose one dependency is idna), so the cost is the derivation itself.
Each run derives from its own copy of the stand-in (a label makes it another image, so nothing of an earlier run is
reused); every image, derived base and registry repository it made is removed afterwards."""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid

import pytest

import dockerenv
from carry.image.locked import runtimebase
from helpers import Upstream, assert_bad_input, carry, write_config

pytestmark = [pytest.mark.slow, pytest.mark.docker]

DOCKER = dockerenv.DOCKER_CLI
# carry's line for a base it derived (carry.image.locked.runtimebase.derive): the platform and, the first time,
# the seconds
DERIVED_RE = re.compile(
    r"(linux/\w+): \S+ \(sha256:\S+\) [^:]+: base \S+, it \+ python3 python3-venv by apt: .* \(in (\d+)s"
)
PLATFORMS = ("linux/amd64", "linux/arm64")
VERSION = "20261201.1"
PYPROJECT = """[build-system]
requires = ["setuptools>=61", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "minibase"
dynamic = ["version"]
dependencies = ["idna>=3.4"]
"""
FILES = {
    "pyproject.toml": PYPROJECT,
    "setup.py": "import os\nfrom setuptools import setup\nsetup(version=os.environ['MINIBASE_VERSION'])\n",
    "minibase/__init__.py": (
        "import importlib.metadata\n\nimport idna\n\n"
        "__version__ = importlib.metadata.version('minibase')\nNAME = idna.encode('carry').decode()\n"
    ),
}
BUILD = """build:
  cuda_arches: []
  wheel_version: "0.1.0+carry.{version}"
  version_env: [MINIBASE_VERSION]
  build_isolation: false
  compiler_cache: none
"""


def docker(*args: str, env: dict | None = None) -> str:
    done = subprocess.run([DOCKER, *args], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def inspect(ref: str) -> dict:
    return json.loads(docker("image", "inspect", ref))[0]


def derived_images(source: str) -> list[str]:
    """The IDs of the bases carry derived from runtime images whose reference holds `source` (by their label)."""
    found = []
    for line in docker("image", "ls", "--no-trunc", "--format", "{{.ID}} {{.Repository}}").splitlines():
        image_id, repository = line.split()
        if repository == runtimebase.DERIVED_REPO:
            labels = inspect(image_id)["Config"].get("Labels") or {}
            if source in labels.get(runtimebase.LABEL_BASE_NAME, ""):
                found.append(image_id)
    return sorted(set(found))


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A pure-Python project locked for both platforms on this run's copies of the python-less stand-in."""
    env = dockerenv.require()
    pyless = dockerenv.require_pyless()
    run = uuid.uuid4().hex[:8]
    root = tmp_path_factory.mktemp("runtime-base")
    sources = {}
    for platform, image in pyless.items():
        ref = f"carry-test/pyless-{run}:{platform.split('/')[1]}"
        build = subprocess.run(
            [DOCKER, "build", "--platform", platform, "--tag", ref, "-"],
            input=f"FROM {image}\nLABEL io.carry.test.run={run}\n",
            text=True,
            capture_output=True,
            env=dockerenv.cli_env(),
        )
        assert build.returncode == 0, build.stderr
        sources[platform] = ref
    name = f"{env.registry}/carry-test/pyless-{run}"
    upstream = Upstream.create(root / "upstream", FILES)
    image = (
        f'image:\n  name: {name}\n  tags: ["{{version}}", latest]\n  lock: runtime-lock\n'
        f"  env: {{MINIBASE_MODE: locked}}\n  platforms:\n"
        + "".join(f"    {p}: {{runtime_image: {ref}}}\n" for p, ref in sources.items())
    )
    config = write_config(root / "project", str(upstream.path), upstream.head(), extra=BUILD + image)
    (config.parent / "VERSION").write_text(VERSION + "\n")
    cache = {
        "CARRY_CACHE": str(root / "cache"),
        "CARRY_REGISTRY_USER": env.registry_user,
        "CARRY_REGISTRY_PASSWORD": env.registry_password(),
    }
    yield {"config": config, "env": cache, "sources": sources, "name": name, "docker": env, "run": run}
    for image_id in derived_images(run):  # from this run's stand-ins, by name or by digest
        subprocess.run([DOCKER, "image", "rm", "--force", image_id], capture_output=True)
    for ref in sources.values():
        subprocess.run([DOCKER, "image", "rm", ref], capture_output=True)
    dockerenv.forget(name)
    dockerenv.forget(f"{env.registry}/carry-test/pyless-src-{run}")


def lock(project, *args: str):
    return carry("--config", str(project["config"]), "lock", *args, env=project["env"], timeout=1500)


@pytest.fixture(scope="module")
def locked(project):
    """`lock` on the python-less runtime images: each base derived (first time), then locked."""
    started = time.monotonic()
    done = lock(project)
    assert done.code == 0, done.err[-3000:]
    return done, time.monotonic() - started


def derive_seconds(err: str) -> dict[str, float]:
    """Per platform, the seconds its derivation took, as carry reports them."""
    return {m.group(1): float(m.group(2)) for m in re.finditer(DERIVED_RE, err)}


def test_lock_derives_a_python_base_for_each_platform_and_says_so(project, locked):
    done, seconds = locked
    recipe = runtimebase.recipe_hash("apt")
    took = derive_seconds(done.err)
    assert sorted(took) == sorted(PLATFORMS), done.err
    print(f"lock with both derivations: {seconds:.0f}s; derived in {took}")
    for platform, source in project["sources"].items():
        arch, machine = platform.split("/")[1], {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}[platform]
        assert f"{platform}: {source} has no python3: deriving a base with the distribution's python3 " in done.err
        assert f"{platform}: {source} (sha256:" in done.err
        assert ") has no python3: base carry-derived/python:" in done.err
        header = (project["config"].parent / "runtime-lock" / f"linux-{arch}.txt").read_text().splitlines()
        content = runtimebase.content_digest(inspect(source))
        assert header[1:8] == [
            "# format: 2",
            f"# platform: {platform}",
            "# python: 3.11.2",  # Debian 12's own python3
            f"# target: {machine}-manylinux_2_36",
            f"# base: {source}",
            f"# base-content: {content}",
            f"# base-python: apt {recipe}",
        ]
        assert header[10].startswith("idna==")
        # the derived base: the distribution's python3 on the source's layers, labelled with what it came from
        (derived,) = derived_images(source)
        facts = inspect(derived)
        assert facts["RootFS"]["Layers"][:-1] == inspect(source)["RootFS"]["Layers"]
        assert facts["Architecture"] == arch
        assert facts["Config"]["Labels"][runtimebase.LABEL_BASE] == content
        assert facts["Config"]["Labels"][runtimebase.LABEL_PYTHON] == f"apt {recipe}"
        # neither the source's nor the derived image's ID is in the lock
        text = "\n".join(header)
        assert derived.removeprefix("sha256:") not in text and inspect(source)["Id"][7:] not in text
        assert (
            f"{platform}: 1 packages, python 3.11.2, target {machine}-manylinux_2_36, base {source} "
            f"({content[:19]}…, python apt {recipe[:19]}…): wrote runtime-lock/linux-{arch}.txt" in done.out
        )


def test_a_second_lock_reuses_the_derived_bases(project, locked):
    started = time.monotonic()
    again = lock(project)
    seconds = time.monotonic() - started
    assert again.code == 0, again.err[-2000:]
    assert again.out.count(": up to date") == 2
    assert again.err.count("(made earlier)") == 2 and "deriving" not in again.err
    for source in project["sources"].values():  # said again: which base, and why
        assert re.search(rf"{re.escape(source)} \(sha256:\S+\) has no python3: base carry-derived/python:", again.err)
    print(f"lock again, both bases made earlier: {seconds:.1f}s")


@pytest.fixture(scope="module")
def pushed(project, locked):
    started = time.monotonic()
    done = carry(
        "--config", str(project["config"]), "image", "--push", "--json",
        cwd=project["config"].parent, env=project["env"], timeout=1500,
    )  # fmt: skip
    assert done.code == 0, done.err[-3000:]
    return json.loads(done.out), done, time.monotonic() - started


def test_the_locked_image_of_both_platforms_is_pushed_on_the_derived_bases(project, pushed):
    found, done, seconds = pushed
    print(f"image --push, both platforms: {seconds:.0f}s")
    by_platform = {p["platform"]: p for p in found["platforms"]}
    assert sorted(by_platform) == sorted(PLATFORMS)
    auth = {"username": project["docker"].registry_user, "password": project["docker"].registry_password()}
    from carry.image import registryhttp

    repo = registryhttp.Repository.of(project["name"], auth)
    for platform, outcome in by_platform.items():
        source = project["sources"][platform]
        (derived,) = derived_images(source)
        names = [layer["name"] for layer in outcome["layers"]]
        base_layers = len(inspect(derived)["RootFS"]["Layers"])
        assert names == ["base"] * base_layers + ["venv", "nvidia", "torch", "deps", "vllm-fixed"], names
        # the image says which base it is on: the runtime image's name, content digest and recipe, as the lock
        manifest = json.loads(repo.get_manifest(outcome["refs"][0].rsplit(":", 1)[1])[1])
        _, _, body = repo.request("GET", f"/v2/{repo.name}/blobs/{manifest['config']['digest']}")
        labels = json.loads(body)["config"]["Labels"]
        assert labels[runtimebase.LABEL_BASE_NAME] == source
        assert labels[runtimebase.LABEL_BASE] == runtimebase.content_digest(inspect(source))
        assert labels[runtimebase.LABEL_PYTHON] == f"apt {runtimebase.recipe_hash('apt')}"
        assert runtimebase.LABEL_BASE_DIGEST not in labels  # a local image: no registry digest to name
    # pulled back and run: the derived base's python3 runs /opt/venv (arm64 under QEMU)
    assert (
        "Python 3.11.2" in by_platform["linux/amd64"]["smoke"]
        and "import minibase" in by_platform["linux/amd64"]["smoke"]
    )
    assert "importlib.metadata 0.1.0+carry." in by_platform["linux/arm64"]["smoke"]


def test_verify_proves_both_platforms_and_their_base(project, pushed):
    found, _, _ = pushed
    ref = found["platforms"][0]["refs"][0].rsplit(":", 1)[0] + f":{VERSION}"
    started = time.monotonic()
    done = carry(
        "--config", str(project["config"]), "verify", ref, cwd=project["config"].parent, env=project["env"]
    )  # fmt: skip
    assert done.code == 0, done.out + done.err[-2000:]
    for platform in PLATFORMS:
        assert f"platform {platform}: read natively" in done.out
        arch = platform.split("/")[1]
        assert f"base: {project['sources'][platform]} (sha256:" in done.out
        assert "python apt sha256:" in done.out and f"as linux-{arch}.txt records" in done.out
    print(f"verify, both platforms: {time.monotonic() - started:.1f}s")


def test_a_fresh_runner_pulls_the_image_by_digest_derives_again_and_finds_the_lock_fresh(project, pushed):
    """As on a fresh runner: the runtime image is not in the engine (the stand-in pushed to the test registry, removed
    here, and named by digest), nor is its derived base. `lock --check` pulls the image by its digest, derives the
    base anew (another image ID), and finds the lock fresh: it names the image's content and the recipe."""
    env, run = project["docker"], project["run"]
    source = project["sources"]["linux/amd64"]
    (before,) = derived_images(source)
    remote = f"{env.registry}/carry-test/pyless-src-{run}"
    docker("tag", source, f"{remote}:amd64")
    with dockerenv.logged_in(env) as cli_env:
        docker("push", f"{remote}:amd64", env=cli_env)
    digest = next(d for d in inspect(f"{remote}:amd64")["RepoDigests"] if d.startswith(remote)).split("@")[1]
    config = project["config"]
    text = config.read_text()
    config.write_text(text.replace(f"runtime_image: {source}", f"runtime_image: {remote}@{digest}"))
    try:
        source_id = inspect(source)["Id"]
        docker("image", "rm", before)  # its derived base, then the image itself (every name): gone
        docker("image", "rm", "--force", source_id)
        started = time.monotonic()
        checked = lock(project, "--check", "--platform", "linux/amd64")
        seconds = time.monotonic() - started
        assert checked.code == 0, checked.out + checked.err[-2000:]
        assert checked.out.strip() == "linux/amd64: fresh"
        assert f"linux/amd64: pulled {remote}@{digest} by digest in " in checked.err
        assert f"{remote}@{digest} has no python3: deriving" in checked.err
        (after,) = derived_images(f"{remote}@{digest}")
        assert after != before
        labels = inspect(after)["Config"]["Labels"]
        assert labels[runtimebase.LABEL_BASE_DIGEST] == digest  # pinned by it: named in the labels too
        print(f"fresh runner, lock --check: {seconds:.0f}s (linux/amd64 derived in {derive_seconds(checked.err)})")
    finally:
        config.write_text(text)
        # the module's source back under its name, for what follows (when the pull brought it back)
        subprocess.run([DOCKER, "tag", f"{remote}@{digest}", source], capture_output=True)
        subprocess.run([DOCKER, "image", "rm", f"{remote}@{digest}"], capture_output=True)


def test_a_fresh_runners_push_takes_the_base_from_the_registrys_record(project, pushed, tmp_path):
    """After the test above the engine holds no derived base of the stand-in (as on a fresh runner). `image --push`
    with an empty carry cache does not derive it again: the previous image's record in the registry shows the same
    recipe on the same runtime image (content digest) made its base layers, which the registry holds."""
    source = project["sources"]["linux/amd64"]
    assert derived_images(source) == []
    env = {**project["env"], "CARRY_CACHE": str(tmp_path / "cache")}
    done = carry(
        "--config", str(project["config"]), "image", "--push", "--json", "--platform", "linux/amd64",
        cwd=project["config"].parent, env=env, timeout=900,
    )  # fmt: skip
    assert done.code == 0, done.err[-3000:]
    assert "the base a previous image records (the same recipe on the same runtime image" in done.err
    assert "not derived again" in done.err and "deriving a base" not in done.err
    assert derived_images(source) == []
    (outcome,) = json.loads(done.out)["platforms"]
    assert {layer["action"] for layer in outcome["layers"]} == {"already exists"}, outcome["layers"]
    assert "import minibase" in outcome["smoke"] or "light: " in outcome["smoke"], outcome["smoke"]


def test_off_and_bad_values_are_refused(project, locked):
    config = project["config"]
    text = config.read_text()
    try:
        config.write_text(text.replace("  lock: runtime-lock\n", "  lock: runtime-lock\n  runtime_python: off\n"))
        source = project["sources"]["linux/amd64"]
        assert_bad_input(
            lock(project),
            f"runtime image {source} (for linux/amd64) has no python3 and image.runtime_python is off",
            "set it to auto",
        )
        for bad in ("  runtime_python: yum\n", "  runtime_python: [apt]\n"):
            config.write_text(text.replace("  lock: runtime-lock\n", f"  lock: runtime-lock\n{bad}"))
            assert_bad_input(lock(project), "image.runtime_python must be auto (derive", "apt (always", "off (never)")
        arm64 = f"linux/arm64: {{runtime_image: {project['sources']['linux/arm64']}}}"
        config.write_text(text.replace(arm64, arm64[:-1] + ", runtime_python: sometimes}"))
        assert_bad_input(lock(project), "image.platforms.linux/arm64.runtime_python must be auto", "'sometimes'")
        assert (config.parent / "runtime-lock" / "linux-arm64.txt").exists()  # the lock was left as it was
    finally:
        config.write_text(text)
