"""The carried PR's own state: open, closed (not merged) or merged, with the merge commit, and where that was learned.

First from GitHub's REST API (github.com upstreams, or any at `$CARRY_GITHUB_API`), with `$GITHUB_TOKEN` or
`$GH_TOKEN` in a request header (never in argv, a log or the output); else from git: `refs/pull/N/head` is merged when
upstream.main contains it or has its whole change as one patch-id (squash); git cannot tell open from closed.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

from carry.config import Config
from carry.config.reader import public_url
from carry.source import git, upstream
from carry.util import reporter
from carry.util.cache import Cache
from carry.util.errors import BadInput

API_DEFAULT = "https://api.github.com"
API_ENV = "CARRY_GITHUB_API"
TOKEN_ENVS = ("GITHUB_TOKEN", "GH_TOKEN")
TIMEOUT_S = 10
GITHUB_URL_RE = re.compile(
    r"^(?:https://|ssh://git@|git://)github\.com/([^/\s]+)/([^/\s]+?)(?:\.git)?/?$"
    r"|^git@github\.com:([^/\s]+)/([^/\s]+?)(?:\.git)?/?$"
)
DAY_S = 86400


class State(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"  # closed without being merged
    MERGED = "merged"
    UNMERGED = "not merged"  # from git: not in main, open or closed cannot be told
    UNKNOWN = "unknown"


@dataclasses.dataclass(frozen=True)
class PrState:
    number: int
    state: State
    source: str  # "github" or "git"
    where: str  # the API URL asked, or what git compared
    merge_commit: str | None = None
    detail: str = ""

    def describe(self) -> str:
        words = {State.CLOSED: "closed without being merged", State.MERGED: "merged"}.get(self.state, self.state.value)
        merged = f" as {self.merge_commit[:12]}" if self.merge_commit else ""
        source = "the GitHub API" if self.source == "github" else "git"
        detail = f"; {self.detail}" if self.detail else ""
        return f"PR #{self.number}: {words}{merged} (from {source}: {self.where}){detail}"

    def to_json(self) -> dict:
        return {
            "number": self.number,
            "state": self.state.value,
            "merged": self.state is State.MERGED,
            "merge_commit": self.merge_commit,
            "source": self.source,
            "where": self.where,
            "detail": self.detail,
        }


def github_repo(url: str, forced: bool) -> tuple[str, str] | None:
    """(owner, repo) of a github.com upstream URL; with a custom API any URL's last two path parts."""
    match = GITHUB_URL_RE.match(url.strip())
    if match:
        owner, name = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
        return owner, name
    if not forced:
        return None
    parts = [p for p in re.split(r"[/:]", url.strip().rstrip("/")) if p]
    if len(parts) < 2:
        return None
    return parts[-2], parts[-1].removesuffix(".git")


def find(config: Config, cache: Cache, mirror: Path, resolve: Callable[[str], str]) -> PrState | None:
    """The PR's state, from the API where it answers, else from git (with a note why); None without upstream.pr."""
    number = config.upstream.pr
    if number is None:
        return None
    answer, why = from_github(config.upstream.url, number)
    if answer is not None:
        return answer
    if why:
        reporter.note(why)
    return from_git(config, cache, mirror, resolve)


def from_github(url: str, number: int) -> tuple[PrState | None, str]:
    """The PR's state from the API; else None and why not ("": no API is asked for this upstream)."""
    base = os.environ.get(API_ENV, "").strip().rstrip("/")
    repo = github_repo(url, forced=bool(base))
    if repo is None:
        return None, ""
    api = f"{base or API_DEFAULT}/repos/{repo[0]}/{repo[1]}/pulls/{number}"
    shown = public_url(api)
    import urllib.error
    import urllib.request

    headers = {"Accept": "application/vnd.github+json", "User-Agent": "carry", "X-GitHub-Api-Version": "2022-11-28"}
    token = next((os.environ[name] for name in TOKEN_ENVS if os.environ.get(name)), None)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(api, headers=headers), timeout=TIMEOUT_S) as response:
            data = json.loads(response.read().decode())
    except urllib.error.HTTPError as exc:
        return None, f"the GitHub API answered {exc.code} {exc.reason} for {shown}; the PR state is from git"
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return None, f"the GitHub API {shown} could not be reached ({reason}); the PR state is from git"
    except ValueError:
        return None, f"the GitHub API {shown} did not answer JSON; the PR state is from git"
    return _from_answer(number, data, shown)


