#!/usr/bin/env python3
"""Build a git repository of the real vLLM history from the pinned PyPI sdists of 0.32.0 and 0.33.0.

vLLM's own repository cannot be cloned everywhere carry is tested, but its releases are on PyPI with the whole
source. This script turns the two sdists pinned in releases.yaml into a small, real history:

    main              v0.32.0 ---------------- v0.33.0      (tags v0.32.0, v0.33.0; main at v0.33.0)
                             \\
    refs/pull/53899/head      PR                            a stand-in for the carried PR: adds
                                                            vllm/v1/ple_offload/ (our own small code)

Every commit is deterministic: a fixed author and committer, dates from the sdist itself (the mtime of its
PKG-INFO, i.e. when the release was built; the PR three days after 0.32.0), the files and modes (644 or 755)
of the tarball in sorted order, without what packaging adds to an sdist and git never tracks: the top-level
PKG-INFO, *.egg-info/ and the version file setuptools-scm writes (vllm/_version.py, in vLLM's .gitignore). Nothing
else is left out: an sdist holds exactly the tracked files (setuptools-scm's file finder), tracked files that match
a .gitignore pattern included. So the history is what vLLM's own git holds, the SHAs are the same on every machine
and can be pinned in a build.yaml.

The repository is written, bare, to $CARRY_CACHE/examples/vllm-upstream.git (default ~/.cache/carry), in one
rename, and examples/vllm/upstream.git links to it (git-ignored). A second run finds it up to date (a stamp
records the inputs) and only prints it.

    python examples/vllm/make_upstream.py                   build (or find) it; print the path and the SHAs
    python examples/vllm/make_upstream.py --json            the same as JSON
    python examples/vllm/make_upstream.py --check FILE      exit 1 when FILE's upstream.commit is none of
                                                            these commits (a stale pin), else print which
    python examples/vllm/make_upstream.py --no-link         leave examples/vllm/upstream.git alone (tests)

The sdists are taken from carry's download store, downloaded there first when missing (carry.source.releases.fetch).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from carry.source import releases  # noqa: E402
from carry.util import reporter  # noqa: E402
from carry.util.cache import Cache  # noqa: E402
from carry.util.errors import CarryError  # noqa: E402

RELEASES = HERE / "releases.yaml"
LINK = HERE / "upstream.git"
FORMAT = 2  # bump when the history this script writes changes
NAME = "vLLM releases (from PyPI)"
EMAIL = "releases@vllm-sdist.invalid"
PR_NUMBER = 53899
PR_DELAY_S = 3 * 86400
VERSIONS = ("0.32.0", "0.33.0")
PR_FILES = {
    "vllm/v1/ple_offload/__init__.py":
        '"""Stand-in for a PR branch: per-layer-embedding offload (carry\'s test data)."""\n',
    "vllm/v1/ple_offload/connector.py": '''\
"""Stand-in for the carried PR's connector, written for carry's tests: only this branch has the file."""


class Step:
    def __init__(self):
        self.ready = False


class PleOffloadConnector:
    """Hands each forward step the rows it needs; a dummy step only signals."""

    def __init__(self, layers):
        self.layers = layers
        self.steps = []

    def prepare_forward(self, dummy):
        step = Step()
        if dummy:
            step.ready = True
            return step
        self.steps.append(step)
        return self.launch(step)

    def launch(self, step):
        step.ready = True
        return step
''',
}
GIT_SETTINGS = ("-c", "core.autocrlf=false", "-c", "core.hooksPath=/dev/null", "-c", "init.defaultBranch=main",
                "-c", "pack.threads=1", "-c", "gc.auto=0")


@dataclasses.dataclass(frozen=True)
class Built:
    path: Path
    refs: dict[str, str]  # ref -> the commit it names

    def to_json(self) -> dict:
        return {"path": str(self.path), "refs": self.refs}

    def lines(self) -> list[str]:
        width = max(len(ref) for ref in self.refs)
        return [str(self.path), *(f"  {ref:<{width}}  {sha}" for ref, sha in self.refs.items())]


def target() -> Path:
    return Cache.from_env().root / "examples" / "vllm-upstream.git"


def git_env() -> dict[str, str]:
    """The machine's own git configuration shut out."""
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": os.devnull, "LC_ALL": "C", "TZ": "UTC",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


