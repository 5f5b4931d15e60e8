"""`check` and `status` on the real vLLM history: the 0.32.0 -> 0.33.0 releases from PyPI as git history
(examples/vllm/make_upstream.py), the PR stand-in as the pin, the five patches of tests/data/vllm-cases/, and
examples/vllm's own build.yaml (its build: and image: sections: arches, gate rules, precompiled pins, platforms,
the lock), which every command reads and checks.

Measured in one run, interleaved so that the machine's noise hits both sides alike:
- `build.py check` whole process against `python -c 'import click, yaml'` (what any click + YAML CLI pays to start),
  as a CI job reruns it (the series already checked on that base: the answer is read back), and the first time;
- both in an interpreter that runs carry as a user's install does (measure.installed_python: no .pth hooks, no
  `pip install -e` finder), which is the target; and both in this machine's own interpreter, reported;
- `build.py check` against the naive way on the same real tree: clone the upstream, fetch the PR, check out the pin,
  `git apply` each patch;
- `build.py status --against v0.33.0` (a release tag, 8,515 files) whole process, without `--test`;
- carry's own import time in `check` (`python -X importtime`) and the modules it loads beyond click and yaml.

Bytecode: an installed carry, like click and yaml in site-packages, has its .pyc files. Every Python run here writes
and reads bytecode under a private PYTHONPYCACHEPREFIX (PYTHONDONTWRITEBYTECODE removed), after a warm-up run, so a
checkout's carry is measured as it would run installed, and the baseline in the same conditions.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import measure

ROOT = Path(__file__).resolve().parent.parent
BUILD_PY = ROOT / "build.py"
MAKE_UPSTREAM = ROOT / "examples" / "vllm" / "make_upstream.py"
CASES = ROOT / "tests" / "data" / "vllm-cases"
EXAMPLE_CONFIG = ROOT / "examples" / "vllm" / "build.yaml"
MINIMAL_SECTIONS = "build:\n  cuda_arches: []\n"  # what this part measured before 2026-12-02
PR_NUMBER = 53899
PAIRS = 11  # check and the baseline, interleaved: the machine is shared, so many pairs and their medians
IMPORT_RE = re.compile(r"^import time:\s+(\d+) \|\s+\d+ \|\s+(\S.*)$", re.M)


def env_for(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARRY_", "CCACHE_", "SCCACHE_"))}
    env["CARRY_CACHE"] = str(work / "cache")
    env["CARRY_DOWNLOADS"] = measure.downloads()
    return measure.bytecode_env(env, work)


def history(env: dict[str, str]) -> dict:
    import json

    result = measure.run([sys.executable, str(MAKE_UPSTREAM), "--no-link", "--json"], env).check()
    return json.loads(result.out)


def project(work: Path, upstream: str, pin: str, sections: str | None = None) -> Path:
    """The vLLM cases' series on the pin, with examples/vllm's build: and image: sections (or `sections`)."""
    root = work / ("project" if sections is None else "project-minimal")
    shutil.copytree(CASES / "patches", root / "patches")
    shutil.copytree(CASES / "checks", root / "checks")
    (root / "VERSION").write_text("20261201.1\n")
    if sections is None:
        text = EXAMPLE_CONFIG.read_text()
        sections = text[text.index("\nbuild:\n") + 1 :]
    config = root / "build.yaml"
    config.write_text(f"upstream:\n  url: {upstream}\n  pr: {PR_NUMBER}\n  commit: {pin}\n  main: main\n{sections}")
    return config


def naive(work: Path, url: str, pin: str, patches: list[Path], index: int) -> float:
    """What a CI job does without carry on the real tree: clone, fetch the PR, check out the pin, apply each patch."""
    dest = work / f"naive-{index}"
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "b",
        "GIT_AUTHOR_EMAIL": "b@b",
        "GIT_COMMITTER_NAME": "b",
        "GIT_COMMITTER_EMAIL": "b@b",
    }
    steps = [
        ["git", "clone", "-q", "--no-checkout", url, str(dest)],
        ["git", "-C", str(dest), "fetch", "-q", "origin", f"refs/pull/{PR_NUMBER}/head"],
        ["git", "-C", str(dest), "checkout", "-q", "--detach", pin],
        *(["git", "-C", str(dest), "apply", str(patch)] for patch in patches),
    ]
    total = sum(measure.run(step, env).check().wall_s for step in steps)
    shutil.rmtree(dest)
    return total


def carry_imports(python: Path, config: Path, env: dict[str, str]) -> tuple[float, list[str]]:
    """carry's own import time in `check` (ms) and the modules `check` loads that `import click, yaml` does not."""
    run = measure.run([str(python), "-X", "importtime", str(BUILD_PY), "--config", str(config), "check"], env)
    floor = measure.run([str(python), "-X", "importtime", "-c", "import click, yaml"], env)
    base = {name.strip() for _, name in IMPORT_RE.findall(floor.err)}
    found = IMPORT_RE.findall(run.err)
    ms = sum(int(us) for us, name in found if name.strip().startswith("carry")) / 1000
    return ms, [name.strip() for _, name in found if name.strip() not in base]


