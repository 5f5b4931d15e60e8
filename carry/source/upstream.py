"""The upstream mirror: fetch the pinned commit (and the PR head), keep a bundle, fall back to it offline."""

from __future__ import annotations

import enum
import os
from pathlib import Path

import yaml

from carry.config import SHA_RE, Config
from carry.config.reader import public_url
from carry.source import git
from carry.util.cache import Cache
from carry.util.errors import BadInput, Failed
from carry.util.record import record

PIN_REF = "refs/carry/pin"
BUNDLE_REF = "refs/carry/bundle/"  # + a commit: the ref a bundle of that commit is made from, and names
FIRST_PR_DEPTH = 1  # the PR head is usually the pin: then nothing more is fetched; else deepen x4
MAX_PR_DEPTH = 4096
FIRST_HISTORY_DEPTH = 64  # more history when the base and a ref must meet (why a patched file is gone); then x4
MAX_HISTORY_DEPTH = 16384


@record
class PrHead:
    sha: str
    ahead: int | None
    pin_is_ancestor: bool
    searched: int

    def describe(self, pin: str) -> str | None:
        """A warning when the PR head is not the pin, else None."""
        if self.sha == pin:
            return None
        if self.pin_is_ancestor:
            return (
                f"PR head {self.sha[:12]} is {self.ahead} commit(s) ahead of the pin {pin[:12]}; "
                f"run `fetch --update-pin` to move the pin"
            )
        return (
            f"PR head {self.sha[:12]} does not contain the pin {pin[:12]} (searched {self.searched} commits): "
            f"force-push detected; the pin survives only in the cache, review before `fetch --update-pin`"
        )


class Source(enum.Enum):
    """Where the pinned commit came from in one `fetch`."""

    UPSTREAM = "upstream"  # fetched now
    MIRROR = "mirror"  # already in the cache mirror; upstream not asked for it
    BUNDLE = "bundle"  # restored from the cached bundle, upstream could not give it


@record
class FetchReport:
    base: str
    mirror: Path
    source: Source
    pr_head: PrHead | None = None


def mirror_for(config: Config, cache: Cache) -> Path:
    cache.ensure_writable()
    mirror = cache.mirror(config.upstream.url)
    if not (mirror / "HEAD").exists():
        git.init_bare(mirror)
    return mirror


def fetch(config: Config, cache: Cache, with_pr: bool = True) -> FetchReport:
    """Fetch the pin (and the PR head), else fall back to the cached bundle, either said in a note; when nothing can be
    fetched and the mirror was new, everything this call created is removed again."""
    mirror = cache.mirror(config.upstream.url)
    lock = cache.lock_path(mirror.name)
    created = [p for p in (cache.root, mirror.parent, lock.parent, mirror, lock) if not p.exists()]
    try:
        return _fetch(config, cache, mirror_for(config, cache), with_pr)
    except BadInput:
        from carry.util.fsutil import remove

        for path in reversed(created):
            remove(path)
        raise


def _fetch(config: Config, cache: Cache, mirror: Path, with_pr: bool) -> FetchReport:
    pin = config.upstream.commit
    pr_wanted = with_pr and config.upstream.pr is not None
    pr_head = None
    with cache.lock(mirror.name):
        git.clear_stale_locks(mirror)
        source, error = _fetch_pin(config, mirror)
        if error is None:
            write_bundle(mirror, cache, pin, verify=True)
            if pr_wanted:
                try:
                    pr_head = _fetch_pr_head(config, mirror)
                except git.GitError as exc:
                    _note(_pr_unchecked(config, source, exc))
        else:
            note = _restore_from_bundle(config, cache, mirror, error)
            _note(f"{note}; the PR head was not checked" if pr_wanted else note)
    return FetchReport(base=pin, mirror=mirror, source=source, pr_head=pr_head)


