"""`follow [REF]`: take the project from its pin to a newer upstream REF on a branch of its own, one commit per step,
and write what happened as the pull request's body (carry/verdicts/followreport.py). The steps are the commands' own
(carry/verdicts/, carry/wheelbuild/pins.py, and `lock`, `wheel`, `suite`, `test` as a maintainer runs them).

1. REF: the argument, else `upstream.follow`. REF is the pin: one line, exit 0, no branch. REF older than the pin,
   unknown, or a work tree with uncommitted changes: bad input, nothing made.
2. A worktree on `carry/follow/<REF>`, made again from HEAD on every run; the current work tree is not touched.
3. `status` against REF; every droppable patch dropped, one commit each (verdict and evidence in it and DROPPED.md).
4. The rest rebased onto REF (carry/verdicts/rebase.py). A conflict stops here (exit 1); `follow --continue` records
   the resolution under patches/resolutions/ and goes on. Then the pins and VERSION: one commit; the lock: one.
5. Each platform's fixed wheel built, `suite` against its release wheel, `test` where a GPU answers.
6. `--push REMOTE`: the branch pushed (a conflict or a regression pushes it too, for the human to start from).

Exit 0: a ready branch; 1: a human is needed (a conflict, a regression, a failed proof); 2: bad input.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from carry import config as configs
from carry import version
from carry.app import App
from carry.platforms import Platform
from carry.source import git, series, upstream
from carry.util import prog, reporter
from carry.util.cache import Cache
from carry.util.errors import BadInput, Failed
from carry.util.fsutil import atomic_write_text
from carry.util.record import record
from carry.verdicts import droplog, rebase, resolutions

BRANCH_PREFIX = "carry/follow/"
STATE = "state.json"
PRERELEASE_RE = re.compile(r"(?:a|b|rc|alpha|beta|pre|dev)\.?\d*$", re.IGNORECASE)
PROGRESS_RE = re.compile(r"[\w ]+: \d+% of ")  # reporter.Bar's lines


@record(kw_only=True)
class Request:
    """What `follow` was asked: REF (None: upstream.follow), --continue, --push, whether tests judge too, and build."""

    ref: str | None = None
    resume: bool = False
    push: str | None = None
    test: bool = False
    build: bool = True


class Follow:
    """One follow run: the repository, its worktree on the branch, the workspace, and the report (state.json)."""

    def __init__(self, cache: Cache, report: dict[str, Any]):
        self.cache = cache
        self.report = report
        self.repo = Path(report["repo"])
        self.home = Path(report["home"])
        self.worktree = self.home / "tree"
        self.config_path = self.worktree / report["config"]

    # --- what every step uses ----------------------------------------------------------------------------------

    def config(self) -> configs.Config:
        return configs.load(self.config_path)

    def save(self) -> None:
        atomic_write_text(self.home / STATE, json.dumps(self.report, indent=1) + "\n")

    def commit(self, step: str, message: str) -> str | None:
        """Commit what the step changed in the project's directory (None when nothing did)."""
        project = str(self.config_path.parent.relative_to(self.worktree))
        git.run(self.worktree, "add", "-A", "--", project)
        if git.run_status(self.worktree, "diff", "--cached", "--quiet")[0] == 0:
            return None
        git.run(self.worktree, "commit", "--quiet", "--no-verify", "-m", message)
        sha = git.run(self.worktree, "rev-parse", "HEAD")
        self.report["commits"].append({"step": step, "commit": sha, "subject": message.splitlines()[0]})
        return sha

    def step(self, name: str, started: float, lines: list[str]) -> None:
        seconds = round(time.monotonic() - started, 1)
        self.report["steps"].append({"step": name, "seconds": seconds, "lines": lines})
        for line in lines:
            reporter.phase(name, line)
        self.save()

    def fate(self, name: str, fate: str, detail: str = "") -> None:
        entry = next(p for p in self.report["patches"] if p["name"] == name)
        entry["fate"], entry["detail"] = fate, detail

    def carry(self, *args: str) -> tuple[int, str]:
        """`carry --config <the worktree's build.yaml> ARGS` as a maintainer runs it, logged: (exit status, stdout)."""
        from carry.util.run import BUILD_S, execute

        argv = [sys.executable, "-m", "carry", "--config", str(self.config_path), *args]
        done = execute(argv, timeout=BUILD_S, cwd=self.worktree, text=True)
        logs = self.home / "logs"
        logs.mkdir(exist_ok=True)
        log = logs / f"{len(list(logs.iterdir())):02d}-{args[0]}.log"
        log.write_text(f"$ {prog.command(*args)}\n{done.stdout}{done.stderr}")
        if done.returncode not in (0, 1):
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise Failed(f"`{prog.command(*args)}` on the branch exited {done.returncode}: {last} (log: {log})")
        return done.returncode, done.stdout


