"""Small functions around git, each one `git` process run with an argument list (never a shell) and SAFE_ENV over
the caller's environment: only https, ssh, git and file transports, no terminal prompts, no system config, and
carry's own identity for the commits it makes (refresh).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from carry.util.errors import Failed

# Only these transports may ever be used, whatever a URL or a config says.
SAFE_ENV = {
    "GIT_ALLOW_PROTOCOL": "https:ssh:git:file",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "carry",
    "GIT_AUTHOR_EMAIL": "carry@localhost",
    "GIT_COMMITTER_NAME": "carry",
    "GIT_COMMITTER_EMAIL": "carry@localhost",
}
NETWORK_TIMEOUT_S = 600
LOCAL_TIMEOUT_S = 3600  # a local git command (log -p of a long history, a repack): never forever
# Answers git's `get` with the user and password carry keeps in the environment (see split_credentials).
CREDENTIAL_HELPER = (
    '!f() { test "$1" = get && printf "username=%s\\npassword=%s\\n" "$CARRY_GIT_USERNAME" "$CARRY_GIT_PASSWORD"; }; f'
)


class GitError(Failed):
    """A git command failed; `stderr` holds what git said."""

    def __init__(self, message: str, stderr: str = ""):
        super().__init__(message)
        self.stderr = stderr


def run(
    repo: Path, *args: str, env: dict[str, str] | None = None, timeout: float | None = None, strip: bool = True
) -> str:
    """Run `git args...` in `repo` and return stdout; raise GitError with git's stderr on failure."""
    status, out, err = _execute(repo, args, env, timeout, strip)
    if status != 0:
        reason = "timed out" if status is None else f"exit status {status}"
        raise GitError(f"git {args[0]} failed: {_headline(err) or reason}", err.strip())
    return out


def run_input(repo: Path, args: tuple[str, ...], text: str) -> str:
    """Run `git args...` with `text` on its stdin; stdout, or GitError."""
    status, out, err = _execute(repo, args, None, None, True, text.encode("utf-8", errors="surrogateescape"))
    if status != 0:
        raise GitError(f"git {args[0]} failed: {_headline(err) or f'exit status {status}'}", err.strip())
    return out


def subject(repo: Path, commit: str) -> str:
    """The first line of `commit`'s message."""
    return run(repo, "show", "-s", "--format=%s", commit)


def patch_id(repo: Path, diff: str) -> str | None:
    """`git patch-id --stable` of a diff's text; None when it changes nothing."""
    found = run_input(repo, ("patch-id", "--stable"), diff).split()
    return found[0] if found else None


def commit_with_patch_id(repo: Path, wanted: str, *log_args: str) -> str | None:
    """The newest commit that `git log -p --no-merges <log_args>` shows whose change has patch-id `wanted`."""
    log = run(
        repo, "log", "-p", "--no-merges", "--no-color", "--full-index", "--format=commit %H", *log_args, strip=False
    )
    rows = (line.split() for line in run_input(repo, ("patch-id", "--stable"), log).splitlines())
    return next((fields[1] for fields in rows if fields and fields[0] == wanted), None)


def _execute(
    repo: Path,
    args: tuple[str, ...],
    env: dict[str, str] | None,
    timeout: float | None,
    strip: bool,
    data: bytes | None = None,
) -> tuple[int | None, str, str]:
    """(exit status, stdout, stderr) of one git run in `repo`, messages in English (carry reads some); status None past
    `timeout` (default LOCAL_TIMEOUT_S; git and its children killed); `strip` drops stdout's one trailing newline."""
    import subprocess  # here: `check` of a series already checked on its base starts no git at all

    from carry.util.run import execute

    full_env = {**os.environ, **SAFE_ENV, **(env or {})}
    try:
        done = execute(
            ["git", *args],
            timeout=LOCAL_TIMEOUT_S if timeout is None else timeout,
            cwd=repo,
            env=full_env,
            stdin=data,
            english=True,  # git's messages (apply's "Hunk #1 succeeded at ...", "error: patch failed: ...") are parsed
        )
    except OSError as exc:  # no git on PATH, or `repo` is gone
        return 127, "", str(exc)
    except subprocess.TimeoutExpired as exc:
        return None, _text(exc.output or b""), _text(exc.stderr or b"")
    text = _text(done.stdout)
    if strip and text.endswith("\n"):
        text = text[:-1]
    return done.returncode, text, _text(done.stderr)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="surrogateescape")


