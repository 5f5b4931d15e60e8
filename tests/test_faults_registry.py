"""Registry faults injected for real (docs/reliability.md, "Registry and push"): carry pushes through a small proxy of
our own on loopback (tests/faultproxy.py) in front of the test registry with htpasswd auth, which answers 5xx or 429,
drops connections, refuses the login mid-run, or holds a request while carry is killed (SIGINT, SIGKILL) at several
points of a push; a registry that is down is a closed port or a server that never answers. Each case asserts the
message (one line, naming the registry, the blob or tag, the status; the login's variables and never the password),
the exit code, what is left behind (the registry's tags: each on a whole, signed image or where it was; dist/), and
that a rerun succeeds with the digests of an uninterrupted push. A rerun with nothing changed writes nothing to the
registry and gives the same digests, for the locked image and the Dockerfile image (both platforms, the lists), and
changing only image.name re-runs no build stage.

The locked image is a small real one (a pure-Python wheel of a tiny upstream, idna from the runtime lock, on the test
runtime bases); the Dockerfile image is the demo, built as tests/test_image.py builds it (so that the two share
BuildKit's cache). Each scenario pushes into a repository of its own, seeded by copying the registry's storage of one
pushed earlier (an older VERSION: the tags a killed run must leave whole); every repository is removed at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import dockerenv
from carry.image import registryhttp
from faultproxy import FaultProxy, Rule, closed_port, silent_server
from helpers import BUILD_PY, ROOT, Upstream, carry, write_config

pytestmark = [pytest.mark.slow, pytest.mark.docker]

PLATFORMS = ("linux/amd64", "linux/arm64")
OLD, NEW = "20261201.1", "20261202.1"
PYPROJECT = """[build-system]
requires = ["setuptools>=61", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "minifault"
dynamic = ["version"]
dependencies = ["idna>=3.4"]
"""
FILES = {
    "pyproject.toml": PYPROJECT,
    "setup.py": "import os\nfrom setuptools import setup\nsetup(version=os.environ['MINIFAULT_VERSION'])\n",
    "minifault/__init__.py": "import importlib.metadata\n__version__ = importlib.metadata.version('minifault')\n",
}
BUILD = """build:
  cuda_arches: []
  wheel_version: "0.1.0+carry.{version}"
  version_env: [MINIFAULT_VERSION]
  build_isolation: false
  compiler_cache: none
"""
TAG_PUT = re.compile(r"/manifests/(?!sha256[:-])[^/]+$")  # a tag (not a digest, not a .sig/.att)
DIGEST_PUT = re.compile(r"/manifests/sha256:[0-9a-f]{64}$")
ATTACHMENT_PUT = re.compile(r"/manifests/sha256-[0-9a-f]{64}\.(sig|att)$")


def storage() -> Path:
    return dockerenv.env_file().parent / "registry" / "data" / "docker" / "registry" / "v2" / "repositories"


class Registry:
    """The test registry read directly (not through the proxy): tags, manifests, blobs."""

    def __init__(self, env: dockerenv.DockerEnv, name: str) -> None:
        auth = {"username": env.registry_user, "password": env.registry_password()}
        self.repo = registryhttp.Repository.of(f"{env.registry}/{name.split('/', 1)[1]}", auth)

    def tags(self) -> dict[str, str]:
        """tag -> digest, the attachments' tags (sha256-….sig/.att) left out."""
        status, _, body = self.repo.request("GET", f"/v2/{self.repo.name}/tags/list", ok=(200, 404))
        names = (json.loads(body).get("tags") or []) if status == 200 else []
        found = {}
        for tag in names:
            if not tag.startswith("sha256-"):
                found[tag] = self.repo.manifest_digest(tag) or ""
        return found

    def attachments(self) -> set[str]:
        status, _, body = self.repo.request("GET", f"/v2/{self.repo.name}/tags/list", ok=(200, 404))
        return {t for t in (json.loads(body).get("tags") or []) if t.startswith("sha256-")} if status == 200 else set()

    def whole(self, reference: str, signed: bool = True) -> list[str]:
        """What is missing for `reference` to be a whole image: each manifest a list names, each blob, and (signed)
        the signature of the list and of each platform manifest. Empty: whole."""
        missing = []
        found = self.repo.get_manifest(reference)
        if found is None:
            return [f"{reference}: no manifest"]
        media_type, body = found
        digest = registryhttp.digest_of(body)
        document = json.loads(body)
        if signed and not self.repo.manifest_digest(digest.replace(":", "-") + ".sig"):
            missing.append(f"{reference}: no signature of {digest[:19]}")
        if "list" in media_type or "index" in media_type:
            for entry in document["manifests"]:
                missing += self.whole(entry["digest"], signed)
            return missing
        for blob in [document["config"], *document["layers"]]:
            if not self.repo.has_blob(blob["digest"]):
                missing.append(f"{reference}: no blob {blob['digest'][:19]}")
        return missing


class Project:
    """The small locked project: its config, environment and the registry repository it pushes to (via the proxy)."""

    def __init__(self, root: Path, upstream: Upstream, env: dockerenv.DockerEnv, key: Path, proxy: FaultProxy):
        self.root, self.env, self.proxy = root, env, proxy
        self.name = ""
        image = (
            "image:\n  name: NAME\n  tags: ['{version}', latest]\n  lock: runtime-lock\n  platforms:\n"
            f"    linux/amd64: {{runtime_image: {env.runtime_base}}}\n"
            f"    linux/arm64: {{runtime_image: {env.runtime_base_arm64}}}\n"
        )
        self.config = write_config(root / "project", str(upstream.path), upstream.head(), extra=BUILD + image)
        self.version(OLD)
        self.env_vars = {
            "CARRY_CACHE": str(root / "cache"),
            "CARRY_REGISTRY_USER": env.registry_user,
            "CARRY_REGISTRY_PASSWORD": env.registry_password(),
            "CARRY_SIGNING_KEY": str(key),
            "DOCKER_CONFIG": str(root / "docker-config"),
        }
        self.names: list[str] = []

    def version(self, value: str) -> None:
        (self.config.parent / "VERSION").write_text(value + "\n")

    def use(self, name: str, host: str | None = None) -> str:
        """Point image.name at `carry-test/<name>` of `host` (the proxy's address unless given)."""
        full = f"{host or self.proxy.address}/carry-test/{name}"
        text = re.sub(r"(?m)^  name: .*$", f"  name: {full}", self.config.read_text())
        self.config.write_text(text)
        self.name = full
        if full not in self.names:
            self.names.append(full)
        return full

    def registry(self) -> Registry:
        return Registry(self.env, self.name)

    def run(self, *args: str, **extra: str):
        return carry("--config", str(self.config), *args, env={**self.env_vars, **extra}, timeout=900)

    def push(self, *args: str, **extra: str) -> dict:
        done = self.run("image", "--push", "--no-smoke", "--json", *args, **extra)
        assert done.code == 0, done.err[-3000:]
        return json.loads(done.out)

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(BUILD_PY), "--config", str(self.config), *args],
            env={**os.environ, **self.env_vars},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def seed(self, source: str, name: str) -> str:
        """A new repository holding what `source` holds (its storage copied: links to the same blobs), in use."""
        shutil.copytree(storage() / "carry-test" / source.rsplit("/", 1)[1], storage() / "carry-test" / name)
        return self.use(name)