# --- the command ---------------------------------------------------------------------------------------------------


def follow(app: App, request: Request) -> dict[str, Any]:
    """Run `follow` for the project of `app`; the report (its "exit" is the command's exit status)."""
    loaded, cache = app.config, app.cache
    if request.resume:
        run = _resume(loaded, cache)
    else:
        started = _start(loaded, cache, request)
        if started is None:
            return {"exit": 0, "nothing": True}
        run = started
        _status_and_drops(run, request)
    try:
        _carry_series(run)
    except rebase.Conflict as conflict:
        _stopped(run, conflict)
    else:
        _after_rebase(run, request)
    if request.push:
        _push(run, request.push)
    # the branch checked out nowhere, so that the maintainer can check it out; --continue takes it up again
    git.run(run.worktree, "checkout", "--quiet", "--detach")
    run.save()
    return run.report


def _start(loaded: configs.Config, cache: Cache, request: Request) -> Follow | None:
    """Everything checked before anything is made: REF, the repository, a clean work tree; then the worktree."""
    ref = request.ref or default_ref(loaded, cache)
    mirror = upstream.ensure_base(loaded, cache)
    commit = upstream.resolve_ref(loaded, cache, ref)
    pin = loaded.upstream.commit
    if commit == pin:
        reporter.phase("follow", f"{ref} is the pin {pin[:12]}: nothing to do")
        return None
    found, unknown = upstream.merge_base(loaded, cache, mirror, pin, commit)
    if found == commit:
        raise BadInput(
            f"{ref} ({commit[:12]}) is older than the pin {pin[:12]}: follow moves forward only; name a newer ref"
        )
    repo = _repository(loaded.path)
    project = loaded.path.absolute().parent
    dirty = git.run(repo, "status", "--porcelain", "--untracked-files=no", "--", str(project))
    if dirty:
        first = dirty.splitlines()[0].strip()
        raise BadInput(f"{project}: uncommitted changes ({first}, ...); commit or stash them, then follow again")
    head = git.run(repo, "rev-parse", "HEAD")
    home = _home(cache, repo)
    branch = BRANCH_PREFIX + re.sub(r"[^A-Za-z0-9._-]+", "-", ref.removeprefix("refs/")).strip("-.")
    _clear(repo, home)
    home.mkdir(parents=True)
    git.run(repo, "worktree", "add", "--quiet", "--force", "-B", branch, str(home / "tree"), head)
    report: dict[str, Any] = {
        "ref": ref,
        "commit": commit,
        "pin": pin,
        "branch": branch,
        "base": head,
        "repo": str(repo),
        "home": str(home),
        "config": str(loaded.path.absolute().relative_to(repo)),
        "upstream": _since(loaded, cache, mirror, pin, commit),
        "unknown_history": unknown or None,
        "version": str(version.following(loaded.version_file)),
        **{key: [] for key in ("patches", "commits", "steps", "replayed", "recorded", "pins")},
        "lock": None,
        **{key: [] for key in ("wheels", "suite", "proofs")},
        "conflict": None,
        "needs": [],
        "exit": 0,
    }
    run = Follow(cache, report)
    _link_upstream(loaded, run)
    run.save()
    return run