def _headline(stderr: str) -> str:
    """The line of git's stderr that says what went wrong: the first fatal/error line, else the last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return next((line for line in lines if line.startswith(("fatal:", "error:"))), lines[-1] if lines else "")


def run_status(repo: Path, *args: str, env: dict[str, str] | None = None, strip: bool = True) -> tuple[int, str, str]:
    """Run git and return (exit status, stdout, stderr) without raising."""
    status, out, err = _execute(repo, args, env, None, strip)
    return (-1 if status is None else status), out, err


def init_bare(path: Path) -> None:
    """Create a bare repo at `path` in one rename (a crash never leaves a half-made one); another process's stays."""
    import shutil
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        run(staging, "init", "--quiet", "--bare", ".")
        run(staging, "config", "gc.auto", "0")
        if path.exists() and not (path / "HEAD").exists():
            shutil.rmtree(path)
        try:
            os.replace(staging, path)
        except OSError:
            if not (path / "HEAD").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def clear_stale_locks(repo: Path) -> None:
    """Remove the lock files a killed git leaves behind (ref, shallow, packed-refs, config locks); only under
    carry's own lock on `repo`, so that no live git of ours can own them."""
    for lock in [*repo.glob("*.lock"), *(repo / "refs").rglob("*.lock")]:
        lock.unlink(missing_ok=True)


def has_commit(repo: Path, sha: str) -> bool:
    return run_status(repo, "cat-file", "-e", f"{sha}^{{commit}}")[0] == 0


def object_exists(repo: Path, sha: str) -> bool:
    return run_status(repo, "cat-file", "-e", sha)[0] == 0