def _note(line: str) -> None:
    """A note of the fallbacks (upstream unreachable, the cache used instead), said as it happens."""
    from carry.util import reporter  # here: `check` and `version` load it only when they have something to say

    reporter.note(line)


def _pr_unchecked(config: Config, source: Source, error: git.GitError) -> str:
    """One line for a PR head that could not be fetched; the pin is fine either way."""
    url, ref = public_url(config.upstream.url), config.upstream.pr_ref
    if source is Source.MIRROR:
        return (
            f"upstream {url} could not be reached ({_reason(error)}); the pin "
            f"{config.upstream.commit[:12]} comes from the cache mirror and the PR head ({ref}) was not checked"
        )
    return f"upstream {url} did not give {ref} ({_reason(error)}); the PR head was not checked"


def ensure_base(config: Config, cache: Cache) -> Path:
    """The mirror holding the pinned commit, fetching only when it is not there yet (a fallback said in a note)."""
    mirror = cache.mirror(config.upstream.url)
    if (mirror / "HEAD").exists() and (
        _pinned(mirror) == config.upstream.commit or git.has_commit(mirror, config.upstream.commit)
    ):
        cache.ensure_writable()
        return mirror
    return fetch(config, cache, with_pr=False).mirror


def _pinned(mirror: Path) -> str | None:
    """What refs/carry/pin names, read from its file (set only once the mirror has that commit); None if packed."""
    try:
        return (mirror / PIN_REF).read_text().strip()
    except OSError:
        return None


def resolve_ref(config: Config, cache: Cache, ref: str) -> str:
    """The commit an upstream ref names now (a tag before a branch of a short name, as git does; a full name; a commit
    SHA), fetched unless the mirror has its tip; offline, the ref as last fetched is used and a note says so."""
    mirror = mirror_for(config, cache)
    if SHA_RE.match(ref):
        return _resolve_sha(config, cache, mirror, ref)
    names = candidates(ref)
    with cache.lock(mirror.name):
        git.clear_stale_locks(mirror)
        try:
            found = git.ls_remote(mirror, config.upstream.url, *names)
            name = next((n for n in names if n in found), None)
            if name is None:
                raise BadInput(
                    f"unknown ref {ref!r}: upstream {public_url(config.upstream.url)} has no "
                    f"{' or '.join(names)}; check the ref name (a tag, a branch, refs/..., or a full commit SHA)"
                )
            local = local_ref(name)
            if git.resolve(mirror, found[name]) is None:
                _fetch_ref(config, mirror, f"+{name}:{local}")
            else:
                git.update_ref(mirror, local, found[name])
        except git.GitError as exc:
            known = next(((n, c) for n in names if (c := git.resolve(mirror, local_ref(n)))), None)
            if known is None:
                raise BadInput(
                    f"unknown ref {ref!r}: upstream {public_url(config.upstream.url)} cannot give it "
                    f"({_reason(exc)}); check the ref name or the network"
                ) from None
            _note(f"upstream unreachable ({_reason(exc)}); using the cached {known[0]} {known[1][:12]}")
            return known[1]
    return _fetched(mirror, local)


def _fetched(mirror: Path, local: str) -> str:
    """The commit of a ref just fetched or updated into the mirror; one that names none is a failed fetch."""
    if (commit := git.resolve(mirror, local)) is None:
        raise Failed(f"{local} names no commit in {mirror} after the fetch; run the command again")
    return commit


def candidates(ref: str) -> tuple[str, ...]:
    """The full ref names a name given by a user may mean, in git's order (refs/tags/ before refs/heads/)."""
    return (ref,) if ref.startswith("refs/") else (f"refs/tags/{ref}", f"refs/heads/{ref}")


def local_ref(name: str) -> str:
    """Where the mirror keeps upstream's `name`: refs/carry/upstream/tags/v0.33.0, .../heads/main, .../pull/7/head."""
    return f"refs/carry/upstream/{name.removeprefix('refs/')}"