def default_ref(loaded: configs.Config, cache: Cache) -> str:
    """What upstream.follow names: `pr`, `main`, or the newest release tag matching a pattern (`v*`), no pre-release."""
    setting = loaded.upstream.follow or ("pr" if loaded.upstream.pr is not None else "main")
    if setting == "pr":
        if loaded.upstream.pr_ref is None:
            raise BadInput(f"{loaded.path}: upstream.follow is pr, but upstream.pr is not set; set it, or follow main")
        return loaded.upstream.pr_ref
    if setting == "main":
        return loaded.upstream.main
    mirror = upstream.mirror_for(loaded, cache)
    try:
        tags = git.ls_remote_tags(mirror, loaded.upstream.url)
    except git.GitError as exc:
        raise BadInput(f"upstream.follow {setting!r}: upstream's tags cannot be listed ({exc}); name REF") from None
    import fnmatch

    releases = [t for t in tags if fnmatch.fnmatchcase(t, setting) and not PRERELEASE_RE.search(t)]
    if not releases:
        raise BadInput(f"{loaded.path}: upstream.follow {setting!r} matches no release tag upstream; name REF")
    return max(releases, key=lambda t: [int(n) for n in re.findall(r"\d+", t)])


def _home(cache: Cache, repo: Path) -> Path:
    """Where the runs of `follow` for the project repository `repo` keep their worktree, workspace and state."""
    return cache.root / "follow" / hashlib.sha256(str(repo).encode()).hexdigest()[:16]


def _repository(config_path: Path) -> Path:
    status, out, _ = git.run_status(config_path.absolute().parent, "rev-parse", "--show-toplevel")
    if status != 0:
        raise BadInput(f"{config_path}: not in a git repository; follow makes a branch of the project's repository")
    return Path(out)


def _clear(repo: Path, home: Path) -> None:
    """The last run's worktree and workspace removed (its branch stays until this run resets it)."""
    if (home / "tree").exists():
        git.run_status(repo, "worktree", "remove", "--force", str(home / "tree"))
    shutil.rmtree(home, ignore_errors=True)
    git.run_status(repo, "worktree", "prune")


def _link_upstream(loaded: configs.Config, run: Follow) -> None:
    """An untracked upstream.url path (examples/vllm's upstream.git) linked into the worktree: the same upstream."""
    url = Path(loaded.upstream.url)
    project = loaded.path.absolute().parent
    if not url.is_absolute() or not url.exists():
        return
    for entry in project.iterdir():
        ignored = git.run_status(run.repo, "check-ignore", "--quiet", "--", str(entry))[0] == 0
        if entry.is_symlink() and entry.resolve() == url and ignored:
            target = run.config_path.parent / entry.name
            if not target.exists():
                target.symlink_to(url)


def _since(loaded: configs.Config, cache: Cache, mirror: Path, pin: str, commit: str) -> dict[str, Any]:
    """What REF is beside the pin: the commits between them and the release tags among those."""
    commits = git.rev_list(mirror, f"{pin}..{commit}")
    tags: list[str] = []
    with contextlib.suppress(git.GitError):
        listed = git.ls_remote_tags(mirror, loaded.upstream.url)
        inside = set(commits)
        tags = sorted(name for name, sha in listed.items() if sha in inside)
    return {"commits": len(commits), "tags": tags}


# --- the steps -----------------------------------------------------------------------------------------------------


def _status_and_drops(run: Follow, request: Request) -> None:
    from carry.app import verdicts as app_verdicts

    started = time.monotonic()
    loaded = run.config()
    app = App(loaded, run.cache)
    found = app_verdicts.status(app, app_verdicts.StatusRequest(against=(run.report["ref"],), test=request.test))
    verdicts = found.reports[0].verdicts
    run.report["patches"] = [
        {
            "name": v.patch.name,
            "verdict": v.verdict.value,
            "decided_by": v.test,
            "commit": v.commit,
            "evidence": list(v.evidence),
            "hunks": [h.header for h in v.hunks if h.state.value == "conflict"],
            "fate": "pending",
            "detail": "",
        }
        for v in verdicts
    ]
    run.step("status", started, [f"{v.patch.name}: {v.verdict.value} ({v.test})" for v in verdicts])
    for verdict in (v for v in verdicts if v.verdict.droppable):
        started = time.monotonic()
        _drop(run, loaded, verdict, found.reports[0].commit)
        run.step("drop", started, [f"dropped {verdict.patch.name}: {verdict.verdict.value}"])