def digests(pushed: dict) -> dict[str, str]:
    """ref's tag -> digest of what `image --push --json` pushed."""
    return {ref.rsplit(":", 1)[1]: digest for ref, digest in pushed["pushed"].items()}


def one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("carry: error:")]
    assert len(lines) == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def proxy():
    env = dockerenv.require()
    found = FaultProxy(env.registry)
    yield found
    found.close()


@pytest.fixture(scope="module")
def project(tmp_path_factory, proxy):
    """The locked project, locked for both platforms; OLD pushed to `seed` and NEW to `reference` (uninterrupted)."""
    env = dockerenv.require()
    root = tmp_path_factory.mktemp("faults-registry")
    upstream = Upstream.create(root / "upstream", FILES)
    keygen = carry("keygen", str(root / "key"))
    assert keygen.code == 0, keygen.err
    found = Project(root, upstream, env, root / "key" / "carry.key", proxy)
    run = uuid.uuid4().hex[:8]
    found.use(f"faults-{run}-seed")
    locked = found.run("lock")
    assert locked.code == 0, locked.err[-3000:]
    started = time.monotonic()
    found.seed_pushed = found.push()
    found.seed_seconds = time.monotonic() - started
    found.seed_name = found.name
    found.version(NEW)
    found.use(f"faults-{run}-reference")
    started = time.monotonic()
    found.reference = found.push()
    found.reference_seconds = time.monotonic() - started
    found.reference_name = found.name
    found.run_id = run
    try:
        yield found
    finally:
        for name in found.names:
            dockerenv.forget(name)


def fresh(project: Project, label: str) -> str:
    """A repository for one scenario, holding OLD as pushed to the seed; VERSION is NEW."""
    project.version(NEW)
    return project.seed(project.seed_name, f"faults-{project.run_id}-{label}")


def assert_tags_whole(project: Project, before: dict[str, str], when: str) -> dict[str, str]:
    """Every tag is where it was or on a whole, signed image of NEW (the reference's digest)."""
    now = project.registry().tags()
    expected = digests(project.reference)
    for tag, digest in now.items():
        assert digest in (before.get(tag), expected.get(tag)), f"{when}: {tag} -> {digest}, neither old nor new"
        assert not project.registry().whole(tag), f"{when}: {project.registry().whole(tag)}"
    return now


