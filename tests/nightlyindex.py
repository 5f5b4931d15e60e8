"""A faithful replica of vLLM's per-commit wheel index, for `carry pin`'s tests and bench.

- `extend`: the real vLLM history (examples/vllm/make_upstream.py: the 0.32.0 and 0.33.0 sdists as git) grown on
  main with cheap commits made with git's plumbing: Python-only ones, one that changes csrc/, and PR branches.
- `reversion`: vLLM 0.33.0's released wheel made the nightly of a commit (`0.33.1.devN+g<9 hex>[.variant]`), the
  .dist-info renamed and METADATA and RECORD rewritten, every other member copied as its compressed bytes.
- `publish`: one commit's wheels laid out by the rules of vLLM's .buildkite/scripts/generate-nightly-index.py: the
  wheels at `{root}/{C}/`, per variant a project list, `{project}/index.html` (PEP 503, relative links with '+'
  quoted as %2B, no hashes) and `{project}/metadata.json`; the default variant (no suffix) at `{root}/{C}/`.
- `Server`: that tree served on loopback by http.server, with faults to order: a 404, a body cut short, an HTML
  page where the index should be.
"""

from __future__ import annotations

import email.parser
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import urllib.parse
import zipfile
from pathlib import Path

from carry.binaries import wheelzip

IDENTITY = {
    "GIT_AUTHOR_NAME": "vLLM main (carry's replica)",
    "GIT_AUTHOR_EMAIL": "main@vllm-replica.invalid",
    "GIT_COMMITTER_NAME": "vLLM main (carry's replica)",
    "GIT_COMMITTER_EMAIL": "main@vllm-replica.invalid",
}
PAGE = (
    '<!DOCTYPE html>\n<html>\n  <meta name="pypi:repository-version" content="1.0">\n  <body>\n{items}\n'
    "  </body>\n</html>\n"
)
WHEEL_RE = re.compile(
    r"^(?P<project>.+?)-(?P<version>[^-]+?)(-(?P<build>[^-]+))?-(?P<python>[^-]+)-(?P<abi>[^-]+)-(?P<platform>[^-]+)\.whl$"
)


# --- the history ----------------------------------------------------------------------------------------------


def git(repo: Path, *args: str, input: bytes | None = None, env: dict | None = None) -> str:
    result = subprocess.run(
        ["git", *args],
        cwd=repo,
        input=input,
        capture_output=True,
        env={**os.environ, **IDENTITY, **(env or {})},
        check=True,
    )
    return result.stdout.decode().strip()


def commit(repo: Path, parent: str, message: str, files: dict[str, bytes], when: int) -> str:
    """A commit on `parent` with `files` (path -> new content) changed, made in a private index."""
    with tempfile.TemporaryDirectory(prefix="carry-replica-") as scratch:
        env = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        git(repo, "read-tree", parent, env=env)
        for path, content in files.items():
            blob = git(repo, "hash-object", "-w", "--stdin", input=content)
            git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{path}", env=env)
        tree = git(repo, "write-tree", env=env)
    dates = {"GIT_AUTHOR_DATE": f"{when} +0000", "GIT_COMMITTER_DATE": f"{when} +0000"}
    return git(repo, "commit-tree", tree, "-p", parent, "-m", message, env=dates)


def appended(repo: Path, commit_sha: str, path: str, line: str) -> bytes:
    """`path` at `commit_sha` with `line` added at its end."""
    return git(repo, "show", f"{commit_sha}:{path}").encode() + f"\n{line}\n".encode()


def grow(repo: Path, sha: dict[str, str], pr: int) -> None:
    """main grown from v0.33.0 (`sha` names v0.33.0; the new commits are added to it): A1, A2 (Python-only),
    K (csrc/), A3 (Python-only); a PR commit off each of A1, A2, A3 (P1, P2, P3); refs/pull/`pr`/head at P2."""
    when = int(git(repo, "show", "-s", "--format=%ct", sha["v0.33.0"])) + 86400

    def on(parent: str, name: str, message: str, path: str, line: str) -> None:
        files = {path: appended(repo, sha[parent], path, line)}
        sha[name] = commit(repo, sha[parent], message, files, when + len(sha) * 3600)

    on("v0.33.0", "A1", "logger: a comment (Python only)", "vllm/logger.py", "# replica: A1")
    on("A1", "A2", "envs: a comment (Python only)", "vllm/envs.py", "# replica: A2")
    on("A2", "K", "activation kernels: a comment (csrc/)", "csrc/activation_kernels.cu", "// replica: K")
    on("K", "A3", "logger: another comment (Python only)", "vllm/logger.py", "# replica: A3")
    for base, name in (("A1", "P1"), ("A2", "P2"), ("A3", "P3")):
        note = {"vllm/carry_pr_note.py": f"NOTE = 'a Python-only PR on {base}'\n".encode()}
        sha[name] = commit(repo, sha[base], f"[PR stand-in] a Python-only change on {base}", note, when + 20 * 3600)
    git(repo, "update-ref", "refs/heads/main", sha["A3"])
    git(repo, "update-ref", f"refs/pull/{pr}/head", sha["P2"])