def _drop(run: Follow, loaded: configs.Config, verdict: Any, ref_commit: str) -> None:
    """One droppable patch removed and logged (the pin moves to REF with the rest of the series, which holds it)."""
    name, ref = verdict.patch.name, run.report["ref"]
    patches_dir = loaded.patches_dir
    what = f"{verdict.verdict.value} against {ref}"
    line = droplog.log_line(name, what, verdict.commit or ref_commit, run.report["version"], run.report["commit"])
    atomic_write_text(patches_dir / droplog.LOG_NAME, droplog.read_log(patches_dir / droplog.LOG_NAME) + line + "\n")
    (patches_dir / name).unlink()
    resolutions.forget(patches_dir, name)
    evidence = "\n".join(f"- {e}" for e in verdict.evidence)
    run.commit("drop", f"carry follow: drop {name} ({what})\n\n{evidence}\n\n{line.removeprefix('- ')}\n")
    run.fate(name, "dropped", what)


def _carry_series(run: Follow) -> None:
    """The rest of the series onto REF in the workspace; a conflict raises rebase.Conflict, the workspace kept."""
    loaded = run.config()
    patches = series.load(loaded.patches_dir)
    state = run.report.get("workspace")
    started = time.monotonic()
    if state is None:
        mirror = upstream.ensure_base(loaded, run.cache)
        space = rebase.Workspace.open(mirror, run.report["pin"], run.report["commit"], patches, run.home / "upstream")
    else:
        space = _workspace(run, state, loaded.patches_dir)
    saved = {"path": str(space.path), "names": space.names, "commits": space.commits, "done": space.done}
    run.report["workspace"] = saved
    try:
        space.advance(patches)
    finally:
        run.report["workspace"]["done"] = space.done
        run.report["replayed"] += [{"patch": r.patch, "file": r.file, "entry": r.entry} for r in space.replays]
    texts, tree = space.texts()
    _write_carried(run, loaded, patches, texts)
    run.report["tree"] = tree
    fates = [f"{p['name']}: {p['fate']}" + (f" ({p['detail']})" if p["detail"] else "") for p in run.report["patches"]]
    run.step("rebase", started, [r.line() for r in space.replays] + fates)


def _write_carried(run: Follow, loaded: configs.Config, patches: series.Series, texts: dict[str, str | None]) -> None:
    """The moved patches rewritten, the emptied ones removed and logged, the pin moved to REF, VERSION once."""
    from carry.verdicts import refresh

    ref, commit = run.report["ref"], run.report["commit"]
    lines = []
    for name, text in texts.items():
        patch = patches.find(name)
        if text is None:
            what = f"empty after follow onto {ref} {commit[:12]} (already upstream)"
            lines.append(droplog.log_line(name, what, None, run.report["version"]))
            patch.path.unlink()
            resolutions.forget(loaded.patches_dir, name)
            run.fate(name, "emptied", "already upstream")
        elif refresh.substance_moved(patch, text, run.home):
            atomic_write_text(patch.path, text)
            replayed = any(r["patch"] == name for r in run.report["replayed"])
            run.fate(name, "rewritten", "a recorded resolution replayed" if replayed else "3-way merged onto REF")
        else:
            run.fate(name, "carried", "applies on REF as written")
    if lines:
        log = loaded.patches_dir / droplog.LOG_NAME
        atomic_write_text(log, droplog.read_log(log) + "".join(line + "\n" for line in lines))
    upstream.update_pin(loaded, commit)
    version.write(loaded.version_file, version.Version.parse(run.report["version"]))
    body = "\n".join(f"- {p['name']}: {p['fate']} ({p['detail']})" for p in run.report["patches"])
    run.commit(
        "rebase",
        f"carry follow: the series onto {ref} ({commit[:12]}), VERSION {run.report['version']}\n\n{body}\n",
    )


