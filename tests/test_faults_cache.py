"""Faults of the cache and the disk, injected for real (docs/reliability.md, "Cache and disk").

A small stand-in upstream (a Python-only package made here, built reproducibly under SOURCE_DATE_EPOCH) is built
with `carry wheel`; README's pluggy sdists are fetched by `examples/pluggy/make_upstream.py` through the download
store from a package index of our own on loopback (tests/faultindex.py: PIP_INDEX_URL points at it) that cuts,
truncates or ignores ranges on purpose. The faults: a byte flipped in a cached wheel, a bundle, a stored download;
a cut connection, a truncated file; a full disk (small tmpfs mounts) under dist/, the artifact cache, the build
environment, the build's output and the download store. Each asserts the one line carry prints and its exit code,
what is left behind, and that a rerun (after space is freed, the server healed) succeeds with equal hashes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import faultindex
from carry.util import integrity, reporter
from helpers import ROOT, Upstream, carry, git, write_config

PYPROJECT = """[build-system]
requires = ["setuptools>=61", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "minifault"
dynamic = ["version"]
"""
SETUP_PY = "import os\nfrom setuptools import setup\nsetup(version=os.environ['MINIFAULT_VERSION'])\n"
BLOB = "".join(random.Random(42).choices("0123456789abcdef", k=60_000))  # ~32 KB in the wheel
FILES = {
    "pyproject.toml": PYPROJECT,
    "setup.py": SETUP_PY,
    "minifault/__init__.py": "NAME = 'minifault'\n",
    "minifault/blob.py": f"BLOB = {BLOB!r}\n",
}
BUILD = """build:
  cuda_arches: []
  wheel_version: "0.1.0+carry.{version}"
  version_env: [MINIFAULT_VERSION]
  build_isolation: false
  compiler_cache: none
"""
WHEEL = "minifault-0.1.0+carry.20261201.1-py3-none-any.whl"
EPOCH = "1767225600"  # SOURCE_DATE_EPOCH: the same tree gives the same wheel bytes in any cache
PLUGGY = ROOT / "examples" / "pluggy"
SDISTS = ("pluggy-1.5.0.tar.gz", "pluggy-1.6.0.tar.gz")


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def flip(path: Path, at: float = 0.5) -> None:
    """One byte of `path` changed in place (its mtime moves, as any write's does)."""
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


def error_line(err: str) -> str:
    """The one line `carry: error: ...` (the last on stderr), checked to be the only one."""
    errors = [line for line in err.splitlines() if line.startswith("carry: error:")]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
    assert "Traceback" not in err
    return errors[0]


def hidden(directory: Path) -> list[str]:
    """Temp names carry writes through (dot files) left in `directory`."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".")) if directory.is_dir() else []


# --- tmpfs -----------------------------------------------------------------------------------------------------


def require_root() -> None:
    if os.geteuid() == 0 and shutil.which("mount"):
        return
    if os.environ.get("CI"):
        pytest.fail("a full disk is a small tmpfs: mounting one needs root (CI runs as root)", pytrace=False)
    pytest.skip("mounting a tmpfs needs root")


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` for the block, unmounted after whatever happens."""
    require_root()
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)


def resize(path: Path, size: str) -> None:
    """Space freed: the tmpfs at `path` grown to `size`, its files kept."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


# --- the stand-in project --------------------------------------------------------------------------------------


class Project:
    def __init__(self, root: Path, upstream: Upstream):
        self.pin = upstream.head()
        self.upstream = upstream.path
        self.config = write_config(root / "project", str(upstream.path), self.pin, extra=BUILD)
        (self.config.parent / "VERSION").write_text("20261201.1\n")
        self.root = root
        self.cache = root / "cache"
        self.env = {"CARRY_CACHE": str(self.cache), "SOURCE_DATE_EPOCH": EPOCH}

    def run(self, *args: str, **env: str):
        return carry("--config", str(self.config), *args, env={**self.env, **env})

    def wheel(self, out: Path, **env: str):
        return self.run("wheel", "--out", str(out), **env)

    def cached(self) -> Path:
        (wheel,) = (self.cache / "artifacts").glob("*/*.whl")
        return wheel


@pytest.fixture
def upstream(tmp_path) -> Upstream:
    return Upstream.create(tmp_path / "upstream", FILES)


@pytest.fixture(scope="module")
def shared_upstream(tmp_path_factory) -> Upstream:
    """One upstream for the module's projects: the same URL in each wheel's buildinfo, so the same wheel bytes."""
    return Upstream.create(tmp_path_factory.mktemp("faults") / "upstream", FILES)


@pytest.fixture
def project(tmp_path, shared_upstream) -> Project:
    return Project(tmp_path, shared_upstream)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, shared_upstream) -> str:
    """The stand-in's wheel built once in a cache of its own: the sha256 every rebuild must give again."""
    made = Project(tmp_path_factory.mktemp("reference"), shared_upstream)
    result = made.wheel(made.root / "dist")
    assert result.code == 0, result.err
    return sha256(made.root / "dist" / WHEEL)


# --- a corrupt cache -------------------------------------------------------------------------------------------


def test_a_flipped_byte_in_a_cached_wheel_is_built_again_never_published(project, reference):
    first = project.wheel(project.root / "dist-a")
    assert first.code == 0, first.err
    published, cached = project.root / "dist-a" / WHEEL, project.cached()
    assert sha256(published) == sha256(cached) == reference == integrity.recorded(cached)
    # dist/ is a copy, never a hard link into the cache: corrupting one leaves the other as it was
    assert published.stat().st_nlink == 1 and published.stat().st_ino != cached.stat().st_ino
    flip(published)
    again = project.wheel(project.root / "dist-b")
    assert again.code == 0 and "done: reused from cache" in again.err and "(sha256 as recorded)" in again.err
    assert sha256(project.root / "dist-b" / WHEEL) == reference

    flip(cached)
    assert sha256(project.root / "dist-b" / WHEEL) == reference  # the one published before is untouched
    rebuilt = project.wheel(project.root / "dist-c")
    assert rebuilt.code == 0, rebuilt.err
    lines = [line for line in rebuilt.err.splitlines() if "corrupt cache entry" in line]
    assert len(lines) == 1, rebuilt.err
    assert (
        f"cache: {cached}: sha256 " in lines[0]
        and f"is not the {reference[:16]}… recorded when it was written" in (lines[0])
    )
    assert lines[0].endswith("a corrupt cache entry, removed; building it again")
    assert rebuilt.err.strip().endswith("done: built")
    assert sha256(project.root / "dist-c" / WHEEL) == sha256(project.cached()) == reference
    assert integrity.recorded(project.cached()) == reference
    assert hidden(project.root / "dist-c") == [] and hidden(project.cache / "artifacts") == []
    verified = project.run("verify", str(project.root / "dist-c" / WHEEL))
    assert verified.code == 0, verified.out + verified.err


def test_a_cached_wheel_of_an_older_carry_is_held_to_its_record_once(project, reference):
    assert project.wheel(project.root / "dist").code == 0
    cached = project.cached()
    integrity.seal_path(cached).unlink()  # as an older carry stored it: no sha256 beside it
    reused = project.wheel(project.root / "dist")
    assert reused.code == 0 and "done: reused from cache" in reused.err, reused.err
    assert integrity.recorded(cached) == reference  # checked against its RECORD, then sealed
    integrity.seal_path(cached).unlink()
    flip(cached, at=0.3)  # inside a member's compressed bytes: its RECORD hash no longer holds
    rebuilt = project.wheel(project.root / "dist")
    assert rebuilt.code == 0, rebuilt.err
    assert (
        f"cache: {cached}: no sha256 recorded beside it (an older carry's entry), and its own RECORD does not hold: "
        f"a corrupt cache entry, removed; building it again"
    ) in rebuilt.err
    assert sha256(project.root / "dist" / WHEEL) == reference


def test_a_flipped_byte_in_a_bundle_is_refused_offline_and_made_again_online(tmp_path, upstream):
    project = Project(tmp_path, upstream)  # an upstream of its own: this test takes it away for a while
    assert project.run("fetch").code == 0
    bundle = project.cache / "bundles" / f"{project.pin}.bundle"
    recorded = integrity.recorded(bundle)
    assert recorded == sha256(bundle)
    flip(bundle, at=0.9)  # in the pack, after the header: its heads still read
    mirrors = project.cache / "mirrors"
    shutil.rmtree(mirrors)
    gone = project.root / "upstream-gone"
    project.upstream.rename(gone)  # upstream unreachable: only the bundle could give the pin
    refused = project.run("check")
    assert refused.code == 2, refused.err
    line = error_line(refused.err)
    assert line.startswith(f"carry: error: {bundle}: sha256 ") and line.endswith(
        "recorded when it was written: a corrupt cache entry, refused; delete it and fetch while online"
    )
    assert not mirrors.exists() or not any(mirrors.iterdir())  # the mirror it began is gone again
    assert bundle.exists()  # refused, not removed: offline, nothing could replace it

    gone.rename(project.upstream)
    online = project.run("fetch")
    assert online.code == 0, online.err
    assert f"{bundle}: sha256 " in online.err and "a corrupt cache entry, removed; made again from the mirror" in (
        online.err
    )
    assert sha256(bundle) == recorded == integrity.recorded(bundle)  # the same bundle again, byte for byte
    shutil.rmtree(mirrors)
    project.upstream.rename(gone)
    offline = project.run("check")
    assert offline.code == 0, offline.err
    assert f"using cached bundle {bundle}" in offline.err


def test_the_build_context_gets_a_whole_bundle_of_this_pin(tmp_path, upstream):
    """The image's build context gets the bundle hashed as it is copied (the build stage's only source of the pin):
    a flipped byte, or a bundle of another pin under this pin's name (what an older carry left when two pins of one
    upstream shared the mirror), is said and made again from the mirror."""
    from carry import config as configuration
    from carry.image.buildkit import container
    from carry.source import upstream as source
    from carry.util.cache import Cache

    older = upstream.head()
    upstream.commit("release 2", {"minifault/two.py": "TWO = 2\n"})
    project = Project(tmp_path, upstream)  # pinned at the newer commit
    loaded, cache = configuration.load(project.config), Cache(project.cache)
    mirror = source.ensure_base(loaded, cache)
    bundle = source.write_bundle(mirror, cache, project.pin)
    whole = sha256(bundle)
    assert git(tmp_path, "bundle", "list-heads", str(bundle)).split() == [
        project.pin,
        f"refs/carry/bundle/{project.pin}",
    ]

    flip(bundle, at=0.9)
    context = tmp_path / "context"
    with reporter.recording() as said:
        container.assemble_context(loaded, cache, mirror, context, [], ())
    (line,) = said
    assert line.startswith(f"context: {bundle}: sha256 ") and line.endswith(
        "a corrupt cache entry, removed; made again from the mirror"
    )
    copied = context / "cache" / "bundles" / bundle.name
    assert sha256(copied) == sha256(bundle) == whole == integrity.recorded(copied)
    assert copied.stat().st_ino != bundle.stat().st_ino

    git(mirror, "fetch", "-q", "--depth=1", str(upstream.path), older)  # the other pin, as its project fetched it
    git(mirror, "update-ref", "refs/carry/pin", older)  # the mirror's last pin is the older one
    git(mirror, "bundle", "create", str(bundle), "refs/carry/pin")  # an older carry's bundle of it, under this name
    shutil.rmtree(context)
    with reporter.recording() as said:
        container.assemble_context(loaded, cache, mirror, context, [], ())
    assert said == [f"{bundle}: does not hold commit {project.pin[:12]}; made again from the mirror"]
    assert sha256(copied) == whole


# --- downloads through a package index of our own ---------------------------------------------------------------


@pytest.fixture(scope="module")
def sdists() -> dict[str, bytes]:
    """pluggy's two sdists (README's walk), read from the machine's download store (fetched there first if missing)."""
    from carry.source import releases

    paths = releases.fetch(PLUGGY / "releases.yaml", SDISTS)
    return {path.name: path.read_bytes() for path in paths}


@pytest.fixture
def index(sdists) -> Iterator[faultindex.Index]:
    served = faultindex.Index(sdists)
    yield served
    served.close()


def make_upstream(tmp_path: Path, index: faultindex.Index, downloads: Path):
    env = {
        **os.environ,
        "CARRY_CACHE": str(tmp_path / "cache"),
        "CARRY_DOWNLOADS": str(downloads),
        "PIP_INDEX_URL": index.simple,  # pip's own setting: carry reads it, as it reads any user's
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_CONFIG_FILE": os.devnull,
    }
    return subprocess.run(
        [sys.executable, str(PLUGGY / "make_upstream.py"), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def stored(downloads: Path, sdists: dict[str, bytes], name: str) -> Path:
    return downloads / hashlib.sha256(sdists[name]).hexdigest() / name


def test_a_cut_connection_is_resumed_with_a_range_request_and_hash_checked(tmp_path, index, sdists):
    downloads = tmp_path / "downloads"
    index.faults[SDISTS[0]] = "cut-once"
    index.faults[SDISTS[1]] = "no-range"
    made = make_upstream(tmp_path, index, downloads)
    assert made.returncode == 0, made.stderr
    half = len(sdists[SDISTS[0]]) // 2
    assert f"downloaded {SDISTS[0]} from {index.url}/files/{SDISTS[0]}: " in made.stderr
    assert f", resumed at {half} bytes, sha256 " in made.stderr
    assert [(r, s) for n, r, s in index.requests if n == SDISTS[0]] == [(None, 200), (f"bytes={half}-", 206)]
    for name in SDISTS:
        assert sha256(stored(downloads, sdists, name)) == hashlib.sha256(sdists[name]).hexdigest()
        assert not stored(downloads, sdists, name).with_name(f"{name}.part").exists()


def test_a_connection_that_keeps_dropping_keeps_the_part_and_the_rerun_resumes_it(tmp_path, index, sdists):
    downloads = tmp_path / "downloads"
    index.faults[SDISTS[0]] = "cut"
    failed = make_upstream(tmp_path, index, downloads)
    assert failed.returncode == 1, failed.stderr
    target = stored(downloads, sdists, SDISTS[0])
    part = target.with_name(f"{SDISTS[0]}.part")
    kept = 4 * faultindex.CUT
    assert failed.stderr.strip().splitlines()[-1] == (
        f"make_upstream: error: {index.url}/files/{SDISTS[0]}: download failed after 4 attempts (the connection "
        f"closed after {faultindex.CUT} of {len(sdists[SDISTS[0]]) - 3 * faultindex.CUT} bytes); {kept} bytes kept "
        f"in {part} for the next try"
    )
    assert not target.exists() and part.stat().st_size == kept
    assert not (tmp_path / "cache" / "examples" / "pluggy-upstream.git").exists()

    del index.faults[SDISTS[0]]
    rerun = make_upstream(tmp_path, index, downloads)
    assert rerun.returncode == 0, rerun.stderr
    assert f", resumed at {kept} bytes, sha256 " in rerun.stderr
    assert sha256(target) == hashlib.sha256(sdists[SDISTS[0]]).hexdigest() and not part.exists()


def test_a_truncated_file_is_refused_and_nothing_is_stored(tmp_path, index, sdists):
    downloads = tmp_path / "downloads"
    index.faults[SDISTS[0]] = "short"
    refused = make_upstream(tmp_path, index, downloads)
    assert refused.returncode == 2, refused.stderr
    size = len(sdists[SDISTS[0]])
    assert refused.stderr.strip().splitlines()[-1] == (
        f"make_upstream: error: {index.url}/files/{SDISTS[0]}: {size // 2} bytes, not the pinned {size}; fix the pin "
        f"or URL"
    )
    folder = stored(downloads, sdists, SDISTS[0]).parent
    assert not folder.exists()
    del index.faults[SDISTS[0]]
    assert make_upstream(tmp_path, index, downloads).returncode == 0
    assert sha256(folder / SDISTS[0]) == folder.name


def test_a_flipped_byte_in_a_stored_download_is_noticed_and_downloaded_again(tmp_path, index, sdists):
    downloads = tmp_path / "downloads"
    first = make_upstream(tmp_path, index, downloads)
    assert first.returncode == 0, first.stderr
    target = stored(downloads, sdists, SDISTS[1])
    asked = len(index.requests)
    quiet = make_upstream(tmp_path, index, downloads)  # stamps hold: nothing read again, nothing asked
    assert quiet.returncode == 0 and len(index.requests) == asked and "downloaded" not in quiet.stderr
    flip(target)
    corrupt = sha256(target)
    healed = make_upstream(tmp_path, index, downloads)
    assert healed.returncode == 0, healed.stderr
    (line,) = [line for line in healed.stderr.splitlines() if "corrupt cache entry" in line]
    assert line == (
        f"make_upstream: {target}: sha256 {corrupt[:16]}… is not the {target.parent.name[:16]}… recorded when it was "
        f"written: a corrupt cache entry, removed; downloading it again"
    )
    assert [name for name, _, _ in index.requests[asked:]] == [SDISTS[1]]
    assert sha256(target) == target.parent.name
    assert first.stdout == healed.stdout  # the same history: the same refs


def test_a_big_download_says_each_quarter_once_and_a_resumed_one_counts_from_where_it_resumed(tmp_path):
    """The download store's bar over loopback, its minimum lowered to 1 MB for a 4 MB file: a `download` line at each
    quarter; cut at half and resumed, each quarter still once (the resumed part counts from where it resumed); a
    file below the minimum, and the 4 MB one under the default minimum (64 MB), say only their one line at the end."""
    from carry.util import download

    data = bytes(range(250)) * 16_000  # 4.0 MB
    served = faultindex.Index({"big.bin": data, "cut.bin": data, "small.bin": data[:500_000]})
    served.faults["cut.bin"] = "cut-once"  # half of it, then the connection closes: resumed at half
    try:

        def fetched(name: str, payload: bytes, store: download.Store, size: int | None = None) -> list[str]:
            digest = hashlib.sha256(payload).hexdigest()
            pinned = download.Pinned.parse(f"{served.url}/files/{name}", digest, "test", size)
            with reporter.recording() as said:
                assert sha256(store.get(pinned)) == digest
            assert [line for line in said if line.startswith(f"download: downloaded {name} ")], said
            return [line for line in said if "% of " in line]

        lowered = download.Store(tmp_path / "downloads", bar_from=1_000_000)
        quarters = [f"download: {p}% of 4.0 MB big.bin" for p in (25, 50, 75, 100)]
        assert fetched("big.bin", data, lowered) == quarters  # the size from Content-Length
        resumed = fetched("cut.bin", data, lowered, size=len(data))  # the size from the pin
        assert resumed == [line.replace("big.bin", "cut.bin") for line in quarters]
        assert [(range_, status) for name, range_, status in served.requests if name == "cut.bin"] == [
            (None, 200),
            (f"bytes={len(data) // 2}-", 206),
        ]
        assert fetched("small.bin", data[:500_000], lowered) == []
        assert download.Store(tmp_path / "default").bar_from is None and reporter.BAR_FROM_BYTES == 64_000_000
        assert fetched("big.bin", data, download.Store(tmp_path / "default")) == []
    finally:
        served.close()


def test_a_full_download_store_names_the_file_and_the_rerun_after_freeing_succeeds(tmp_path, index, sdists):
    with tmpfs(tmp_path / "downloads", "16k") as downloads:
        full = make_upstream(tmp_path, index, downloads)
        assert full.returncode == 1, full.stderr
        part = stored(downloads, sdists, SDISTS[0]).with_name(f"{SDISTS[0]}.part")
        line = full.stderr.strip().splitlines()[-1]
        assert line.startswith(
            f"make_upstream: error: {part}: no space left on device: needs {len(sdists[SDISTS[0]]) / 1000:.1f} KB, "
        ) and line.endswith("free there; free some space (or point CARRY_CACHE / --out elsewhere) and run again")
        assert not part.exists() and not stored(downloads, sdists, SDISTS[0]).exists()
        resize(downloads, "1m")
        rerun = make_upstream(tmp_path, index, downloads)
        assert rerun.returncode == 0, rerun.stderr
        for name in SDISTS:
            assert sha256(stored(downloads, sdists, name)) == hashlib.sha256(sdists[name]).hexdigest()


# --- a full disk under the wheel's paths ---------------------------------------------------------------------------


def test_a_full_dist_publishes_nothing_and_the_rerun_after_freeing_publishes_the_cached_wheel(project, reference):
    with tmpfs(project.root / "dist", "8k") as dist:
        full = project.wheel(dist)
        assert full.code == 1, full.err
        line = error_line(full.err)
        size = project.cached().stat().st_size + (project.cached().parent / f"{WHEEL}.gate.txt").stat().st_size
        assert line.startswith(f"carry: error: {dist / WHEEL}: no space left on device: needs {size / 1000:.1f} KB, ")
        assert list(dist.iterdir()) == []  # neither the wheel, nor its report, nor a temp file
        assert integrity.check(project.cached()) is None  # the built wheel is in the cache, whole
        resize(dist, "1m")
        rerun = project.wheel(dist)
        assert rerun.code == 0 and "done: reused from cache" in rerun.err, rerun.err
        assert sha256(dist / WHEEL) == reference and sorted(p.name for p in dist.iterdir()) == [
            WHEEL,
            f"{WHEEL}.gate.txt",
        ]


def test_a_full_artifact_cache_stores_nothing_and_the_rerun_after_freeing_succeeds(project, reference):
    with tmpfs(project.cache / "artifacts", "8k") as artifacts:
        full = project.wheel(project.root / "dist")
        assert full.code == 1, full.err
        line = error_line(full.err)
        assert line.startswith(f"carry: error: {artifacts}/") and ": no space left on device: needs " in line
        assert list(artifacts.iterdir()) == [] and not (project.root / "dist").exists()
        resize(artifacts, "1m")
        rerun = project.wheel(project.root / "dist")
        assert rerun.code == 0 and rerun.err.strip().endswith("done: built"), rerun.err
        assert sha256(project.root / "dist" / WHEEL) == sha256(project.cached()) == reference


def test_a_full_cache_leaves_no_half_made_environment_and_the_rerun_succeeds(project, reference):
    with tmpfs(project.cache, "2m") as cache:
        full = project.wheel(project.root / "dist")
        assert full.code == 1, full.err
        line = error_line(full.err)
        assert line.startswith(f"carry: error: build environment: {cache}/envs/")
        assert ": no space left on device: needs more than the " in line and " written before it filled, " in line
        assert list((cache / "envs").iterdir()) == []  # no half-made environment
        assert not (cache / "artifacts").exists() and not (project.root / "dist").exists()
        resize(cache, "64m")
        rerun = project.wheel(project.root / "dist")
        assert rerun.code == 0, rerun.err
        assert sha256(project.root / "dist" / WHEEL) == reference


def test_a_full_scratch_dir_fails_the_build_in_one_line_and_the_rerun_succeeds(project, reference):
    with tmpfs(project.cache / "tmp", "16k") as scratch:
        full = project.wheel(project.root / "dist")
        assert full.code == 1, full.err
        line = error_line(full.err)
        assert line.startswith("carry: error: the upstream build: ") and ": no space left on device: " in line
        assert [p for p in scratch.iterdir()] == [] and not (project.cache / "artifacts").exists()
        resize(scratch, "16m")
        rerun = project.wheel(project.root / "dist")
        assert rerun.code == 0, rerun.err
        assert sha256(project.root / "dist" / WHEEL) == reference