def _resolve_sha(config: Config, cache: Cache, mirror: Path, sha: str) -> str:
    if git.has_commit(mirror, sha):
        return sha
    with cache.lock(mirror.name):
        git.clear_stale_locks(mirror)
        try:
            _fetch_ref(config, mirror, sha)
        except git.GitError as exc:
            raise BadInput(
                f"unknown ref {sha!r}: upstream {public_url(config.upstream.url)} cannot give that commit "
                f"({_reason(exc)}); check the SHA or the network"
            ) from None
    if not git.has_commit(mirror, sha):
        raise BadInput(f"unknown ref {sha!r}: upstream sent no such commit; check the SHA")
    return sha


def _fetch_ref(config: Config, mirror: Path, refspec: str) -> None:
    """Fetch one ref into the mirror; in a shallow mirror only the history newer than the pinned base, or just the
    tip when the ref is older than that (git then selects no commit for the shallow request)."""
    since = _since_base(config, mirror)
    try:
        git.fetch(mirror, config.upstream.url, refspec, extra=since)
    except git.GitError:
        if not since:
            raise
        git.fetch(mirror, config.upstream.url, refspec, depth=1)


def merge_base(config: Config, cache: Cache, mirror: Path, base: str, commit: str) -> tuple[str | None, str]:
    """The merge base of the pinned base and `commit`, deepening a shallow mirror's history of both (x4, up to
    MAX_HISTORY_DEPTH) until they meet, and ""; else None and why (one line, for the caller to say as a note)."""
    found = git.merge_base(mirror, base, commit)
    if found or not git.shallow_commits(mirror):
        return found, ""
    depth = FIRST_HISTORY_DEPTH
    with cache.lock(mirror.name):
        git.clear_stale_locks(mirror)
        if git.settle_shallow(mirror):
            found = git.merge_base(mirror, base, commit)
        while found is None:
            try:
                git.fetch(mirror, config.upstream.url, base, commit, extra=(f"--deepen={depth}",))
            except git.GitError as exc:
                return None, (
                    f"upstream {public_url(config.upstream.url)} gave no more history of {base[:12]} and "
                    f"{commit[:12]} ({_reason(exc)}); their merge base is not known"
                )
            git.settle_shallow(mirror)
            found = git.merge_base(mirror, base, commit)
            if found is None and (depth >= MAX_HISTORY_DEPTH or not git.shallow_commits(mirror)):
                return (
                    None,
                    f"{base[:12]} and {commit[:12]} share no commit in the {depth} commits of history before each",
                )
            depth *= 4
    return found, ""


def first_parents(config: Config, cache: Cache, mirror: Path, start: str, count: int) -> tuple[str, ...]:
    """Up to `count` commits of `start`'s first-parent history, `start` first; a shallow mirror whose history ends
    sooner is deepened by what is missing (upstream unreachable: what the mirror has)."""
    for _ in range(3):
        found = git.rev_list(mirror, "--first-parent", f"--max-count={count}", start)
        if len(found) >= count or not found or found[-1] not in git.shallow_commits(mirror):
            break
        with cache.lock(mirror.name):
            git.clear_stale_locks(mirror)
            if not git.settle_shallow(mirror):
                try:
                    git.fetch(mirror, config.upstream.url, start, extra=(f"--deepen={count - len(found) + 1}",))
                except git.GitError:
                    break
                git.settle_shallow(mirror)
    return tuple(found)