def nightly_block(variable: str, variant: str | None = "cu130") -> str:
    """build.precompiled.nightly reading the index's root from $`variable`."""
    lines = [
        "    # Where `carry pin` finds the wheels: vLLM's per-commit index, its root from the environment.",
        "    nightly:",
        f"      index: ${{{variable}}}",
        *([f"      variant: {variant}"] if variant else []),
    ]
    return "\n".join(lines) + "\n"


def make_project(example: Path, root: Path, repo: Path, pin: str, pr: int, nightly: str) -> Path:
    """examples/vllm (`example`) copied to `root` onto `repo` at `pin` (PR `pr`), its pins replaced by `nightly`."""
    shutil.copytree(example, root, ignore=shutil.ignore_patterns("upstream.git", "__pycache__"))
    config = root / "build.yaml"
    text = config.read_text().replace("  url: upstream.git", f"  url: {repo}\n  pr: {pr}")
    text = re.sub(r"  commit: [0-9a-f]{40}[^\n]*", f"  commit: {pin}", text)
    text, count = re.subn(r"    # The wheels by name.*?\n(?=\nimage:)", nightly, text, flags=re.S)
    assert count == 1
    config.write_text(text)
    return config


# --- the wheels -----------------------------------------------------------------------------------------------


def nightly_version(base: str, distance: int, commit_sha: str, variant: str | None) -> str:
    """The version vLLM's setuptools-scm gives a main commit: `0.33.1.dev3+g1a2b3c4d5`, `.cu130` for a variant."""
    return f"{base}.dev{distance}+g{commit_sha[:9]}" + (f".{variant}" if variant else "")


def reversion(src: Path, dest_dir: Path, version: str, extra: dict[str, bytes] | None = None) -> Path:
    """`src` as the wheel of `version`: file name, .dist-info, METADATA's Version and RECORD; every other member's
    compressed bytes copied (`extra`: members added, e.g. to make a re-upload of other bytes)."""
    match = WHEEL_RE.match(src.name)
    assert match, src.name
    project, old = match.group("project"), match.group("version")
    dest = dest_dir / src.name.replace(f"-{old}-", f"-{version}-", 1)
    with zipfile.ZipFile(src) as archive:
        info = wheelzip.dist_info(archive)
        metadata = archive.read(f"{info}/METADATA").decode()
    assert f"\nVersion: {old}\n" in metadata
    new_info = f"{project}-{version}.dist-info"
    changes: dict[str, bytes | None] = {
        f"{new_info}/METADATA": metadata.replace(f"\nVersion: {old}\n", f"\nVersion: {version}\n", 1).encode(),
        **(extra or {}),
    }
    dest_dir.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    wheelzip.rewrite(src, part, changes, dist_info_as=new_info)
    os.replace(part, dest)
    return dest


