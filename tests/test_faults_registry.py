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

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import dockerenv
from carry.image import layerpush, registryhttp
from carry.image.registry import CONFIG_PREFIX
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
        self.run_id = self.seed_name = self.reference_name = ""
        self.reference: dict = {}  # what the uninterrupted push of NEW pushed (`image --push --json`)

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
        """carry in a session of its own, SIGINT at its default (a shell's background job, as a runner may start
        pytest, passes SIGINT on ignored, and Python then keeps ignoring it)."""
        return subprocess.Popen(
            [sys.executable, str(BUILD_PY), "--config", str(self.config), *args],
            env={**os.environ, **self.env_vars},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
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
    found.push()
    found.seed_name = found.name
    found.version(NEW)
    found.use(f"faults-{run}-reference")
    found.reference = found.push()
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
    said = [f"{e.method} {e.target.split('?')[0].rsplit('/', 1)[1][:24]}" for e in writes]
    assert tags and others, said
    assert max(others) < min(tags), said
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
    # the login docker wrote for the killed carry: SIGINT's cleanup deletes it, SIGKILL's is the rerun's to delete
    assert bool(logins(process.pid)) == (sig == signal.SIGKILL), logins(process.pid)
    assert_tags_whole(project, before, f"killed at {point}")
    assert_cache_whole(project)
    assert_rerun_completes(project)
    assert not logins(process.pid), f"the rerun left the killed carry's login on disk: {logins(process.pid)}"


def logins(pid: int) -> list[Path]:
    """The private DOCKER_CONFIG dirs (each holding a login) of carry's process `pid`."""
    return list(Path(tempfile.gettempdir()).glob(f"{CONFIG_PREFIX}{pid}-*"))


def assert_cache_whole(project: Project) -> None:
    """What the push remembers in the cache is whole: each layer's digests (JSON), each image config (its bytes hash
    to its name); nothing half-written under a final name."""
    root = project.root / "cache" / "image-layers"
    digests = layerpush.Digests(root)
    for path in root.glob("*.json"):
        written = digests.get(path.stem)  # None where the entry does not hold its own sha256 (carry.util.integrity)
        assert written is not None and written.digest.startswith("sha256:"), path
    for path in (root / "configs").glob("*.json"):
        assert hashlib.sha256(path.read_bytes()).hexdigest() == path.stem, path


# -- registry errors -----------------------------------------------------------------------------------------------


def timed_push(project: Project, **extra: str) -> tuple[dict, float, str]:
    started = time.monotonic()
    done = project.run("image", "--push", "--no-smoke", "--json", **extra)
    seconds = time.monotonic() - started
    assert done.code == 0, done.err[-3000:]
    return json.loads(done.out), seconds, done.err


def test_5xx_429_and_a_dropped_connection_are_retried_and_the_time_it_added(project, proxy):
    """A blob upload answered 503 twice then accepted; a manifest PUT by digest answered 502 twice, a tag 429
    (Retry-After: 1) once; a blob upload cut after 1 kB once: the push succeeds with the reference's digests, each
    retry said on stderr, and costs about its backoff: the figure is printed against a clean push of the same."""
    fresh(project, "clean")
    _, clean, _ = timed_push(project)
    fresh(project, "retried")
    proxy.add(Rule("status", method="PATCH", path=r"/blobs/uploads/", status=503, times=2))
    mark = proxy.mark()
    _, twice, err = timed_push(project)
    proxy.clear()
    patches = [e for e in proxy.since(mark) if e.method == "PATCH"]
    assert [e.status for e in patches[:3]] == [503, 503, 202], patches
    assert err.count("answered 503 Injected") == 2 and "attempt 3 of 4 in 1.0s" in err, err[-3000:]
    # the backoff read off the proxy's own clock: each retry came no sooner than its wait after the 503 (the two
    # pushes' wall times only print: on a loaded machine a clean push varies by more than the backoff)
    waits = [later.at - earlier.at for earlier, later in zip(patches, patches[1:3])]
    print(
        f"retry path: a blob upload answered 503 twice, then accepted: {twice:.1f}s against {clean:.1f}s clean, "
        f"+{twice - clean:.1f}s; retried after {waits[0]:.2f}s and {waits[1]:.2f}s (backoff 0.5 + 1.0 s)"
    )
    assert 0.5 <= waits[0] < 10 and 1.0 <= waits[1] < 10, waits

    fresh(project, "mixed")
    proxy.add(Rule("status", method="PUT", path=DIGEST_PUT.pattern, status=502, times=2))
    proxy.add(Rule("status", method="PUT", path=r"/manifests/latest$", status=429, headers={"Retry-After": "1"}))
    proxy.add(Rule("drop", method="PATCH", path=r"/blobs/uploads/", after=1024))
    mark = proxy.mark()
    pushed, seconds, err = timed_push(project)
    proxy.clear()
    assert digests(pushed) == digests(project.reference)
    faulted = [(e.method, e.action, e.status) for e in proxy.since(mark) if e.action != "relayed"]
    assert faulted == [("PATCH", "drop", None), ("PUT", "status", 502), ("PUT", "status", 502),
                       ("PUT", "status", 429)], faulted  # fmt: skip
    assert "the connection dropped" in err and "answered 429 Injected" in err and "in 1.0s" in err, err[-3000:]
    print(f"retry path: a dropped upload, two 502s and a 429 (Retry-After: 1): {seconds:.1f}s, +{seconds - clean:.1f}s")
    assert_rerun_completes(project)


@pytest.mark.parametrize("where", ["tag", "blob"])
def test_a_registry_that_keeps_failing_is_one_line_exit_1_and_the_tags_stay_whole(project, proxy, where):
    """503 to every attempt (4, over about 3.5 s of backoff) on the VERSION tag's PUT, or on a blob upload: exit 1,
    one line naming the registry, the tag or blob and the status; every tag where it was or on the whole new image;
    a rerun completes."""
    fresh(project, f"failing-{where}")
    before = project.registry().tags()
    path = rf"/manifests/{NEW}$" if where == "tag" else r"/blobs/uploads/"
    proxy.add(Rule("status", method="PUT" if where == "tag" else "PATCH", path=path, status=503, times=None))
    started = time.monotonic()
    done = project.run("image", "--push", "--no-smoke")
    seconds = time.monotonic() - started
    proxy.clear()
    assert done.code == 1, done.err[-3000:]
    line = one_line(done.err)
    assert f"registry {proxy.address}" in line and "503" in line and "4 attempts" in line, line
    named = (
        f"manifest carry-test/faults-{project.run_id}-failing-tag:{NEW}"
        if where == "tag"
        else "blob upload of layer vllm-fixed (linux/amd64) sha256:"
    )
    assert named in line, line
    assert seconds < 60, seconds
    tags = assert_tags_whole(project, before, f"503 on every {where}")
    if where == "tag":  # the platforms' own tags moved first; VERSION and latest stay on OLD's list
        assert tags[NEW + "-amd64"] == digests(project.reference)[NEW + "-amd64"] and tags["latest"] == before["latest"]
    else:
        assert tags == before
    assert_rerun_completes(project)


def test_a_401_mid_run_names_the_login_variables_never_the_password(project, proxy):
    """The registry refuses the login at the first manifest PUT: exit 2, one line naming CARRY_REGISTRY_USER and
    CARRY_REGISTRY_PASSWORD, the password nowhere in the output; no tag moved; a rerun completes."""
    fresh(project, "unauthorized")
    before = project.registry().tags()
    challenge = {"WWW-Authenticate": 'Basic realm="carry-test"'}
    proxy.add(Rule("status", method="PUT", path=DIGEST_PUT.pattern, status=401, headers=challenge, times=None))
    done = project.run("image", "--push", "--no-smoke")
    proxy.clear()
    assert done.code == 2, done.err[-3000:]
    line = one_line(done.err)
    assert "CARRY_REGISTRY_USER" in line and "CARRY_REGISTRY_PASSWORD" in line and "401" in line, line
    assert f"registry {proxy.address} refused the login of {project.env.registry_user}" in line, line
    assert project.env.registry_password() not in done.out + done.err
    assert project.registry().tags() == before
    assert_rerun_completes(project)


def bad_registry_commands(project: Project) -> dict[str, tuple[str, ...]]:
    return {
        "image --push": ("image", "--push", "--no-smoke"),
        "manifest": ("manifest",),
        "verify IMAGE": ("verify", f"{project.name}:{NEW}"),
    }


@pytest.mark.parametrize("fault", ["closed port", "no answer", "wrong password"])
def test_an_unreadable_registry_is_bad_input_in_seconds_for_every_command(project, proxy, fault):
    """A registry that is down (a closed port, a server that never answers) or refuses the password, for `image
    --push`, `manifest` and `verify IMAGE`: exit 2 in seconds, one line naming the registry and CARRY_REGISTRY_USER /
    CARRY_REGISTRY_PASSWORD, never the password; nothing written to dist/."""
    dist = project.config.parent / "dist"
    listing = sorted(p.name for p in dist.iterdir()) if dist.exists() else []
    password = project.env.registry_password()
    extra = {"CARRY_REGISTRY_PASSWORD": "wrong-" + password} if fault == "wrong password" else {}
    opener = silent_server if fault == "no answer" else closed_port
    with opener() as address:
        project.use(f"faults-{project.run_id}-down", address if fault != "wrong password" else proxy.address)
        commands = bad_registry_commands(project)
        for what, args in commands.items() if fault != "no answer" else [("image --push", commands["image --push"])]:
            started = time.monotonic()
            done = project.run(*args, **extra)
            seconds = time.monotonic() - started
            assert done.code == 2, (what, done.code, done.err[-2000:])
            line = one_line(done.err)
            host = address if fault != "wrong password" else proxy.address
            assert f"registry {host}" in line and "CARRY_REGISTRY_USER" in line and "CARRY_REGISTRY_PASSWORD" in line
            assert password not in done.out + done.err
            assert seconds < 20, (what, seconds)
            print(f"{fault}: {what}: exit 2 in {seconds:.1f}s: {line}")
    assert (sorted(p.name for p in dist.iterdir()) if dist.exists() else []) == listing
    if fault == "closed port":  # `lock` asks the registry only to pull a runtime image from image.name's registry
        with closed_port() as address:
            project.use(f"faults-{project.run_id}-down", address)
            text = project.config.read_text().replace(project.env.runtime_base + "}", f"{address}/carry-test/gone:1}}")
            other = project.config.with_name("down.yaml")
            other.write_text(text)
            done = carry("--config", str(other), "lock", "--platform", "linux/amd64", env=project.env_vars)
            other.unlink()
            assert done.code == 2, done.err[-2000:]
            line = one_line(done.err)
            assert f"cannot reach registry {address}" in line and "CARRY_REGISTRY_PASSWORD" in line, line


def test_created_is_the_commits_date_or_source_date_epoch(project, proxy):
    """The locked image's `created` (its config and the org.opencontainers.image.created label) is the pinned commit's
    committer date; with SOURCE_DATE_EPOCH it is that, the clock never."""
    upstream = project.root / "upstream"
    committed = subprocess.run(
        ["git", "-C", str(upstream), "show", "-s", "--format=%cd", "--date=format-local:%Y-%m-%dT%H:%M:%SZ", "HEAD"],
        capture_output=True, text=True, check=True, env={**os.environ, "TZ": "UTC"},
    ).stdout.strip()  # fmt: skip
    registry = Registry(project.env, project.reference_name)
    for platform in ("amd64", "arm64"):
        assert created_of(registry, f"{NEW}-{platform}") == (committed, committed)
    fresh(project, "epoch")
    pushed = project.push(SOURCE_DATE_EPOCH="1700000000")
    assert created_of(project.registry(), f"{NEW}-amd64") == ("2023-11-14T22:13:20Z", "2023-11-14T22:13:20Z")
    assert digests(pushed)[NEW] != digests(project.reference)[NEW]


def created_of(registry: Registry, tag: str) -> tuple[str, str]:
    """(the config's created, the org.opencontainers.image.created label) of a platform's image."""
    found = registry.repo.get_manifest(tag)
    assert found is not None, tag
    config = json.loads(registry.repo.get_blob(json.loads(found[1])["config"]["digest"]))
    return config["created"], config["config"]["Labels"]["org.opencontainers.image.created"]


# -- the Dockerfile image (the demo, both platforms) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def demo(tmp_path_factory, proxy):
    """The demo as tests/test_image.py builds it (the same build-stage inputs: BuildKit's cache serves both), signed,
    pushed through the proxy by `build.py image --push --hermetic`; its repositories removed at the end."""
    env = dockerenv.require()
    root = tmp_path_factory.mktemp("faults-demo")
    shutil.copytree(ROOT / "examples" / "demo", root / "demo")
    assert carry("keygen", str(root / "key")).code == 0
    state = {"root": root, "config": root / "demo" / "build.yaml", "names": [], "env": env, "run": uuid.uuid4().hex[:8]}
    state["vars"] = {
        "CARRY_CACHE": str(root / "cache"),
        "CARRY_DOCKER": dockerenv.DOCKER_CLI,
        "DOCKER_HOST": env.docker_host,
        "DOCKER_CONFIG": str(root / "docker-config"),
        "CARRY_TEST_BUILD_SECRET": "demo-secret-" + uuid.uuid4().hex,
        "CARRY_REGISTRY_USER": env.registry_user,
        "CARRY_REGISTRY_PASSWORD": env.registry_password(),
        "CARRY_SIGNING_KEY": str(root / "key" / "carry.key"),
    }
    try:
        yield state
    finally:
        for name in state["names"]:
            dockerenv.forget(name)


def demo_use(demo: dict, proxy: FaultProxy, label: str) -> str:
    name = f"{proxy.address}/carry-test/faults-{demo['run']}-{label}"
    section = demo["env"].image_section(name, PLATFORMS, "  secret_env: [CARRY_TEST_BUILD_SECRET]\n")
    dockerenv.set_image_section(demo["config"], section)
    demo["names"].append(name)
    return name


DEMO_PUSH = ("image", "--platform", PLATFORMS[0], "--platform", PLATFORMS[1], "--push", "--hermetic")


def demo_push(demo: dict) -> tuple[dict, float]:
    started = time.monotonic()
    done = carry("--config", str(demo["config"]), *DEMO_PUSH, env=demo["vars"], timeout=3000)
    assert done.code == 0, done.err[-4000:]
    return json.loads(done.out) if done.out.lstrip().startswith("{") else {
        "pushed": rows(done.out)
    }, time.monotonic() - started


def rows(out: str) -> dict[str, str]:
    """`ref  digest  platforms` lines of `image --push` -> ref -> digest."""
    found = {}
    for line in out.strip().splitlines():
        parts = line.split("  ")
        if len(parts) >= 3 and "/" in parts[0] and parts[1].startswith("sha256:"):
            found[parts[0]] = parts[1]
    return found


def build_stage_steps(log: str) -> dict[str, bool]:
    """Each build-stage RUN step of the BuildKit log -> whether BuildKit took it from its cache."""
    steps = {}
    for number, text in re.findall(r"(?m)^#(\d+) (\[(?:linux/\w+ )?build \d+/\d+\] RUN .{0,40})", log):
        steps[f"#{number} {text}"] = bool(re.search(rf"(?m)^#{number} CACHED$", log))
    return steps


@pytest.fixture(scope="module")
def demo_pushed(demo, proxy) -> dict:
    """The demo's first push into a fresh repository, in the proxy's log: tag -> digest, and the seconds."""
    demo_use(demo, proxy, "first")
    mark = proxy.mark()
    first, cold = demo_push(demo)
    assert_order(proxy.since(mark))  # the Dockerfile path keeps the order too: by digest and signed, tags last
    tags = {ref.rsplit(":", 1)[1]: digest for ref, digest in first["pushed"].items()}
    assert len(set(tags.values())) == 3, tags  # two platforms and one list under the shared tags
    return {"tags": tags, "seconds": cold, "name": demo["names"][-1]}


def test_dockerfile_rerun_and_a_new_name_give_the_same_digests_and_no_build(demo, demo_pushed, proxy):
    """The demo pushed twice with nothing changed (the first in push order: tags last): the same digests for both
    platforms and the lists, the second push writes nothing; then only image.name changed: every build-stage step
    comes from BuildKit's cache and the digests are the same again (the name is in no layer and no label)."""
    dockerenv.set_image_section(
        demo["config"],
        demo["env"].image_section(demo_pushed["name"], PLATFORMS, "  secret_env: [CARRY_TEST_BUILD_SECRET]\n"),
    )
    mark = proxy.mark()
    second, warm = demo_push(demo)
    writes = [f"{e.method} {e.target}" for e in proxy.since(mark) if e.write]
    assert not writes, writes
    tags = demo_pushed["tags"]
    assert {ref.rsplit(":", 1)[1]: digest for ref, digest in second["pushed"].items()} == tags
    demo_use(demo, proxy, "renamed")
    third, renamed = demo_push(demo)
    assert {ref.rsplit(":", 1)[1]: digest for ref, digest in third["pushed"].items()} == tags
    log = next((demo["root"] / "cache" / "logs").glob("image-*.log")).read_text()
    steps = build_stage_steps(log)
    assert len(steps) >= 2 and all(steps.values()), steps
    print(
        f"demo image --push: {demo_pushed['seconds']:.0f}s, again {warm:.0f}s (nothing written), "
        f"renamed {renamed:.0f}s (no build)"
    )


def test_dockerfile_push_killed_at_the_list_leaves_no_tag_and_a_rerun_completes(demo, demo_pushed, proxy):
    """The demo's push SIGKILLed while the registry holds the manifest list's PUT: no tag exists yet (the tags move
    last); the rerun gives the digests of the uninterrupted push."""
    name = demo_use(demo, proxy, "killed")
    rule = proxy.add(Rule("hold", method="PUT", path=DIGEST_PUT.pattern, skip=2))
    process = subprocess.Popen(
        [sys.executable, str(BUILD_PY), "--config", str(demo["config"]), *DEMO_PUSH],
        env={**os.environ, **demo["vars"]}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert rule.reached.wait(900), "carry never reached the list's PUT"
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        proxy.clear()
    registry = Registry(demo["env"], name)
    assert registry.tags() == {}
    assert logins(process.pid), "the killed carry's login is still on disk (SIGKILL skips every cleanup)"
    pushed, _ = demo_push(demo)
    assert not logins(process.pid), f"the rerun left the killed carry's login on disk: {logins(process.pid)}"
    assert {ref.rsplit(":", 1)[1]: digest for ref, digest in pushed["pushed"].items()} == demo_pushed["tags"]
    for tag in demo_pushed["tags"]:
        assert not registry.whole(tag), registry.whole(tag)
