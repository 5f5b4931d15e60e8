"""Synthetic upstreams made with `git fast-import`: long histories, with a vLLM-size tree for `check`.

Files are code-like text (Python, C++ and Markdown lines over a large vocabulary), generated from a seeded
random source, so the same arguments give the same repository and the same commit ids.
"""

from __future__ import annotations

import dataclasses
import random
import subprocess
from pathlib import Path

import gitrepo

SYLLABLES = (
    "ka",
    "to",
    "ri",
    "ven",
    "lo",
    "mar",
    "qu",
    "in",
    "tes",
    "ple",
    "off",
    "load",
    "ker",
    "nel",
    "att",
    "sched",
    "blk",
    "tok",
    "emb",
    "cache",
    "kv",
    "gem",
    "rot",
    "lay",
    "norm",
    "quant",
    "fp",
    "spec",
    "pre",
    "fill",
    "dec",
    "ode",
    "step",
    "grp",
    "warp",
    "tile",
    "mask",
    "seq",
    "page",
    "alloc",
)
TOP_DIRS = (
    "engine",
    "model_executor/layers",
    "model_executor/models",
    "v1/worker",
    "v1/core",
    "v1/attention",
    "distributed",
    "entrypoints/openai",
    "lora",
    "multimodal",
    "transformers_utils",
    "platforms",
)
EXTENSIONS = ((".py", 0.72), (".cu", 0.08), (".cuh", 0.03), (".cpp", 0.05), (".md", 0.07), (".txt", 0.05))


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))


class Lines:
    """A pool of code-like lines; files are samples of it with per-file identifiers mixed in."""

    def __init__(self, rng: random.Random, size: int):
        self.rng = rng
        words = sorted({_word(rng) for _ in range(6000)})  # sorted: set order changes with the hash seed
        shapes = (
            "    def {a}_{b}(self, {c}: int, {d}: torch.Tensor) -> {E}:",
            "        {a} = self.{b}_{c}({d}, {e}={f})",
            "        if {a}.{b} is None or {c} > {d}_{e}:",
            "            return {a}.{b}({c}, dim={n})",
            "    # {A} the {b} {c} before the {d} {e}; see {f}_{g}.",
            "from {a}.{b} import {C}{D}, {e}_{f}",
            "class {A}{B}({C}{D}):",
            '    """{A} {b} {c} for {d} {e} {f}."""',
            "  {a}_{b}<<<{c}, {d}, 0, stream>>>({e}.data_ptr(), {f}_{g}, {n});",
            "  const int {a} = blockIdx.x * {b}_{c} + threadIdx.{x};",
            "template <typename {A}, int {B}> __global__ void {c}_{d}_kernel(const {A}* {e}, int {f});",
            "- `{a}_{b}`: {c} {d} {e} when {f} is {g} ({n} by default).",
            "        for {a} in range({b}, {c}.{d}, {n}):",
            "            {a}[{b}:{c}] += {d}.{e}({f}) * {n}",
            "",
        )

        def fill(shape: str) -> str:
            values = {k: rng.choice(words) for k in "abcdefg"}
            values.update({k.upper(): v.capitalize() for k, v in values.items()})
            return shape.format(**values, n=rng.randint(0, 4096), x=rng.choice("xyz"))

        self.pool = [fill(rng.choice(shapes)) for _ in range(size)]
        self.line_bytes = sum(len(line) + 1 for line in self.pool) / size + 3  # tags add ~3 bytes a line

    def text(self, approx_bytes: int, tag: str) -> str:
        """About `approx_bytes` of text: pooled lines, one in eight naming `tag` (so files differ)."""
        count = max(1, round(approx_bytes / self.line_bytes))
        lines = self.rng.choices(self.pool, k=count)
        for i in range(0, count, 8):
            lines[i] = f"{lines[i]}  # {tag}" if lines[i] else f"# {tag}"
        return "\n".join(lines) + "\n"


def _path(rng: random.Random, number: int) -> str:
    ext = rng.choices([e for e, _ in EXTENSIONS], weights=[w for _, w in EXTENSIONS])[0]
    top = "csrc" if ext in (".cu", ".cuh", ".cpp") else "docs" if ext in (".md", ".txt") else rng.choice(TOP_DIRS)
    return f"{top}/{_word(rng)}_{number:05d}{ext}"


def _sizes(rng: random.Random, files: int, total: int) -> list[int]:
    """Log-normal file sizes scaled to `total` bytes (a few large files, many small ones)."""
    raw = [rng.lognormvariate(0, 1.1) for _ in range(files)]
    scale = total / sum(raw)
    return [max(64, int(r * scale)) for r in raw]


class FastImport:
    """A fast-import stream into a repo; commits on one branch with a fixed identity and advancing dates."""

    def __init__(self, repo: Path, start: int = 1_700_000_000, compression: int = -1):
        command = ["git", "-c", f"pack.compression={compression}", "fast-import", "--quiet", "--done"]
        self.proc = subprocess.Popen(command, cwd=repo, env=gitrepo.git_env(), stdin=subprocess.PIPE)
        self.time = start
        self.marks = 0

    def commit(self, ref: str, message: str, changes: dict[str, str | None], parent_mark: int | None = None) -> int:
        """Write a commit; `None` deletes a path. Returns its mark."""
        self.marks += 1
        self.time += 3600
        out = [
            f"commit {ref}\nmark :{self.marks}\ncommitter Bench Upstream <upstream@bench.invalid> {self.time} +0000\n"
        ]
        data = message.encode()
        out.append(f"data {len(data)}\n")
        chunks = [b"".join(part.encode() for part in out), data, b"\n"]
        if parent_mark is not None:
            chunks.append(f"from :{parent_mark}\n".encode())
        for path, text in changes.items():
            if text is None:
                chunks.append(f"D {path}\n".encode())
            else:
                blob = text.encode()
                chunks.append(f"M 100644 inline {path}\ndata {len(blob)}\n".encode() + blob + b"\n")
        self.proc.stdin.write(b"".join(chunks) + b"\n")
        return self.marks

    def finish(self) -> None:
        self.proc.stdin.write(b"done\n")
        self.proc.stdin.close()
        if self.proc.wait() != 0:
            raise RuntimeError("git fast-import failed")