def assert_rerun_completes(project: Project) -> dict:
    pushed = project.push()
    assert digests(pushed) == digests(project.reference), "a rerun gives the uninterrupted push's digests"
    tags = project.registry().tags()
    for tag, digest in digests(project.reference).items():
        assert tags[tag] == digest
        assert not project.registry().whole(tag)
    return pushed


def assert_order(entries: list, platforms: int = 2, lists: int = 1) -> None:
    """In the proxy's log of one push: no tag PUT before every manifest by digest and every signature PUT."""
    writes = [e for e in entries if e.method == "PUT" and e.status in (200, 201)]
    tags = [i for i, e in enumerate(writes) if TAG_PUT.search(e.target.split("?")[0])]
    others = [i for i, e in enumerate(writes) if DIGEST_PUT.search(e.target) or ATTACHMENT_PUT.search(e.target)]
    assert tags and others, [e.target for e in writes]
    assert max(others) < min(tags), [e.target for e in writes]
    assert sum(1 for e in writes if DIGEST_PUT.search(e.target)) == platforms + lists


# -- a rerun with nothing changed ----------------------------------------------------------------------------------


def test_locked_rerun_writes_nothing_and_gives_the_same_digests(project, proxy):
    """The reference push again: every digest the same (both platforms, the list), and not one write reaches the
    registry (only HEAD and GET)."""
    project.use(project.reference_name.rsplit("/", 1)[1])
    before = project.registry().tags()
    attachments = project.registry().attachments()
    mark = proxy.mark()
    again = project.push()
    assert digests(again) == digests(project.reference)
    writes = [f"{e.method} {e.target}" for e in proxy.since(mark) if e.write]
    assert not writes, writes
    assert project.registry().tags() == before and project.registry().attachments() == attachments


def test_the_reference_push_moved_no_tag_before_every_manifest_and_signature(project, proxy):
    """A push from a seeded repository (OLD there), in the proxy's log: every platform manifest and the list PUT by
    digest, every signature and attestation PUT, and only then the tags."""
    fresh(project, "order")
    mark = proxy.mark()
    pushed = project.push()
    assert digests(pushed) == digests(project.reference)
    assert_order(proxy.since(mark))


# -- killed mid-push -----------------------------------------------------------------------------------------------

# (where, the request held while carry is killed: method, target regex, how many such requests pass first)
KILL_POINTS = {
    "blob-upload": ("PATCH", r"/blobs/uploads/", 0),
    "platform-manifest": ("PUT", DIGEST_PUT.pattern, 1),  # the second platform's, the first one signed
    "signature": ("PUT", r"\.sig$", 0),
    "list": ("PUT", DIGEST_PUT.pattern, 2),
    "list-signature": ("PUT", r"\.sig$", 2),
    "platform-tag": ("PUT", rf"/manifests/{NEW}-amd64$", 0),
    "shared-tag": ("PUT", r"/manifests/latest$", 0),  # VERSION's tag moved already
}
KILLS = [
    ("blob-upload", signal.SIGINT),
    ("platform-manifest", signal.SIGKILL),
    ("signature", signal.SIGINT),
    ("list", signal.SIGKILL),
    ("list-signature", signal.SIGINT),
    ("platform-tag", signal.SIGKILL),
    ("shared-tag", signal.SIGINT),
]


@pytest.mark.parametrize(("point", "sig"), KILLS, ids=[f"{p}-{s.name}" for p, s in KILLS])
def test_a_push_killed_leaves_every_tag_whole_and_a_rerun_completes(project, proxy, point, sig):
    """carry killed while the registry holds one of its requests: each tag is where it was (OLD) or on the whole,
    signed NEW image; SIGINT ends carry in seconds with exit 130; the rerun gives the uninterrupted push's digests."""
    fresh(project, f"kill-{point}")
    before = project.registry().tags()
    assert set(before) == {OLD, f"{OLD}-amd64", f"{OLD}-arm64", "latest"}, before
    method, path, skip = KILL_POINTS[point]
    rule = proxy.add(Rule("hold", method=method, path=path, skip=skip))
    process = project.popen("image", "--push", "--no-smoke")
    try:
        assert rule.reached.wait(300), f"carry never reached {point}: {process.poll()}"
        os.killpg(process.pid, sig)
        started = time.monotonic()
        _, err = process.communicate(timeout=60)
        ended = time.monotonic() - started
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        proxy.clear()
    if sig == signal.SIGINT:
        assert process.returncode == 130 and "carry: aborted" in err, (process.returncode, err[-2000:])
        assert ended < 15, f"SIGINT took {ended:.1f}s to end carry"
    else:
        assert process.returncode == -signal.SIGKILL
    assert_tags_whole(project, before, f"killed at {point}")
    assert_rerun_completes(project)