def git(repo: Path, *args: str, input: bytes | None = None) -> str:
    result = subprocess.run(["git", *GIT_SETTINGS, *args], cwd=repo, env=git_env(), input=input, capture_output=True)
    if result.returncode != 0:
        raise SystemExit(f"make_upstream: git {' '.join(args[:2])} failed: {result.stderr.decode().strip()}")
    return result.stdout.decode().strip()


def sdists(say) -> dict[str, Path]:
    """version -> the pinned sdist's local path (downloaded into the store when missing)."""
    names = [releases.find(RELEASES, version, "sdist").name for version in VERSIONS]
    with reporter.using(reporter.Relay(say)):
        return dict(zip(VERSIONS, releases.fetch(RELEASES, names)))


def inputs_key(paths: dict[str, Path]) -> str:
    """What the history is made of: this script's format, the sdists' pinned sha256, the PR stand-in's files."""
    pins = {release.version: release.pinned.sha256 for release in releases.load(RELEASES) if release.kind == "sdist"}
    data = {"format": FORMAT, "sdists": {v: pins[v] for v in paths}, "pr": [PR_NUMBER, PR_FILES]}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


VERSION_FILE = "vllm/_version.py"  # setup.py: get_version(write_to="vllm/_version.py"); .gitignore names it


def skipped(name: str) -> bool:
    """What packaging adds to an sdist and git does not track: PKG-INFO, the egg-info directory setuptools writes
    and setuptools-scm's version file. Nothing else (never a filter by .gitignore: tracked files match it too)."""
    parts = name.split("/")
    return parts == ["PKG-INFO"] or name == VERSION_FILE or any(part.endswith(".egg-info") for part in parts)


def sdist_files(path: Path) -> tuple[int, list[tuple[str, str, bytes]]]:
    """(the sdist's build time, [(path, git mode, bytes)] sorted by path) from the tarball."""
    files, when = [], None
    with tarfile.open(path) as archive:
        for member in archive:
            top, _, name = member.name.partition("/")
            if name == "PKG-INFO":
                when = int(member.mtime)
            if not member.isfile() or not name or skipped(name):
                continue
            mode = "100755" if member.mode & 0o111 else "100644"
            files.append((name, mode, archive.extractfile(member).read()))
    if when is None:
        raise SystemExit(f"make_upstream: {path.name} has no PKG-INFO; is it an sdist?")
    files.sort(key=lambda entry: entry[0])
    return when, files


def _data(payload: bytes) -> bytes:
    return b"data %d\n" % len(payload) + payload + b"\n"


def _commit(ref: str, mark: int, when: int, message: str, parent: int | None, files, full: bool) -> bytes:
    who = f"{NAME} <{EMAIL}> {when} +0000"
    out = [f"commit {ref}\nmark :{mark}\nauthor {who}\ncommitter {who}\n".encode(), _data(message.encode())]
    if parent is not None:
        out.append(f"from :{parent}\n".encode())
    if full:
        out.append(b"deleteall\n")
    for name, mode, payload in files:
        out.append(f"M {mode} inline {name}\n".encode() + _data(payload))
    return b"".join(out)


def _tag(name: str, mark: int, when: int, message: str) -> bytes:
    head = f"tag {name}\nfrom :{mark}\ntagger {NAME} <{EMAIL}> {when} +0000\n".encode()
    return head + _data(message.encode())


def stream(paths: dict[str, Path]):
    """The fast-import stream of the whole history, one commit or tag at a time."""
    dates = {}
    for index, version in enumerate(VERSIONS, start=1):
        when, files = sdist_files(paths[version])
        message = (f"vLLM {version}\n\nThe files of the PyPI sdist {paths[version].name}, without PKG-INFO, "
                   f"*.egg-info and {VERSION_FILE}.\n")
        yield _commit("refs/heads/main", index, when, message, index - 1 if index > 1 else None, files, full=True)
        yield _tag(f"v{version}", index, when, f"vLLM {version}\n")
        dates[version] = when
    pr_files = [(name, "100644", text.encode()) for name, text in sorted(PR_FILES.items())]
    message = ("[PR stand-in] Add per-layer-embedding offload\n\nA stand-in for the carried PR's branch, for "
               "carry's tests: it adds files that only this branch has.\n")
    yield _commit(f"refs/pull/{PR_NUMBER}/head", len(VERSIONS) + 1, dates[VERSIONS[0]] + PR_DELAY_S, message, 1,
                  pr_files, full=False)
    yield b"done\n"