def bench(work: Path, size, Row) -> list:
    work.mkdir(parents=True, exist_ok=True)
    env = env_for(work)
    python = measure.installed_python(work)
    built = history(env)
    upstream, pin = built["path"], built["refs"][f"refs/pull/{PR_NUMBER}/head"]
    config = project(work, upstream, pin)
    minimal = project(work, upstream, pin, MINIMAL_SECTIONS)
    files = len(
        subprocess.run(
            ["git", "-C", upstream, "ls-tree", "-r", "--name-only", "v0.33.0"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    )
    argv = {
        "check": [str(python), str(BUILD_PY), "--config", str(config), "check"],
        "base": [str(python), "-c", "import click, yaml"],
        "minimal": [str(python), str(BUILD_PY), "--config", str(minimal), "check"],
        "here": [sys.executable, str(BUILD_PY), "--config", str(config), "check"],
        "here_base": [sys.executable, "-c", "import click, yaml"],
        "help": [str(python), str(BUILD_PY), "--help"],
        "click": [str(python), "-c", "import click"],
    }
    status_argv = [str(python), str(BUILD_PY), "--config", str(config), "status", "--against", "v0.33.0"]
    for command in (*argv.values(), status_argv):  # fetch the pin, write the bytecode
        measure.run(command, env).check()
    times: dict[str, list[float]] = {name: [] for name in (*argv, "fresh")}
    statuses = []
    remembered = next(Path(env["CARRY_CACHE"], "mirrors").iterdir()) / "carry" / "checks"
    for _ in range(PAIRS):
        for name, command in argv.items():
            times[name].append(measure.run(command, env).check().wall_s)
        shutil.rmtree(remembered)  # as if this series had never been checked on this base
        times["fresh"].append(measure.run(argv["check"], env).check().wall_s)
    for _ in range(3):
        statuses.append(measure.run(status_argv, env).check().wall_s)
    patches = sorted((config.parent / "patches").glob("*.patch"))
    naives = [naive(work, f"file://{upstream}", pin, patches, i) for i in range(size.naive_repeats)]
    median = {name: measure.median(values) for name, values in times.items()}
    ours, base, status = median["check"], median["base"], measure.median(statuses)
    theirs = measure.median(naives)
    imports, loaded = carry_imports(python, config, env)
    source_env = {**env, "PYTHONDONTWRITEBYTECODE": "1"}
    source_env.pop("PYTHONPYCACHEPREFIX")
    from_source = measure.median([measure.run(argv["check"], source_env).check().wall_s for _ in range(5)])
    own = sorted(name for name in loaded if name.startswith("carry"))
    return [
        Row(
            "vllm",
            "real history (PyPI sdists 0.32.0 -> 0.33.0, PR stand-in)",
            f"{files} files at v0.33.0; {len(patches)} patches on the PR head {pin[:12]}; examples/vllm's build.yaml",
        ),
        Row(
            "vllm",
            "`python -c 'import click, yaml'` (whole process, as installed)",
            f"{base * 1000:.0f} ms (median of {len(times['base'])})",
        ),
        Row(
            "vllm",
            "`build.py check` (whole process, mirror fetched, as installed)",
            f"{ours * 1000:.0f} ms = {ours / base:.2f}x the click+yaml start-up; carry's own imports {imports:.0f} ms",
            "<= 1.5x click+yaml",
            ours <= 1.5 * base,
        ),
        Row(
            "vllm",
            "`build.py --help` (whole process, as installed: every command listed, none imported)",
            f"{median['help'] * 1000:.0f} ms = {median['help'] / base:.2f}x the click+yaml start-up, "
            f"{(median['help'] - median['click']) * 1000:+.0f} ms on `import click` alone "
            f"({median['click'] * 1000:.0f} ms)",
            "<= 60 ms",
            median["help"] <= 0.060,
        ),
        Row(
            "vllm",
            "  modules it loads beyond click and yaml",
            f"{len(loaded)}, {len(own)} of them carry's (the list: tests/test_spine.py)",
        ),
        Row(
            "vllm",
            "  with a minimal build.yaml (build: cuda_arches: [] only)",
            f"{median['minimal'] * 1000:.0f} ms = {median['minimal'] / base:.2f}x the click+yaml start-up",
        ),
        Row(
            "vllm",
            "  in this machine's interpreter (pip install -e finder, .pth hooks)",
            f"{median['here'] * 1000:.0f} ms = {median['here'] / median['here_base']:.2f}x its click+yaml start-up "
            f"({median['here_base'] * 1000:.0f} ms)",
        ),
        Row(
            "vllm",
            "  the same series never checked on this base before",
            f"{median['fresh'] * 1000:.0f} ms = {median['fresh'] / base:.2f}x the click+yaml start-up (git apply and "
            f"write-tree on the {files:,}-file index; then the result is kept)",
        ),
        Row(
            "vllm",
            "  with PYTHONDONTWRITEBYTECODE=1 (carry compiled from source every run)",
            f"{from_source * 1000:.0f} ms = {from_source / base:.2f}x the click+yaml start-up (which still reads "
            f"site-packages' .pyc files)",
        ),
        Row(
            "vllm",
            "naive: clone, fetch PR, checkout, git apply x5",
            f"{theirs * 1000:.0f} ms = {theirs / ours:.1f}x carry's check",
            ">= 10x carry's",
            theirs >= 10 * ours,
        ),
        Row(
            "vllm",
            "`build.py status --against v0.33.0` (whole process)",
            f"{status:.2f} s (median of {len(statuses)}); PR state from git, 5 verdicts with history",
            "<= 3 s",
            status <= 3.0,
        ),
    ]