def _from_answer(number: int, data: object, shown: str) -> tuple[PrState | None, str]:
    if not isinstance(data, dict) or data.get("state") not in ("open", "closed"):
        return None, f"the GitHub API {shown} answered no PR state; the PR state is from git"
    merged = bool(data.get("merged")) or bool(data.get("merged_at"))
    if merged:
        when = f"merged at {data['merged_at']}" if data.get("merged_at") else ""
        return PrState(number, State.MERGED, "github", shown, data.get("merge_commit_sha") or None, when), ""
    if data["state"] == "closed":
        when = f"closed at {data['closed_at']}" if data.get("closed_at") else ""
        return PrState(number, State.CLOSED, "github", shown, None, when), ""
    return PrState(number, State.OPEN, "github", shown), ""


def from_git(config: Config, cache: Cache, mirror: Path, resolve: Callable[[str], str]) -> PrState:
    """Merged when main contains the PR head or its whole change; else git cannot tell open from closed."""
    number, pr_ref, main = config.upstream.pr, config.upstream.pr_ref, config.upstream.main
    if number is None or pr_ref is None:
        raise BadInput(f"{config.path}: upstream.pr is not set: there is no PR whose state git could tell")
    where = f"{pr_ref} against {main}"
    try:
        head, main_commit = resolve(pr_ref), resolve(main)
    except Exception as exc:  # BadInput or GitError: a ref upstream cannot give
        return PrState(number, State.UNKNOWN, "git", where, detail=str(exc))
    merge_base, unknown = upstream.merge_base(config, cache, mirror, head, main_commit)
    if unknown:
        reporter.note(unknown)
    if merge_base == head:
        detail = f"its head {head[:12]} is in {main}"
        return PrState(number, State.MERGED, "git", where, _merge_commit(mirror, head, main_commit), detail)
    if merge_base is None:
        return PrState(number, State.UNKNOWN, "git", where, detail="its head and main share no fetched history")
    squash = _same_change(mirror, merge_base, head, main_commit)
    if squash is not None:
        detail = f"{squash[:12]} on {main} has the PR's whole change (same patch-id)"
        return PrState(number, State.MERGED, "git", where, squash, detail)
    unmerged = f"its head {head[:12]} is not in {main} and no commit there has its change"
    return PrState(
        number, State.UNMERGED, "git", where, detail=f"{unmerged}; git cannot tell an open PR from a closed one"
    )


def _merge_commit(mirror: Path, head: str, main: str) -> str:
    """The first commit on main's first-parent line that contains the head; the head itself when it is on it."""
    line = git.run(mirror, "rev-list", "--first-parent", "--ancestry-path", "--reverse", f"{head}..{main}").split()
    if not line:
        return head
    first = line[0]
    parent = git.resolve(mirror, f"{first}^1")
    return head if parent and git.is_ancestor(mirror, head, parent) else first


def _same_change(mirror: Path, merge_base: str, head: str, main: str) -> str | None:
    """A commit on main since the PR head's date whose patch-id is that of the PR's whole diff."""
    diff = git.run(mirror, "diff", "--full-index", "--no-color", merge_base, head, strip=False)
    if not diff.strip():
        return None
    files = git.run(mirror, "diff", "--name-only", merge_base, head).split("\n")
    wanted = git.patch_id(mirror, diff)
    if wanted is None:
        return None
    since = int(git.run(mirror, "show", "-s", "--format=%ct", head)) - DAY_S
    return git.commit_with_patch_id(mirror, wanted, f"--max-age={since}", main, "--not", merge_base, "--", *files)
