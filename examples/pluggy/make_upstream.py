#!/usr/bin/env python3
"""Build a git repository of pluggy's history from its pinned PyPI sdists: 1.5.0 (setup.cfg metadata) and 1.6.0
(pyproject.toml [project]), a real small upstream for README's "Carry your own patch" (tests/test_readme_example.py).

    main    1.5.0 ------ 1.6.0          (tags 1.5.0 and 1.6.0, annotated, as pluggy tags its releases)

Each commit holds the files of one sdist, with their modes, in sorted order, without what packaging adds to an
sdist and git never tracks: the top-level PKG-INFO, *.egg-info/ and the version file setuptools-scm writes
(src/pluggy/_version.py, which pluggy's .gitignore names). Nothing else is left out. Authors, committers and dates
are fixed (the date is the mtime of the sdist's PKG-INFO: when the release was built), so the SHAs are the same on
every machine.

The repository is written, bare, to $CARRY_CACHE/examples/pluggy-upstream.git (default ~/.cache/carry) in one
rename; a second run finds it up to date (a stamp records the inputs) and only prints it.

    python examples/pluggy/make_upstream.py           build (or find) it; print the path and the tags' SHAs
    python examples/pluggy/make_upstream.py --json    the same as JSON

The sdists come from carry's download store, downloaded there first when missing (carry.source.releases.fetch).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
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
FORMAT = 1  # bump when the history this script writes changes
VERSIONS = ("1.5.0", "1.6.0")
VERSION_FILE = "src/pluggy/_version.py"  # setuptools-scm's write_to / version_file; in pluggy's .gitignore
NAME = "pluggy releases (from PyPI)"
EMAIL = "releases@pluggy-sdist.invalid"
GIT_SETTINGS = ("-c", "core.autocrlf=false", "-c", "core.hooksPath=/dev/null", "-c", "init.defaultBranch=main",
                "-c", "pack.threads=1", "-c", "gc.auto=0")


def target() -> Path:
    return Cache.from_env().root / "examples" / "pluggy-upstream.git"


def git_env() -> dict[str, str]:
    """The machine's own git configuration shut out."""
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": os.devnull, "LC_ALL": "C", "TZ": "UTC",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


def git(repo: Path, *args: str, input: bytes | None = None) -> str:
    result = subprocess.run(["git", *GIT_SETTINGS, *args], cwd=repo, env=git_env(), input=input, capture_output=True)
    if result.returncode != 0:
        raise SystemExit(f"make_upstream: git {' '.join(args[:2])} failed: {result.stderr.decode().strip()}")
    return result.stdout.decode().strip()


def skipped(name: str) -> bool:
    """What packaging adds to an sdist and git does not track; nothing else (never a filter by .gitignore)."""
    parts = name.split("/")
    return parts == ["PKG-INFO"] or name == VERSION_FILE or any(part.endswith(".egg-info") for part in parts)


def sdist_files(path: Path) -> tuple[int, list[tuple[str, str, bytes]]]:
    """(the sdist's build time, [(path, git mode, bytes)] sorted by path)."""
    files, when = [], None
    with tarfile.open(path) as archive:
        for member in archive:
            _, _, name = member.name.partition("/")
            if name == "PKG-INFO":
                when = int(member.mtime)
            if not member.isfile() or not name or skipped(name):
                continue
            mode = "100755" if member.mode & 0o111 else "100644"
            files.append((name, mode, archive.extractfile(member).read()))
    if when is None:
        raise SystemExit(f"make_upstream: {path.name} has no PKG-INFO; is it an sdist?")
    return when, sorted(files, key=lambda entry: entry[0])


def _data(payload: bytes) -> bytes:
    return b"data %d\n" % len(payload) + payload + b"\n"


def stream(paths: dict[str, Path]):
    """The fast-import stream: one commit and one annotated tag per release, each release's files replacing all."""
    for mark, version in enumerate(VERSIONS, start=1):
        when, files = sdist_files(paths[version])
        who = f"{NAME} <{EMAIL}> {when} +0000"
        message = (f"pluggy {version}\n\nThe files of the PyPI sdist {paths[version].name}, without PKG-INFO, "
                   f"*.egg-info and {VERSION_FILE}.\n")
        yield f"commit refs/heads/main\nmark :{mark}\nauthor {who}\ncommitter {who}\n".encode() + _data(message.encode())
        if mark > 1:
            yield f"from :{mark - 1}\n".encode()
        yield b"deleteall\n"
        for name, mode, payload in files:
            yield f"M {mode} inline {name}\n".encode() + _data(payload)
        yield f"tag {version}\nfrom :{mark}\ntagger {who}\n".encode() + _data(f"pluggy {version}\n".encode())
    yield b"done\n"


def build(say=lambda line: None) -> tuple[Path, dict[str, str]]:
    """The repository (built when missing or stale) and ref -> commit."""
    repo = target()
    with reporter.using(reporter.Relay(say)):
        paths = dict(zip(VERSIONS, releases.fetch(RELEASES, [f"pluggy-{v}.tar.gz" for v in VERSIONS])))
    pins = {r.version: r.pinned.sha256 for r in releases.load(RELEASES)}
    key = hashlib.sha256(json.dumps({"format": FORMAT, "sdists": pins}, sort_keys=True).encode()).hexdigest()
    stamp = repo / "carry-make-upstream.json"
    try:
        data = json.loads(stamp.read_text())
        if data.get("inputs") == key:
            return repo, data["refs"]
    except (OSError, ValueError):
        pass
    repo.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{repo.name}.", dir=repo.parent))
    try:
        git(staging, "init", "-q", "--bare", ".")
        process = subprocess.Popen(["git", *GIT_SETTINGS, "fast-import", "--quiet", "--done"], cwd=staging,
                                   env=git_env(), stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        for chunk in stream(paths):
            process.stdin.write(chunk)
        process.stdin.close()
        error = process.stderr.read().decode().strip()
        if process.wait() != 0:
            raise SystemExit(f"make_upstream: git fast-import failed: {error}")
        git(staging, "symbolic-ref", "HEAD", "refs/heads/main")
        refs = {ref: git(staging, "rev-parse", f"{ref}^{{commit}}")
                for ref in (*(f"refs/tags/{v}" for v in VERSIONS), "refs/heads/main")}
        (staging / stamp.name).write_text(json.dumps({"inputs": key, "refs": refs}, indent=2) + "\n")
        if repo.exists():
            shutil.rmtree(repo, ignore_errors=True)
        try:
            os.replace(staging, repo)
        except OSError:  # another run got there first with the same inputs: keep it
            if json.loads(stamp.read_text()).get("inputs") != key:
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    say(f"built {repo}")
    return repo, refs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the path and refs as JSON")
    args = parser.parse_args(argv)
    try:
        repo, refs = build(lambda line: print(f"make_upstream: {line}", file=sys.stderr, flush=True))
    except CarryError as exc:
        print(f"make_upstream: error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        print(json.dumps({"path": str(repo), "refs": refs}, indent=2))
    else:
        print("\n".join([str(repo), *(f"  {ref:<16}  {sha}" for ref, sha in refs.items())]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
