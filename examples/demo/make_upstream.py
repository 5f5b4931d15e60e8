#!/usr/bin/env python3
"""Generate the demo upstream's git history into upstream.bundle.

The history is rebuilt from the files in this directory, with a fixed author,
committer, dates and messages, so every run on every machine gives the same
commit SHAs:

    main              A---B---C---D---E-------M---F
                                   \         /
    refs/pull/1/head                P1------P2      <- the pin in build.yaml

    A-D   build up the package         upstream/01-* .. 04-*
    P1-P2 PR #1, the PLE offload       upstream/05-*, 06-*
    E     an unrelated README change   upstream/07-*
    M     merges PR #1
    F     the fix of patches/0001-*.patch, applied verbatim

So on main 0001 is merged and 0002 is still needed, while both patches apply
to the PR head. Each commit's files are copied over the tree from its
upstream/<step>/ directory (full contents; nothing is ever deleted).

Usage:
    python3 make_upstream.py          (re)write upstream.bundle if its refs changed,
                                      and pin build.yaml's upstream.commit to the PR head
    python3 make_upstream.py --check  exit 1 if upstream.bundle's refs or that pin
                                      differ from a fresh build
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS_DIR = HERE / "upstream"
PATCHES_DIR = HERE / "patches"
BUNDLE = HERE / "upstream.bundle"
CONFIG = HERE / "build.yaml"
PIN_LINE = re.compile(r"^(  commit: )(\S+)$", re.MULTILINE)

AUTHOR_NAME = "Pledemo Maintainers"
AUTHOR_EMAIL = "maintainers@pledemo.invalid"
FIRST_COMMIT_DATE = datetime(2026, 11, 2, 9, 0, tzinfo=timezone.utc)
MAIN = "main"
PR_BRANCH = "pr-1"
PIN_REF = "refs/pull/1/head"
BUNDLE_REFS = {"refs/heads/main": MAIN, PIN_REF: PR_BRANCH}

# Settings that keep the machine's own git configuration out of the history.
GIT_SETTINGS = (
    f"user.name={AUTHOR_NAME}",
    f"user.email={AUTHOR_EMAIL}",
    "commit.gpgsign=false",
    "core.autocrlf=false",
    "core.hooksPath=/dev/null",
    "merge.log=false",
    "pack.threads=1",
)


@dataclass(frozen=True)
class Commit:
    """One commit: files to copy from upstream/<overlay>, a patch to apply, or a merge."""

    branch: str
    message: str
    overlay: str = ""
    patch: str = ""
    merge: str = ""


HISTORY = (
    Commit(MAIN, "Add PLE kernels with CPU references\n\n"
           "saxpy, ple_gather (per-layer-embedding row gather) and row_scale /\n"
           "row_sum, with C-API bindings that take and return Python buffers.",
           overlay="01-kernels"),
    Commit(MAIN, "Build pledemo._C with setuptools and nvcc\n\n"
           "The build honours TORCH_CUDA_ARCH_LIST, CUDA_HOME, MAX_JOBS,\n"
           "NVCC_THREADS, CMAKE_CUDA_COMPILER_LAUNCHER and\n"
           "SETUPTOOLS_SCM_PRETEND_VERSION, like vLLM's.",
           overlay="02-build-system"),
    Commit(MAIN, "Add buildinfo.load() for packager provenance",
           overlay="03-buildinfo"),
    Commit(MAIN, "Add quantization method dispatch",
           overlay="04-quant"),
    Commit(PR_BRANCH, "ple_offload: add CpuGpuSemaphore and PleOffloadLayer",
           overlay="05-ple-semaphore"),
    Commit(PR_BRANCH, "ple_offload: add the connector and the CPU worker\n\n"
           "The runner stages token ids, prepare_forward() sends one request per\n"
           "real step from TP rank 0, and dummy runs signal the layers locally.",
           overlay="06-ple-connector"),
    Commit(MAIN, "README: list the kernels and how to build",
           overlay="07-readme"),
    Commit(MAIN, "Merge pull request #1: CPU offload of per-layer embeddings",
           merge=PR_BRANCH),
    Commit(MAIN, "quant: dispatch FP8_PER_CHANNEL_PER_TOKEN checkpoints (#2)\n\n"
           "get_quant_method() listed the algorithm but had no branch for it, so\n"
           "such checkpoints failed to load; the PLE connector now also reports\n"
           "whether the worker must send per-token scales.",
           patch="0001-quant-dispatch-FP8_PER_CHANNEL_PER_TOKEN-checkpoints.patch"),
)


def git(cwd: Path, *args: str, date: datetime | None = None, check: bool = True) -> str:
    """Run git in `cwd` with an isolated configuration; return its stdout.

    With `date`, author and committer are the fixed identity at that time.
    Exits with git's error unless `check` is false.
    """
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": os.devnull,
        "LC_ALL": "C",
        "TZ": "UTC",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    if date is not None:
        stamp = date.isoformat()
        env |= {
            "GIT_AUTHOR_NAME": AUTHOR_NAME, "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL,
            "GIT_AUTHOR_DATE": stamp,
            "GIT_COMMITTER_NAME": AUTHOR_NAME, "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL,
            "GIT_COMMITTER_DATE": stamp,
        }
    settings = [arg for setting in GIT_SETTINGS for arg in ("-c", setting)]
    result = subprocess.run(
        ["git", *settings, *args],
        cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
    )
    if check and result.returncode != 0:
        sys.exit(f"git {' '.join(args)} failed:\n{result.stderr.strip()}")
    return result.stdout


def copy_overlay(step: str, repo: Path) -> None:
    """Copy every file under upstream/<step>/ into the work tree."""
    root = STEPS_DIR / step
    for source in sorted(root.rglob("*")):
        if source.is_dir() or "__pycache__" in source.parts:
            continue
        target = repo / source.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        target.chmod(0o644)


def switch_to(repo: Path, branch: str) -> None:
    """Check out `branch`, creating it at the current commit if it is new."""
    exists = git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}", check=False)
    git(repo, "switch", *([] if exists else ["-c"]), branch)


def record(repo: Path, commit: Commit, date: datetime) -> None:
    """Make one commit of HISTORY on its branch."""
    switch_to(repo, commit.branch)
    if commit.merge:
        git(repo, "merge", "--no-ff", "--no-edit", "-m", commit.message, commit.merge, date=date)
        return
    if commit.overlay:
        copy_overlay(commit.overlay, repo)
        git(repo, "add", "--all")
    if commit.patch:
        git(repo, "apply", "--index", str(PATCHES_DIR / commit.patch))
    git(repo, "commit", "--quiet", "-m", commit.message, date=date)


def build_bundle(workdir: Path) -> Path:
    """Replay HISTORY into a fresh repository under `workdir`; return its bundle."""
    repo = workdir / "pledemo"
    repo.mkdir()
    git(repo, "init", "--quiet", "--template=", f"--initial-branch={MAIN}")
    for index, commit in enumerate(HISTORY):
        record(repo, commit, FIRST_COMMIT_DATE + timedelta(hours=index))
    for ref, branch in BUNDLE_REFS.items():
        if ref != f"refs/heads/{branch}":
            git(repo, "update-ref", ref, f"refs/heads/{branch}")
    bundle = workdir / "upstream.bundle"
    git(repo, "bundle", "create", "--quiet", str(bundle), *BUNDLE_REFS)
    return bundle


def bundle_refs(bundle: Path) -> dict[str, str]:
    """Map each ref a bundle advertises to its SHA."""
    out = git(bundle.parent, "bundle", "list-heads", str(bundle))
    return {ref: sha for sha, ref in (line.split() for line in out.splitlines())}


def pinned_commit() -> str:
    """The `commit:` of build.yaml's upstream section."""
    match = PIN_LINE.search(CONFIG.read_text())
    if match is None:
        sys.exit(f"{CONFIG.name}: no '  commit: <sha>' line under upstream")
    return match.group(2)