def update_pin(config: Config, new_commit: str) -> None:
    """Rewrite only `upstream.commit` in build.yaml, keeping comments and layout; every move of the pin goes through
    here (`fetch --update-pin`, `refresh`, `drop`), and the callers bump VERSION (a new pin is a new artifact)."""
    from carry.util.fsutil import atomic_write_text  # here, not on `check`'s path: only a moved pin writes

    text = config.path.read_text()
    node = yaml.compose(text)
    for key, value in node.value:
        if key.value == "upstream":
            for sub_key, sub_value in value.value:
                if sub_key.value == "commit":
                    start, end = sub_value.start_mark.index, sub_value.end_mark.index
                    quote = text[start] if text[start] in "'\"" else ("'" if new_commit.isdigit() else "")
                    atomic_write_text(config.path, f"{text[:start]}{quote}{new_commit}{quote}{text[end:]}")
                    return
    raise BadInput(f"{config.path}: upstream.commit not found; add it")


def _fetch_pin(config: Config, mirror: Path) -> tuple[Source, git.GitError | None]:
    """Fetch the pinned commit shallowly unless the mirror has it; the error when upstream can't give it."""
    pin = config.upstream.commit
    source = Source.MIRROR
    try:
        if not git.has_commit(mirror, pin):
            source = Source.UPSTREAM
            git.fetch(mirror, config.upstream.url, pin, depth=1)
        if not git.has_commit(mirror, pin):
            return Source.BUNDLE, git.GitError(f"upstream did not send commit {pin}")
    except git.GitError as exc:
        return Source.BUNDLE, exc
    git.update_ref(mirror, PIN_REF, pin)
    return source, None


def _fetch_pr_head(config: Config, mirror: Path) -> PrHead:
    """Fetch `refs/pull/N/head`, deepening until the pin is found or history ends."""
    local = f"refs/carry/upstream/pull/{config.upstream.pr}/head"
    pin = config.upstream.commit
    depth = FIRST_PR_DEPTH
    while True:
        git.fetch(mirror, config.upstream.url, f"+{config.upstream.pr_ref}:{local}", depth=depth)
        head = _fetched(mirror, local)
        history = git.rev_list(mirror, f"--max-count={depth}", head)
        if pin in history:
            return PrHead(head, history.index(pin), True, len(history))
        reached_boundary = bool(git.shallow_commits(mirror) & set(history)) or len(history) >= depth
        if not reached_boundary or depth >= MAX_PR_DEPTH:
            return PrHead(head, None, False, len(history))
        depth *= 4


def write_bundle(mirror: Path, cache: Cache, commit: str, *, verify: bool = False) -> Path:
    """The cached bundle of `commit` with its sha256 beside it, made once from the mirror (from a ref of its own: two
    pins share the mirror) through a temp file and a rename; one that cannot serve `commit` is made again, said."""
    from carry.util import integrity, reporter  # here: `check` and `version` never hash a bundle

    bundle = cache.bundle(commit)
    with cache.lock(f"bundle-{commit}"):
        problem = _bundle_problem(mirror, bundle, commit, verify) if bundle.exists() else None
        if bundle.exists() and problem is None:
            return bundle
        if problem is not None:
            reporter.note(problem)
        integrity.discard(bundle)
        bundle.parent.mkdir(parents=True, exist_ok=True)
        ref = BUNDLE_REF + commit
        git.update_ref(mirror, ref, commit)
        tmp = bundle.with_name(f".{bundle.name}.{os.getpid()}.tmp")
        try:
            git.run(mirror, "bundle", "create", str(tmp), ref)
            sha256 = integrity.file_sha256(tmp)
            os.replace(tmp, bundle)
            integrity.seal(bundle, sha256)
        finally:
            tmp.unlink(missing_ok=True)
    return bundle


def _bundle_problem(mirror: Path, bundle: Path, commit: str, verify: bool) -> str | None:
    """Why a cached bundle cannot serve `commit` (heads, no sha256 recorded, with `verify` that sha256), or None."""
    from carry.util import integrity  # here: `check` and `version` never hash a bundle

    again = "made again from the mirror"
    try:
        heads = git.bundle_heads(mirror, bundle)
    except git.GitError:
        heads = {}
    if commit not in heads.values():
        return f"{bundle}: does not hold commit {commit[:12]}; {again}"
    if integrity.recorded(bundle) is None:
        return f"{bundle}: no sha256 recorded beside it (an older carry's); {again}"
    corrupt = integrity.check(bundle) if verify else None
    return corrupt.line(f"removed; {again}") if corrupt is not None else None


