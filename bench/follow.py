"""`carry follow` on the real vLLM history (issue 48): from "upstream moved" to a ready, proven branch, both CPUs,
every figure from one run.

The project is examples/vllm pinned on v0.32.0 (its precompiled wheels vllm==0.32.0 for linux/amd64 and
linux/arm64, by the sha256 the index lists), its own git repository, carrying four patches written here from the
real 0.32.0 -> 0.33.0 difference:

- 0001: one file's whole change of that difference, as it is (0.33.0 merged it exactly);
- 0002: another file's change with one added line worded otherwise (0.33.0 merged it with edits);
- 0003: a comment added to a module 0.33.0 did not touch (still needed, applies cleanly);
- 0004: one line that 0.33.0 changed, changed another way (still needed, conflicts).

Then, timed per step:
1. `follow v0.33.0`: 0001 and 0002 dropped with their evidence, 0003 carried, stop on 0004 naming its hunk (exit 1);
2. the maintainer's one resolution (0.33.0's line, with the patch's intent kept), then `follow --continue`: the
   precompiled pins moved to the 0.33.0 wheels (both CPUs), the lock refreshed, both wheels built and gated, `suite`
   against 0.33.0's release wheel, 0 regressed, exit 0;
3. the same series on a fresh clone with the recorded resolution committed, a fresh carry cache: `follow v0.33.0`
   replays it with no human step, exit 0;
4. what a maintainer runs by hand for the same on another fresh clone and cache: status, drop x2, refresh, lock,
   wheel x2, suite (the pins edited by hand: not timed, so the figure is harsh on follow, which downloads them).

Targets: run 3 <= 1.2x run 4's sum, and <= 15 minutes.

    python bench/follow.py [--json OUT]      (needs `bash ci/setup.sh`: the runtime bases `lock` reads)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import realvllm  # noqa: E402
from lib.vllm import example_project  # noqa: E402

GIT_ENV = {
    "GIT_AUTHOR_NAME": "maintainer",
    "GIT_AUTHOR_EMAIL": "maintainer@example.invalid",
    "GIT_COMMITTER_NAME": "maintainer",
    "GIT_COMMITTER_EMAIL": "maintainer@example.invalid",
}
WHEEL_032 = {
    "linux/amd64": "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "linux/arm64": "vllm-0.32.0-cp38-abi3-manylinux_2_28_aarch64.whl",
}
MARK = "  # carried: keep the older default"


def git(cwd: Path, *args: str, strip: bool = True) -> str:
    """git's output; `strip=False` for file contents and patches (a patch's last context line may be blank)."""
    done = subprocess.run(
        ["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, check=True
    )
    return done.stdout.strip() if strip else done.stdout


def carry(config: Path, env: dict, *args: str) -> tuple[int, str, str, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "--config", str(config), *args],
        cwd=config.parent,  # where a maintainer runs it: `wheel` writes dist/ here
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=3600,
    )
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def report_of(code: int, out: str, err: str) -> dict:
    """`--json`'s report, or the run's exit and stderr when it printed none."""
    try:
        return json.loads(out)
    except json.JSONDecodeError:
        raise SystemExit(f"bench: follow exited {code} with no report:\n{err[-4000:]}") from None


# --- the four patches, from the real difference ---------------------------------------------------------------


def changed_files(history: Path) -> list[tuple[str, int]]:
    """(path, lines changed) of each .py file under vllm/ that both releases hold and 0.33.0 modified, smallest
    change first."""
    out = git(history, "diff", "--numstat", "--diff-filter=M", realvllm.V0_32_0, realvllm.V0_33_0, "--", "vllm/")
    found = []
    for line in out.splitlines():
        added, removed, path = line.split("\t")
        if path.endswith(".py") and added != "-":
            found.append((path, int(added) + int(removed)))
    return sorted(found, key=lambda item: (item[1], item[0]))


def patch_text(history: Path, subject: str, change: dict[str, str]) -> str:
    """A patch on v0.32.0 making `change` (path -> new text), as git format-patch writes it."""
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"carry-follow-patch-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    git(history.parent, "clone", "-q", "--no-checkout", str(history), str(work))
    try:
        git(work, "checkout", "-q", realvllm.V0_32_0)
        for path, text in change.items():
            (work / path).write_text(text)
        git(work, "commit", "-q", "-am", subject)
        return git(work, "format-patch", "-1", "--stdout", "--zero-commit", "--no-signature", "HEAD", strip=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def four_patches(history: Path) -> dict[str, str]:
    def at(ref: str, path: str) -> str:
        return git(history, "show", f"{ref}:{path}", strip=False)

    files = changed_files(history)
    # files whose change adds at least two lines and removes one: a merge, an edit and a conflict to come from
    candidates = []
    for path, _ in files:
        diff = git(history, "diff", "-U0", realvllm.V0_32_0, realvllm.V0_33_0, "--", path)
        added = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
        removed = [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
        if len([a for a in added if a.strip()]) >= 2 and any(r.strip() for r in removed):
            candidates.append((path, added, removed))
        if len(candidates) == 3:
            break
    (exact, _, _), (edited, edited_added, _), (conflicting, _, conflicting_removed) = candidates
    new = at(realvllm.V0_33_0, edited)
    line = next(a for a in edited_added if a.strip() and not a.strip().startswith("#"))
    reworded = new.replace(line + "\n", line + "  # carried\n", 1)
    old = at(realvllm.V0_32_0, conflicting)
    target = next(r for r in conflicting_removed if r.strip() and not r.strip().startswith("#"))
    untouched = "vllm/logger.py"
    assert not git(history, "diff", "--name-only", realvllm.V0_32_0, realvllm.V0_33_0, "--", untouched)
    return {
        "0001-merged-exactly.patch": patch_text(
            history, f"{exact}: 0.33.0's change", {exact: at(realvllm.V0_33_0, exact)}
        ),
        "0002-merged-with-edits.patch": patch_text(
            history, f"{edited}: 0.33.0's change, worded otherwise", {edited: reworded}
        ),
        "0003-still-needed.patch": patch_text(
            history, "logger: say it is carried", {untouched: at(realvllm.V0_32_0, untouched) + "# carried by carry\n"}
        ),
        "0004-conflicts.patch": patch_text(
            history,
            f"{conflicting}: keep the older default",
            {conflicting: old.replace(target + "\n", target + MARK + "\n", 1)},
        ),
        "_paths": json.dumps({"exact": exact, "edited": edited, "conflicting": conflicting}),
    }


# --- the project ----------------------------------------------------------------------------------------------


def make_project(root: Path, history: Path, patches: dict[str, str]) -> Path:
    """examples/vllm pinned on v0.32.0 with its 0.32.0 precompiled wheels and the four patches, in a git repo."""
    from carry.util import index

    config = example_project(root, history)
    text = config.read_text().replace(
        "4573200f17f9dba6ef84c3ce59fb24d5a81e9a51   # v0.33.0", f"{realvllm.V0_32_0}   # v0.32.0"
    )
    for platform, name in WHEEL_032.items():
        _, sha = index.find_file("vllm", name, f"bench: {name}")
        assert sha, name
        entry = rf"(      {re.escape(platform)}:\n        requirement: )vllm==0\.33\.0"
        block = re.compile(entry + r"(\n        sha256: )[0-9a-f]{64}(\n        ref: )v0\.33\.0")
        text, count = block.subn(rf"\g<1>vllm==0.32.0\g<2>{sha}\g<3>v0.32.0", text)
        assert count == 1, platform
    config.write_text(text)
    for old in (root / "patches").glob("*.patch"):
        old.unlink()
    for name, body in patches.items():
        if not name.startswith("_"):
            (root / "patches" / name).write_text(body)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "examples/vllm on v0.32.0 with four patches")
    return config


def resolve(workspace: Path, path: str) -> None:
    """The maintainer's resolution: 0.33.0's lines, the first one marked as the patch marked it."""
    target = workspace / path
    text = target.read_text()
    start = text.index("<<<<<<<")
    middle = text.index("=======", start)
    end = text.index("\n", text.index(">>>>>>>", middle)) + 1
    ours = text[text.index("\n", start) + 1 : middle]  # HEAD: REF's lines (cherry-pick's "ours")
    first, _, rest = ours.partition("\n")
    target.write_text(text[:start] + first + MARK + "\n" + rest + text[end:])


def measure(work: Path, result: dict) -> dict:
    """Every run, its figures added to `result` as they come (what a failed run measured stays there)."""
    from carry.util import index

    downloads = realvllm.download_store()
    history = Path(realvllm.build(work / "history")["path"])
    patches = four_patches(history)
    result["paths"] = json.loads(patches["_paths"])
    config = make_project(work / "project", history, patches)
    env = {"CARRY_CACHE": str(work / "cache-1"), "CARRY_DOWNLOADS": downloads}

    # 1: upstream moved; follow stops on 0004
    code, out, err, first = carry(config, env, "follow", "v0.33.0", "--json", "--body", str(work / "body-1.md"))
    report = report_of(code, out, err)
    assert code == 1, err[-3000:]
    fates = {p["name"]: (p["verdict"], p["fate"]) for p in report["patches"]}
    result["first"] = {"seconds": first, "fates": fates, "needs": report["needs"], "steps": report["steps"]}
    assert (
        fates["0001-merged-exactly.patch"][1] == "dropped" and fates["0002-merged-with-edits.patch"][1] == "dropped"
    ), fates
    assert report["conflict"]["patch"] == "0004-conflicts.patch" and report["conflict"]["hunks"], report["conflict"]

    # 2: the one resolution, then --continue to a ready branch
    resolve(Path(report["conflict"]["workspace"]), result["paths"]["conflicting"])
    code, out, err, second = carry(config, env, "follow", "--continue", "--json", "--body", str(work / "body-2.md"))
    report = report_of(code, out, err)
    assert code == 0, err[-3000:]
    result["continue"] = {
        "seconds": second,
        "fates": {p["name"]: p["fate"] for p in report["patches"]},
        "pins": report["pins"],
        "lock": report["lock"],
        "wheels": [Path(w["wheel"]).name for w in report["wheels"]],
        "suite": report["suite"],
        "proofs": report["proofs"],
        "steps": report["steps"],
        "body_chars": len((work / "body-2.md").read_text()),
    }
    assert all(s["verdict"] == "PASS" and not s["regressed"] for s in report["suite"]), report["suite"]
    repo = work / "project"
    branch = report["branch"]
    built = git(repo, "show", f"{branch}:build.yaml")
    for name in (
        "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
        "e9e404f52c8494b69bd83fe99fe7ecfa9f6b89fbd156d2a9639c24ea41d6d606",
    ):
        assert name in built, "the 0.33.0 wheels' sha256 in the branch's build.yaml"

    # 3: another machine: the resolution committed, a fresh clone, a fresh cache, no human step
    git(repo, "checkout", "-q", branch, "--", "patches/resolutions")
    git(repo, "commit", "-q", "-m", "record the resolution of 0004's conflict with v0.33.0")
    other = work / "other"
    git(work, "clone", "-q", str(repo), str(other))
    fresh = {"CARRY_CACHE": str(work / "cache-2"), "CARRY_DOWNLOADS": downloads}
    code, out, err, replay = carry(other / "build.yaml", fresh, "follow", "v0.33.0", "--json")
    report = report_of(code, out, err)
    assert code == 0, err[-3000:]
    assert [r["patch"] for r in report["replayed"]] == ["0004-conflicts.patch"], report["replayed"]
    result["replay"] = {"seconds": replay, "steps": report["steps"], "replayed": report["replayed"]}

    # 4: by hand, on another fresh clone and cache
    hand = work / "hand"
    git(work, "clone", "-q", str(repo), str(hand))
    manual = {"CARRY_CACHE": str(work / "cache-3"), "CARRY_DOWNLOADS": downloads}
    steps: list[tuple[str, float]] = []

    def step(*args: str) -> str:
        code, out, err, seconds = carry(hand / "build.yaml", manual, *args)
        assert code == 0, (args, err[-3000:])
        steps.append((" ".join(args), seconds))
        return out

    step("status", "--against", "v0.33.0")
    # dropping 0001 first cannot work by hand: drop moves the pin to v0.33.0 and carries the rest there, where 0002
    # (merged with edits) conflicts; nothing is changed (exit 1). Dropping 0002 first carries 0001 over as emptied
    # (logged as dropped too) and replays 0004's recorded resolution: one drop does what two were planned for, and
    # no refresh is left to run.
    code, _, err, seconds = carry(
        hand / "build.yaml", manual, "drop", "0001-merged-exactly.patch", "--against", "v0.33.0"
    )
    result["by_hand_first_drop"] = {"exit": code, "seconds": seconds, "said": err.strip().splitlines()[-1:]}
    assert code == 1 and "0002-merged-with-edits.patch conflicts with" in err, err[-2000:]
    dropped = step("drop", "0002-merged-with-edits.patch", "--against", "v0.33.0")
    assert "emptied    0001-merged-exactly.patch" in dropped and "replayed  0004-conflicts.patch" in dropped, dropped
    text = (hand / "build.yaml").read_text()
    for name in WHEEL_032.values():
        new = name.replace("0.32.0", "0.33.0")
        _, sha = index.find_file("vllm", new, f"bench: {new}")
        _, old = index.find_file("vllm", name, f"bench: {name}")
        text = (
            text.replace(str(old), str(sha))
            .replace("vllm==0.32.0", "vllm==0.33.0")
            .replace("ref: v0.32.0", "ref: v0.33.0")
        )
    (hand / "build.yaml").write_text(text)
    step("lock")
    wheel = str(hand / step("wheel").strip().splitlines()[-1])
    step("wheel", "--platform", "linux/arm64")
    step("suite", wheel)
    total = sum(seconds for _, seconds in steps)
    result["by_hand"] = {"steps": steps, "seconds": total}
    result["ratio"] = replay / total
    result["targets"] = {
        "replay <= 1.2x by hand": result["ratio"] <= 1.2,
        "replay <= 15 minutes": replay <= 900,
        "first + continue <= 15 minutes": first + second <= 900,
    }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "carry-bench-follow")
    parser.add_argument("--keep", action="store_true", help="leave --work as it is at the end (to look into it)")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    result: dict = {}
    try:
        measure(args.work, result)
    finally:
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)
        print(json.dumps(result, indent=1))
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    return 0 if all(result["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