def write_atomically(path: Path, data: bytes) -> None:
    staged = path.with_name(path.name + ".tmp")
    staged.write_bytes(data)
    os.replace(staged, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true",
        help="write nothing; exit 1 if the bundle's refs or build.yaml's pin are stale",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="make-upstream-") as tmp:
        fresh = build_bundle(Path(tmp))
        wanted = bundle_refs(fresh)
        current = bundle_refs(BUNDLE) if BUNDLE.is_file() else {}
        for ref, sha in wanted.items():
            print(f"{sha} {ref}")
        stale = []
        if current != wanted:
            stale.append(BUNDLE.name)
        if pinned_commit() != wanted[PIN_REF]:
            stale.append(f"{CONFIG.name} upstream.commit")
        if not stale:
            print(f"{BUNDLE.name} and {CONFIG.name} are up to date")
            return 0
        if args.check:
            print(f"stale: {', '.join(stale)}; run: python3 {Path(__file__).name}",
                  file=sys.stderr)
            return 1
        if current != wanted:
            write_atomically(BUNDLE, fresh.read_bytes())
            print(f"wrote {BUNDLE.name}")
        if pinned_commit() != wanted[PIN_REF]:
            config = PIN_LINE.sub(rf"\g<1>{wanted[PIN_REF]}", CONFIG.read_text(), count=1)
            write_atomically(CONFIG, config.encode())
            print(f"pinned {CONFIG.name} upstream.commit to {wanted[PIN_REF]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