def _stopped(run: Follow, conflict: rebase.Conflict) -> None:
    """A conflict nobody recorded a resolution for: the patch, the file, the hunk, and the way on."""
    name = conflict.patch.name
    entry = next((p for p in run.report["patches"] if p["name"] == name), None)
    hunks = entry["hunks"] if entry else []
    where = "; ".join(
        f"{f} lines {', '.join(f'{a}-{b}' for a, b in regions)}" for f, regions in conflict.regions.items()
    )
    run.fate(name, "conflict", f"in {conflict.files}" + (f", hunk {'; '.join(hunks)}" if hunks else ""))
    run.report["conflict"] = {
        "patch": name,
        "files": conflict.files,
        "hunks": hunks,
        "markers": where,
        "workspace": run.report["workspace"]["path"],
        "unfit": list(conflict.unfit),
    }
    unfit = (
        f"; the recorded resolution(s) {', '.join(u[:12] for u in conflict.unfit)} of {name} do not fit this conflict"
        if conflict.unfit
        else ""
    )
    run.report["needs"].append(
        f"{name} conflicts with {run.report['ref']} in {conflict.files}"
        + (f" (hunk {'; '.join(hunks)})" if hunks else "")
        + f"{unfit}: resolve the markers ({where}) in {run.report['workspace']['path']}, then "
        f"`{prog.command('follow', '--continue')}`"
    )
    run.report["exit"] = 1
    run.step("rebase", time.monotonic(), [run.report["needs"][-1]])


def _workspace(run: Follow, state: dict[str, Any], patches_dir: Path) -> rebase.Workspace:
    """The workspace a stopped run left, as its state.json records it."""
    return rebase.Workspace(
        Path(state["path"]), patches_dir, run.report["commit"], state["names"], state["commits"], state["done"]
    )


def _resume(loaded: configs.Config, cache: Cache) -> Follow:
    """`--continue`: the maintainer's resolution recorded, then the run takes up where it stopped."""
    repo = _repository(loaded.path)
    home = _home(cache, repo)
    try:
        report = json.loads((home / STATE).read_text())
    except (OSError, ValueError):
        raise BadInput(
            f"no follow run stopped on a conflict for {repo}; run `{prog.command('follow')}` first"
        ) from None
    if report.get("conflict") is None:
        raise BadInput(
            f"the last follow of {repo} ({report.get('ref')}) did not stop on a conflict; nothing to continue"
        )
    run = Follow(cache, report)
    state = report["workspace"]
    space = _workspace(run, state, run.config().patches_dir)
    started = time.monotonic()
    name, recorded = space.resume(run.config().patches_dir)
    git.run(run.worktree, "checkout", "--quiet", report["branch"])  # detached when the run stopped
    state["done"] = space.done
    report["recorded"] += [str(p.relative_to(run.worktree)) for p in recorded]
    report["conflict"], report["exit"], report["needs"] = None, 0, []
    run.fate(name, "pending", "")
    run.commit("resolve", f"carry follow: record the resolution of {name}'s conflict with {report['ref']}\n")
    run.step("resolve", started, [f"recorded {p}" for p in report["recorded"]])
    return run


def _after_rebase(run: Follow, request: Request) -> None:
    """Pins, lock, then the wheels, the suite and the proofs."""
    loaded = run.config()
    settings = loaded.build.precompiled
    if settings is not None and settings.nightly is not None:
        started = time.monotonic()
        with reporter.recording() as said:
            App(loaded, run.cache).repin(run.report["commit"], run.report.get("tree"))
        run.report["pins"] = [line for line in said if not PROGRESS_RE.match(line)]  # a download's quarters: noise
        run.commit("pin", f"carry follow: the precompiled pins of {run.report['commit'][:12]}\n")
        run.step("pin", started, run.report["pins"] or ["precompiled pins moved"])
    elif settings is not None and settings.wheels:
        from carry.wheelbuild import pins

        started = time.monotonic()
        run.report["pins"] = pins.follow_release(loaded, run.cache, run.report["ref"])
        run.commit("pin", f"carry follow: the precompiled wheels of {run.report['ref']}\n")
        run.step("pin", started, run.report["pins"])
    if loaded.image is not None and loaded.image.lock is not None:
        started = time.monotonic()
        code, out = run.carry("lock")
        run.report["lock"] = "moved" if run.commit("lock", "carry follow: the runtime lock\n") else "unchanged"
        run.step("lock", started, out.strip().splitlines()[-3:])
    if request.build:
        _build_and_prove(run)