def copy_bundle(mirror: Path, cache: Cache, commit: str, dest_dir: Path) -> Path:
    """The bundle of `commit` copied into `dest_dir` with its sha256 (a build context), hashed as it is copied: a
    corrupt one is removed, said (a `context` line), and made again from the mirror."""
    from carry.util import integrity, reporter  # here: `check` and `version` never hash a bundle

    dest_dir.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        bundle = write_bundle(mirror, cache, commit)
        dest = dest_dir / bundle.name
        dest.unlink(missing_ok=True)
        if (corrupt := integrity.copy_checked(bundle, dest)) is None:
            import shutil

            shutil.copyfile(integrity.seal_path(bundle), integrity.seal_path(dest))
            return dest
        reporter.phase("context", corrupt.line("removed; made again from the mirror"))
        integrity.discard(bundle)
    raise Failed(f"{cache.bundle(commit)}: corrupt again right after it was made; check the disk")


def _restore_from_bundle(config: Config, cache: Cache, mirror: Path, error: git.GitError) -> str:
    from carry.util import integrity  # here: `check` and `version` never hash a bundle

    pin = config.upstream.commit
    bundle = cache.bundle(pin)
    if not bundle.exists() and git.has_commit(mirror, pin):
        git.update_ref(mirror, PIN_REF, pin)
        return (
            f"upstream {public_url(config.upstream.url)} unreachable ({_reason(error)}); "
            f"using the cached mirror {mirror}"
        )
    if not bundle.exists():
        raise BadInput(
            f"upstream {public_url(config.upstream.url)} cannot give commit {pin[:12]} ({_reason(error)}) "
            f"and no bundle is cached at {bundle}; fetch once while online or check upstream.url"
        )
    if not git.has_commit(mirror, pin):
        # A bundle of an older carry has no sha256 beside it: git checks its pack's own checksum as it fetches.
        if (corrupt := integrity.check(bundle) if integrity.recorded(bundle) else None) is not None:
            raise BadInput(corrupt.line("refused; delete it and fetch while online"))
        head = next((name for name, sha in git.bundle_heads(mirror, bundle).items() if sha == pin), None)
        if head is None:
            raise BadInput(f"{bundle}: does not hold commit {pin[:12]}; delete it and fetch while online")
        git.add_shallow(mirror, pin)
        git.fetch(mirror, str(bundle), f"{head}:{PIN_REF}")
    git.update_ref(mirror, PIN_REF, pin)
    return f"upstream {public_url(config.upstream.url)} unreachable ({_reason(error)}); using cached bundle {bundle}"


def _since_base(config: Config, mirror: Path) -> tuple[str, ...]:
    """Keep a ref fetch small in a shallow mirror: only history newer than the pinned base."""
    if not git.shallow_commits(mirror) or not git.has_commit(mirror, config.upstream.commit):
        return ()
    timestamp = int(git.run(mirror, "show", "-s", "--format=%ct", config.upstream.commit))
    return (f"--shallow-since={timestamp - 86400}",)


# What git adds after every failed remote access, true or not ("... and the repository exists."): never the reason.
GIT_BOILERPLATE = ("Please make sure you have the correct access rights", "and the repository exists.")


def _reason(error: git.GitError) -> str:
    """The line of git's stderr that says why: the first fatal, error or ssh line (not git's closing advice)."""
    lines = [line.strip() for line in (error.stderr or str(error)).splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith(GIT_BOILERPLATE)] or [str(error)]
    found = next((line for line in lines if line.startswith(("fatal:", "error:", "ssh:"))), lines[-1])
    return found.removeprefix("fatal: ").removeprefix("error: ").strip()