def _two_patches(dest: Path, repo: Path, pin: str, texts: dict[str, str]) -> tuple[Path, ...]:
    """0001 edits the first two files, 0002 the third and the first again, right after 0001's lines."""
    names = list(texts)
    index = dest / "patches.index"

    def edit(text: str, at: int, marker: str) -> str:
        lines = text.split("\n")
        lines[at:at] = [f"# {marker}: reset the per-layer flags before each real step", "flags.clear()"]
        return "\n".join(lines)

    first = gitrepo.commit_files(
        repo,
        pin,
        {names[0]: edit(texts[names[0]], 20, "0001"), names[1]: edit(texts[names[1]], 30, "0001")},
        "fix: one",
        index,
    )
    second_text = edit(edit(texts[names[0]], 20, "0001"), 22, "0002")  # its context holds 0001's lines
    second = gitrepo.commit_files(
        repo, first, {names[2]: edit(texts[names[2]], 40, "0002"), names[0]: second_text}, "fix: two", index
    )
    out = dest / "bigtree-patches"
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for number, (commit, slug) in enumerate([(first, "fix-one"), (second, "fix-two")], start=1):
        path = out / f"{number:04d}-{slug}.patch"
        path.write_text(gitrepo.format_patch(repo, commit))
        paths.append(path)
    return tuple(paths)


@dataclasses.dataclass(frozen=True)
class History:
    """A bare repo with a long main history and a PR branch; the pin is the PR head."""

    repo: Path
    pin: str
    commits: int
    tip_files: int
    tip_bytes: int
    written_bytes: int  # new text written over the history (initial import included)


def history(
    dest: Path, commits: int, tip_files: int, tip_bytes: int, churn_bytes: int, seed: int = 2, compression: int = -1
) -> tuple[History, dict[str, str]]:
    """`commits` commits: main rewrites blocks of a few files per commit, adds files and deletes some (about
    `churn_bytes` of new text each), then a 3-commit PR on top whose head is the pin. Returns the repo and the
    pin's files; `compression` is the zlib level git stores objects with (-1: git's default).
    """
    rng = random.Random(seed)
    lines = Lines(rng, 40_000)
    repo = gitrepo.init(dest / "history.git", bare=True)
    stream = FastImport(repo, compression=compression)
    average = tip_bytes // tip_files
    paths = [_path(rng, n) for n in range(tip_files)]
    tree = {p: lines.text(s, p) for p, s in zip(paths, _sizes(rng, tip_files, tip_bytes))}
    written = sum(len(t) for t in tree.values())
    mark = stream.commit("refs/heads/main", "Initial import", dict(tree))
    next_number = tip_files
    for number in range(1, commits - 3):
        changes: dict[str, str | None] = {}
        budget = churn_bytes
        while budget > 0:
            roll = rng.random()
            if roll < 0.15 and len(tree) > tip_files // 2:  # a file removed
                path = rng.choice(list(tree))
                changes[path] = None
                del tree[path]
                continue
            if roll < 0.3 or not tree:  # a new file
                path = _path(rng, next_number)
                next_number += 1
                text = new = lines.text(min(budget, average), path)
            else:  # a block of a file rewritten
                path = rng.choice(list(tree))
                old = tree[path].split("\n")
                start = rng.randrange(len(old))
                span = max(1, min(len(old) - start, int(budget / lines.line_bytes)))
                new = lines.text(int(span * lines.line_bytes), f"{path} r{number}")
                old[start : start + span] = new.split("\n")[:-1]
                text = "\n".join(old)
            changes[path] = tree[path] = text
            budget -= len(new)
            written += len(new)
        mark = stream.commit("refs/heads/main", f"change {number}", changes, parent_mark=mark)
    for number in range(3):
        path = rng.choice(list(tree))
        new = lines.text(800, f"pr {number}")
        tree[path] = tree[path] + new
        written += len(new)
        mark = stream.commit("refs/heads/pr-1", f"pr: part {number}", {path: tree[path]}, parent_mark=mark)
    stream.finish()
    pin = gitrepo.git(repo, "rev-parse", "refs/heads/pr-1")
    gitrepo.git(repo, "update-ref", "refs/pull/1/head", pin)
    gitrepo.git(repo, "update-ref", "-d", "refs/heads/pr-1")
    found = History(
        repo, pin, gitrepo.count_commits(repo, "--all"), len(tree), sum(len(t.encode()) for t in tree.values()), written
    )
    return found, tree


@dataclasses.dataclass(frozen=True)
class CheckUpstream:
    """A history upstream with a vLLM-size tree at the pin, and two patches that apply to it in order."""

    history: History
    patches: tuple[Path, ...]


def check_upstream(dest: Path, files: int, total_bytes: int, commits: int, churn_bytes: int) -> CheckUpstream:
    found, tree = history(dest, commits, files, total_bytes, churn_bytes, seed=1, compression=1)
    targets = sorted(p for p in tree if p.endswith(".py") and tree[p].count("\n") > 60)[:3]
    return CheckUpstream(found, _two_patches(dest, found.repo, found.pin, {p: tree[p] for p in targets}))