def _build_and_prove(run: Follow) -> None:
    """`wheel` per platform; `suite` of each wheel this machine runs against its release wheel; then the proofs."""
    loaded = run.config()
    settings = loaded.build.precompiled
    platforms = [str(w.platform) for w in settings.wheels] if settings and settings.wheels else [None]
    for platform in platforms:
        started = time.monotonic()
        code, out = run.carry("wheel", *(["--platform", platform] if platform else []))
        if code != 0 or not out.strip():
            run.report["needs"].append(f"`wheel` failed for {platform or 'this machine'}: see {run.home / 'logs'}")
            run.report["exit"] = 1
            run.step("wheel", started, run.report["needs"][-1:])
            continue
        wheel = str(run.worktree / out.strip().splitlines()[-1])
        run.report["wheels"].append({"platform": platform, "wheel": wheel})
        run.step("wheel", started, [wheel])
        if loaded.build.upstream_tests is None or settings is None or not settings.wheels:
            continue
        if platform != str(Platform.native()):
            run.report["proofs"].append(f"suite: not run for {platform}: its wheel does not run on this machine")
            continue
        started = time.monotonic()
        code, out = run.carry("suite", wheel, "--json")
        summary = _suite_summary(platform, json.loads(out) if out.strip().startswith("{") else {}, code)
        run.report["suite"].append(summary)
        if summary["verdict"] != "PASS":
            run.report["needs"].append(f"suite on {platform}: {summary['line']}")
            run.report["exit"] = 1
        run.step("suite", started, [f"{platform}: {summary['line']}"])
    _proofs(run, loaded)


def _suite_summary(platform: str | None, found: dict, code: int) -> dict[str, Any]:
    """The suite report's verdict, its one line, and the tests that changed (suite's own classes)."""
    tests = found.get("tests", {})
    changed = {kind: [t for t, row in tests.items() if row["class"] == kind] for kind in ("regressed", "fixed")}
    return {
        "platform": platform,
        "verdict": found.get("verdict", "FAIL"),
        "line": found.get("line", f"suite exited {code} without a report"),
        "against": (found.get("against") or {}).get("name"),
        **changed,
    }


def _proofs(run: Follow, loaded: configs.Config) -> None:
    """`test` on each wheel where a GPU answers; said plainly where none did."""
    if not loaded.build.tests:
        run.report["proofs"].append("build.tests is empty: nothing to prove on a GPU")
        return
    from carry.gputest import gpu as gpus

    found = gpus.probe()
    if found is None:
        run.report["proofs"].append("no GPU answered on this machine (nvidia-smi): `test` and `prove` were not run")
        return
    gpu = found.describe()
    for wheel in run.report["wheels"]:
        started = time.monotonic()
        code, out = run.carry("test", wheel["wheel"])
        run.report["proofs"].append(
            f"{wheel['platform'] or 'this machine'} on {gpu}: {'PASS' if code == 0 else 'FAIL'}"
        )
        if code != 0:
            run.report["needs"].append(f"`test` failed on {gpu}: see {run.home / 'logs'}")
            run.report["exit"] = 1
        run.step("test", started, run.report["proofs"][-1:])


def _push(run: Follow, remote: str) -> None:
    """The branch to REMOTE, replacing what an earlier run pushed there (git's own credential helpers)."""
    started = time.monotonic()
    branch = run.report["branch"]
    status, _, err = git.run_status(run.repo, "push", "--quiet", "--force", remote, f"{branch}:refs/heads/{branch}")
    if status != 0:
        raise Failed(
            f"git push of {branch} to {remote} failed: {err.strip().splitlines()[-1] if err.strip() else status}"
        )
    run.report["pushed"] = remote
    run.step("push", started, [f"{branch} -> {remote}"])