def resolve(repo: Path, ref: str) -> str | None:
    """The commit `ref` names in `repo`, or None."""
    status, out, _ = run_status(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
    return out.strip() if status == 0 else None


def update_ref(repo: Path, ref: str, sha: str) -> None:
    run(repo, "update-ref", ref, sha)


def rev_list(repo: Path, *args: str) -> list[str]:
    return run(repo, "rev-list", *args).split()


def shallow_commits(repo: Path) -> set[str]:
    shallow = repo / run(repo, "rev-parse", "--git-path", "shallow")  # an absolute path stays as git names it
    return set(shallow.read_text().split()) if shallow.exists() else set()


def add_shallow(repo: Path, sha: str) -> None:
    """Mark `sha` as a shallow boundary, so objects without its parents are accepted."""
    shallow = repo / "shallow"
    current = shallow.read_text().split() if shallow.exists() else []
    if sha not in current:
        shallow.write_text("".join(f"{c}\n" for c in [*current, sha]))


def changed_paths(repo: Path, commit: str, tree: str, globs: tuple[str, ...]) -> list[str]:
    """The paths matching `globs` that differ between `commit`'s tree and `tree` (tree ids compared: no checkout)."""
    pathspecs = [f":(glob){glob}" for glob in globs]
    out = run(repo, "diff", "--name-only", "--no-renames", f"{commit}^{{tree}}", tree, "--", *pathspecs)
    return [line for line in out.splitlines() if line]


def settle_shallow(repo: Path) -> bool:
    """Unmark the shallow boundaries whose parents a later fetch brought (git keeps them marked, and then takes them
    for roots: a pin fetched at depth 1 whose parent came with main has no merge base with it, and no --deepen
    changes that). True when one was unmarked. The caller holds the repository's lock."""
    shallow = shallow_commits(repo)
    settled = set()
    for sha in shallow:
        header = run(repo, "cat-file", "commit", sha).split("\n\n", 1)[0]
        parents = [line.split()[1] for line in header.splitlines() if line.startswith("parent ")]
        if parents and all(has_commit(repo, parent) for parent in parents):
            settled.add(sha)
    if not settled:
        return False
    path = repo / run(repo, "rev-parse", "--git-path", "shallow")
    remaining = sorted(shallow - settled)
    if remaining:
        path.write_text("".join(f"{sha}\n" for sha in remaining))
    else:
        path.unlink()
    return True


def fetch(repo: Path, url: str, *refspecs: str, depth: int | None = None, extra: tuple[str, ...] = ()) -> str:
    args = ["fetch", "--no-tags", "--no-write-fetch-head", "--quiet", *extra]
    if depth is not None:
        args.append(f"--depth={depth}")
    bare, env = split_credentials(url)
    return run(repo, *args, "--end-of-options", bare, *refspecs, env=env, timeout=NETWORK_TIMEOUT_S)


def ls_remote(repo: Path, url: str, *names: str) -> dict[str, str]:
    """name -> object id for each of the full ref `names` upstream has (an annotated tag's own id, not peeled)."""
    bare, env = split_credentials(url)
    out = run(repo, "ls-remote", "--refs", "--end-of-options", bare, *names, env=env, timeout=NETWORK_TIMEOUT_S)
    pairs = (line.partition("\t") for line in out.splitlines())
    return {name: sha for sha, _, name in pairs if name in names}


def ls_remote_tags(repo: Path, url: str) -> dict[str, str]:
    """tag name (without refs/tags/) -> the commit it names (annotated tags peeled), as upstream lists them."""
    bare, env = split_credentials(url)
    out = run(repo, "ls-remote", "--tags", "--end-of-options", bare, env=env, timeout=NETWORK_TIMEOUT_S)
    found: dict[str, str] = {}
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        name = name.removeprefix("refs/tags/")
        if name.endswith("^{}"):
            found[name[:-3]] = sha
        else:
            found.setdefault(name, sha)
    return found


def local_tags(repo: Path, prefix: str) -> dict[str, str]:
    """name (without `prefix`) -> commit for the tags `repo` keeps under `prefix` (annotated tags peeled)."""
    out = run(repo, "for-each-ref", "--format=%(objectname) %(*objectname) %(refname)", prefix)
    rows = [line.split() for line in out.splitlines()]
    return {parts[-1].removeprefix(prefix): parts[1] if len(parts) == 3 else parts[0] for parts in rows}


def merge_base(repo: Path, a: str, b: str) -> str | None:
    """The best common ancestor of `a` and `b` as far as the (maybe shallow) history in `repo` goes, or None."""
    status, out, _ = run_status(repo, "merge-base", "--end-of-options", a, b)
    return out.strip() if status == 0 and out.strip() else None


def is_ancestor(repo: Path, a: str, b: str) -> bool:
    return run_status(repo, "merge-base", "--is-ancestor", "--end-of-options", a, b)[0] == 0


def split_credentials(url: str) -> tuple[str, dict[str, str]]:
    """The URL git may show on its command line, and the env that hands it the URL's user:password instead:
    in a URL they would be in every process listing; a credential helper reads them from its own environment."""
    if "@" not in url:
        return url, {}
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url, {}
    user, _, host = parts.netloc.rpartition("@")
    name, _, password = user.partition(":")
    keep_name = parts.scheme.lower() == "ssh" and name  # an ssh login name is an address, not a secret
    bare = urllib.parse.urlunsplit(parts._replace(netloc=f"{name}@{host}" if keep_name else host))
    return bare, {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "credential.helper",
        "GIT_CONFIG_VALUE_0": CREDENTIAL_HELPER,
        "CARRY_GIT_USERNAME": urllib.parse.unquote(name),
        "CARRY_GIT_PASSWORD": urllib.parse.unquote(password),
    }


def bundle_heads(repo: Path, bundle: Path) -> dict[str, str]:
    """ref -> sha for every head in a bundle file."""
    pairs = (line.partition(" ") for line in run(repo, "bundle", "list-heads", str(bundle)).splitlines())
    return {ref: sha for sha, _, ref in pairs}


@contextlib.contextmanager
def temp_index(repo: Path, scratch: Path) -> Iterator[dict[str, str]]:
    """An env that points git at a private index file under `scratch`, removed afterwards."""
    scratch.mkdir(parents=True, exist_ok=True)
    index = scratch / f"index-{os.getpid()}-{id(scratch)}"
    try:
        yield {"GIT_INDEX_FILE": str(index)}
    finally:
        for path in (index, Path(f"{index}.lock")):
            with contextlib.suppress(OSError):
                path.unlink()


def read_tree(repo: Path, treeish: str, env: dict[str, str]) -> None:
    """Load `treeish` into the index in `env`. For a commit SHA the index is kept in the repo (carry/index/<sha>, the
    last INDEX_KEEP of them), so the next read is a file copy: a vLLM tree (9,600 files) takes 20 ms to read."""
    index = Path(env["GIT_INDEX_FILE"])
    kept = repo / "carry" / "index" / treeish
    if len(treeish) == 40 and kept.is_file():
        with contextlib.suppress(OSError):
            index.write_bytes(kept.read_bytes())
            return
    run(repo, "read-tree", treeish, env=env)
    if len(treeish) == 40 and all(c in "0123456789abcdef" for c in treeish):
        _keep_index(index, kept)


INDEX_KEEP = 8


def _keep_index(index: Path, kept: Path) -> None:
    """Copy a freshly read index into the repo's store through a temp file and a rename; drop the oldest ones."""
    with contextlib.suppress(OSError):  # only a cache: the next read reads the tree again
        kept.parent.mkdir(parents=True, exist_ok=True)
        tmp = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
        tmp.write_bytes(index.read_bytes())
        os.replace(tmp, kept)
        stored = sorted(
            (p for p in kept.parent.iterdir() if not p.name.startswith(".")), key=lambda p: p.stat().st_mtime
        )
        for old in stored[:-INDEX_KEEP]:
            old.unlink(missing_ok=True)


def write_tree(repo: Path, env: dict[str, str]) -> str:
    return run(repo, "write-tree", env=env)


def apply_cached(repo: Path, patch: Path, env: dict[str, str], *flags: str) -> tuple[int, str]:
    """`git apply --cached -v` into the index in `env`; return (status, git's verbose report)."""
    return apply_cached_all(repo, [patch], env, *flags)


def apply_cached_all(repo: Path, patches: list[Path], env: dict[str, str], *flags: str) -> tuple[int, str]:
    """Every patch in one `git apply --cached -v`, each on top of the ones before it; all or nothing."""
    status, out, err = run_status(repo, "apply", "--cached", "-v", *flags, *(str(p) for p in patches), env=env)
    return status, f"{out}\n{err}".strip()


def show_blob(repo: Path, spec: str, env: dict[str, str] | None = None) -> str | None:
    status, out, _ = run_status(repo, "cat-file", "blob", spec, env=env, strip=False)
    return out if status == 0 else None


# A fixed identity and date: the commit carry makes of a patched tree has the same id for the same tree and base.
TREE_COMMIT_ENV = {"GIT_AUTHOR_DATE": "1970-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "1970-01-01T00:00:00Z"}


def tree_commit(repo: Path, tree: str, parent: str | None) -> str:
    """The commit checkout_tree checks `tree` out as on `parent` (none: a root commit); the same for the same inputs."""
    parents = ("-p", parent) if parent else ()
    return run(repo, "commit-tree", tree, *parents, "-m", f"carry: patched tree {tree}", env=TREE_COMMIT_ENV)


def checkout_tree(repo: Path, tree: str, parent: str | None, worktree: Path, keep: tuple[str, ...] = ()) -> list[str]:
    """Make `worktree` a git worktree of `repo` holding exactly `tree` on `parent` (a real worktree: setuptools-scm
    lists the package files with `git ls-files`): only changed files are rewritten (incremental builds and compiler
    caches stay warm), and everything untracked but paths matching `keep` is removed. Returns what was removed."""
    commit = tree_commit(repo, tree, parent)
    if not (worktree / ".git").is_file():
        if worktree.exists():
            import shutil

            shutil.rmtree(worktree)
        run_status(repo, "worktree", "prune")
        worktree.parent.mkdir(parents=True, exist_ok=True)
        run(repo, "worktree", "add", "--detach", "--force", "--quiet", str(worktree), commit)
        return []
    gitdir = Path((worktree / ".git").read_text().split("gitdir:", 1)[-1].strip())
    for lock in gitdir.glob("*.lock"):
        lock.unlink(missing_ok=True)  # the caller holds carry's build lock: a killed git left it
    run(worktree, "checkout", "--detach", "--force", "--quiet", commit)
    excludes = [arg for glob in keep for arg in ("-e", "/" + glob.strip("/"))]
    out = run(worktree, "clean", "-ffdx", *excludes)
    return [line.removeprefix("Removing ").strip() for line in out.splitlines() if line.startswith("Removing ")]


def ignored_in_tree(repo: Path, tree: str, paths: list[str]) -> set[str]:
    """Which of `paths` the .gitignore files of `tree` exclude (`git check-ignore --no-index`, which reads them
    from a work tree: a scratch one holding only those files); the machine's own excludes are not asked."""
    import tempfile

    if not paths:
        return set()
    listed = run(repo, "ls-tree", "-r", "-z", "--name-only", "--full-tree", tree, strip=False).split("\0")
    names = [name for name in listed if name == ".gitignore" or name.endswith("/.gitignore")]
    with tempfile.TemporaryDirectory(prefix="carry-ignore-") as scratch:
        for name in names:
            target = Path(scratch) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(run(repo, "show", f"{tree}:{name}", strip=False).encode("utf-8", "surrogateescape"))
        args: tuple[str, ...] = ("--git-dir", str(repo.absolute()), "--work-tree", scratch)
        args += ("-c", "core.excludesFile=/dev/null", "check-ignore", "--no-index", "--stdin", "-z")
        status, out, err = _execute(
            Path(scratch), args, {"GIT_CONFIG_GLOBAL": os.devnull}, None, False, "\0".join(paths).encode() + b"\0"
        )
    if status not in (0, 1):
        raise GitError(f"git check-ignore failed: {_headline(err) or f'exit status {status}'}", err.strip())
    return {name for name in out.split("\0") if name}


def entries(repo: Path, tree: str, paths: tuple[str, ...]) -> dict[str, str]:
    """Of `paths` (relative to the root of `tree`), those `tree` holds: path -> object id (a tree for a directory, a
    blob for a file); a path it lacks is left out. One `git cat-file --batch-check` for all of them."""
    if not paths:
        return {}
    out = run_input(
        repo, ("cat-file", "--batch-check=%(objectname) %(objecttype)"), "".join(f"{tree}:{p}\n" for p in paths)
    )
    found = ((path, line.split()) for path, line in zip(paths, out.splitlines()))
    return {path: fields[0] for path, fields in found if len(fields) == 2 and fields[1] in ("tree", "blob")}


def export(repo: Path, tree: str, paths: tuple[str, ...], dest: Path) -> None:
    """The files of `paths` in `tree` written under `dest` (git archive: no worktree, no index, no checkout touched)."""
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / ".carry-export.tar"
    try:
        run(repo, "archive", "--format=tar", "-o", str(archive.absolute()), tree, "--", *paths)
        with tarfile.open(archive) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, filter="data")
            else:  # Python < 3.10.12: git's own archive of a tree, no links out of it
                tar.extractall(dest)  # noqa: S202
    finally:
        archive.unlink(missing_ok=True)