def reuploaded(src: Path, dest_dir: Path) -> Path:
    """`src` uploaded again under its name with other bytes, as a re-signing or rebuilding tool leaves it: the same
    members, a zip comment added (a copy of the file and a new end record)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / src.name
    shutil.copyfile(src, dest)
    with zipfile.ZipFile(dest, "a") as archive:
        archive.comment = b"uploaded again"
    return dest


def wheel_version(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(f"{wheelzip.dist_info(archive)}/METADATA").decode()
    return str(email.parser.Parser().parsestr(text, headersonly=True)["Version"])


# --- the index ------------------------------------------------------------------------------------------------


def _parse(filename: str) -> dict:
    """What the index records of a wheel file name; the variant read from the version as vLLM's script does (after
    a `dev` part: its last dotted segment; else after '+')."""
    match = WHEEL_RE.match(filename)
    assert match, filename
    version, variant = match.group("version"), None
    if "dev" in version:
        after = version.split("dev")[-1]
        if "." in after:
            variant = after.split(".")[-1]
            version = version.removesuffix("." + variant)
    elif "+" in version:
        version, variant = version.split("+", 1)
    return {
        "package_name": match.group("project"),
        "version": version,
        "build_tag": match.group("build"),
        "python_tag": match.group("python"),
        "abi_tag": match.group("abi"),
        "platform_tag": match.group("platform"),
        "variant": variant,
        "filename": filename,
    }


def _links(names: list[str]) -> str:
    return PAGE.format(items="\n".join(f'    <a href="{name}/">{name}/</a><br/>' for name in sorted(names)))


def publish(root: Path, commit_sha: str, wheels: list[Path]) -> Path:
    """`commit_sha`'s wheels and indexes under `root`, laid out as vLLM's per-commit index is."""
    base = root / commit_sha
    base.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        if not (base / wheel.name).exists():
            try:
                os.link(wheel, base / wheel.name)
            except OSError:  # another filesystem
                shutil.copyfile(wheel, base / wheel.name)
    by_variant: dict[str, list[dict]] = {}
    for name in sorted(p.name for p in base.glob("*.whl")):
        info = _parse(name)
        by_variant.setdefault(info["variant"] or "default", []).append(info)
    listed: set[str] = set()
    for variant, infos in by_variant.items():
        folder = base if variant == "default" else base / variant
        packages = sorted({info["package_name"] for info in infos})
        if variant == "default":
            listed |= set(packages)
        else:
            listed.add(variant)
            folder.mkdir(exist_ok=True)
            (folder / "index.html").write_text(_links(packages))
        for package in packages:
            own = [info for info in infos if info["package_name"] == package]
            (folder / package).mkdir(exist_ok=True)
            up = "../" * len((folder / package).relative_to(base).parts)
            items, metadata = [], []
            for info in sorted(own, key=lambda i: i["filename"]):
                path = urllib.parse.quote(f"{up}{info['filename']}", safe=":%/")
                items.append(f'    <a href="{path}">{info["filename"]}</a><br/>')
                metadata.append({**info, "path": path})
            (folder / package / "index.html").write_text(PAGE.format(items="\n".join(items)))
            (folder / package / "metadata.json").write_text(json.dumps(metadata, indent=2))
    (base / "index.html").write_text(_links(sorted(listed)))
    return base


# --- the server -----------------------------------------------------------------------------------------------

SIGN_IN = (
    b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body><form>Sign in to continue</form></body></html>\n"
)


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def copyfile(self, source, outputfile):  # zero-copy, as a CDN serves: the client's side is what is measured
        link = self.server.link  # type: ignore[attr-defined]
        if link is None:
            self.connection.sendfile(source)
            return
        offset = 0
        while sent := self.connection.sendfile(source, offset, link.CHUNK):
            offset += sent
            link.take(sent)

    def do_GET(self):  # noqa: N802 (http.server's name)
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        fault = self.server.fault(path)  # type: ignore[attr-defined]
        if isinstance(fault, Path):  # other bytes under the same name: a re-upload
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(fault.stat().st_size))
            self.end_headers()
            with open(fault, "rb") as handle:
                self.copyfile(handle, self.wfile)
        elif fault == "404":
            self.send_error(404)
        elif fault == "html":
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(SIGN_IN)))
            self.end_headers()
            self.wfile.write(SIGN_IN)
        elif fault == "truncate":
            target = Path(self.translate_path(self.path))
            size = target.stat().st_size
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            with open(target, "rb") as handle:
                self.wfile.write(handle.read(size // 3))
            self.close_connection = True
        else:
            super().do_GET()


class Link:
    """A client's network link of `rate` bytes a second, shared by every connection (a token bucket)."""

    CHUNK = 1 << 20

    def __init__(self, rate: float):
        self.rate = rate
        self._lock = threading.Lock()
        self._free_at = 0.0  # when the link has sent everything asked of it so far

    def take(self, size: int) -> None:
        import time

        with self._lock:
            now = time.monotonic()
            self._free_at = max(self._free_at, now) + size / self.rate
            wait = self._free_at - now
        if wait > 0:
            time.sleep(wait)


class Server(http.server.ThreadingHTTPServer):
    """The replica on 127.0.0.1 (a free port): `url`; `faults` maps a URL path (or a prefix ending in '*') to
    '404', 'truncate', 'html', or a file served in its place; `rate` (bytes a second) paces every file sent, as a
    client's link would, shared by all connections (None: as fast as loopback goes)."""

    daemon_threads = True

    def __init__(self, root: Path, rate: float | None = None):
        self.root = root
        self.faults: dict[str, str | Path] = {}
        self.link = Link(rate) if rate else None
        super().__init__(("127.0.0.1", 0), lambda *a, **k: _Handler(*a, directory=str(root), **k))
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def fault(self, path: str) -> str | Path | None:
        if path in self.faults:
            return self.faults[path]
        return next(
            (kind for key, kind in self.faults.items() if key.endswith("*") and path.startswith(key[:-1])), None
        )

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