def fast_import(repo: Path, paths: dict[str, Path]) -> None:
    process = subprocess.Popen(["git", *GIT_SETTINGS, "fast-import", "--quiet", "--done"], cwd=repo, env=git_env(),
                               stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for chunk in stream(paths):
            process.stdin.write(chunk)
        process.stdin.close()
    except BrokenPipeError:
        pass
    error = process.stderr.read().decode().strip()
    if process.wait() != 0:
        raise SystemExit(f"make_upstream: git fast-import failed: {error}")


def read_refs(repo: Path) -> dict[str, str]:
    wanted = [*(f"refs/tags/v{v}" for v in VERSIONS), "refs/heads/main", f"refs/pull/{PR_NUMBER}/head"]
    return {ref: git(repo, "rev-parse", f"{ref}^{{commit}}") for ref in wanted}


def stamp(repo: Path) -> Path:
    return repo / "carry-make-upstream.json"


def current(repo: Path, key: str) -> Built | None:
    """The repository already built from these inputs, or None."""
    try:
        data = json.loads(stamp(repo).read_text())
    except (OSError, ValueError):
        return None
    if data.get("inputs") != key:
        return None
    return Built(repo, data["refs"])


def build(say=lambda line: None, make_link: bool = True) -> Built:
    repo = target()
    paths = sdists(say)
    key = inputs_key(paths)
    found = current(repo, key)
    if found is None:
        repo.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{repo.name}.", dir=repo.parent))
        try:
            git(staging, "init", "-q", "--bare", ".")
            fast_import(staging, paths)
            git(staging, "symbolic-ref", "HEAD", "refs/heads/main")
            refs = read_refs(staging)
            stamp(staging).write_text(json.dumps({"inputs": key, "refs": refs}, indent=2) + "\n")
            if repo.exists():
                shutil.rmtree(repo, ignore_errors=True)
            try:
                os.replace(staging, repo)
            except OSError:
                if current(repo, key) is None:  # another run got there first with the same inputs: keep it
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        found = Built(repo, refs)
        say(f"built {repo}")
    if make_link:
        link()
    return found


def link() -> None:
    """examples/vllm/upstream.git -> the repository in the cache."""
    if LINK.is_symlink() and os.readlink(LINK) == str(target()):
        return
    if LINK.is_symlink() or LINK.is_file():
        LINK.unlink()
    elif LINK.exists():
        raise SystemExit(f"make_upstream: {LINK} is a directory; move it away")
    LINK.symlink_to(target())


def check(config: Path, built: Built) -> int:
    """0 when the build.yaml pins one of the built commits, else 1."""
    try:
        text = config.read_text()
    except OSError as exc:
        print(f"make_upstream: {config}: cannot read it ({exc.strerror})", file=sys.stderr)
        return 2
    match = re.search(r"^\s+commit:\s*['\"]?([0-9a-f]{40})", text, re.MULTILINE)
    if match is None:
        print(f"make_upstream: {config}: no upstream.commit found", file=sys.stderr)
        return 2
    pin = match.group(1)
    names = [ref for ref, sha in built.refs.items() if sha == pin]
    if not names:
        print(f"make_upstream: {config}: upstream.commit {pin} is stale: it is none of "
              f"{', '.join(f'{ref} {sha[:12]}' for ref, sha in built.refs.items())}", file=sys.stderr)
        return 1
    print(f"{config}: upstream.commit {pin} is {', '.join(names)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the path and refs as JSON")
    parser.add_argument("--check", type=Path, metavar="BUILD_YAML", help="exit 1 when its upstream.commit is stale")
    parser.add_argument("--no-link", action="store_true", help=f"do not point {LINK.name} at the repository")
    args = parser.parse_args(argv)
    try:
        built = build(lambda line: print(f"make_upstream: {line}", file=sys.stderr, flush=True), not args.no_link)
    except CarryError as exc:
        print(f"make_upstream: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.check is not None:
        return check(args.check, built)
    print(json.dumps(built.to_json(), indent=2) if args.json else "\n".join(built.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
