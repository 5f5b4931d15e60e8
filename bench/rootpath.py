"""The mission's own path, from a fresh clone, with no hand step: a config shaped like the root build.yaml (a PR on
vLLM's history, the patches, a `nightly` block whose index comes from the environment, the Python runtime base left
to carry, Python-less runtime images for linux/amd64 and linux/arm64, no runtime-lock/ yet) pointed at the replica
of vLLM's per-commit wheel index (tests/nightlyindex.py: the real 0.33.0 wheels as the cu130 nightlies of the
PR's merge-base) and at a Python-less stand-in for NVIDIA's CUDA runtime images (.ci/base-images.sh).

carry runs from a fresh `git clone` of this repository's HEAD; the download store is warm (the released wheels),
carry's cache is empty. Timed, one after the other: `pin` (the merge-base, the index, both wheels downloaded and
hashed, build.yaml written), `lock` (the fixed wheels, both Python bases derived, uv), `image --push` (both
platforms written, pushed, pulled back and smoke-tested), `verify IMAGE` per platform; then `lock --check` on a
runner that has the derived bases (the cached cost); then the PR head moves (the replica's PR rebased onto A2, whose
nightlies the index does not hold) and `follow`, with no REF, re-pins to it on a branch of its own, pins the
nightlies again (walked back to A1, Python-only between), refreshes the lock, bumps VERSION and builds both fixed
wheels (no `suite`: the root config has no build.upstream_tests): exit 0 (issue 48). The root's patches target PR
#53899's code, which the replica's PR stand-in does not hold: examples/vllm's series (real patches on 0.33.0) stands
in for them.

    python bench/rootpath.py [--json OUT]     (needs `bash ci/setup.sh`; part `rootpath` of bench/run.py)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "tests")]

import runtimebase  # noqa: E402  (bench/runtimebase.py: the derivation lines, the derived images' clean-up)

PR = 53899
VAR = "CARRY_NIGHTLY_INDEX"  # the variable the root config and the workflow name
DOCKER = runtimebase.DOCKER


def carry(clone: Path, config: Path, env: dict, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(clone / "build.py"), "--config", str(config), *args],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        stdin=subprocess.DEVNULL,
    )
    return done, time.monotonic() - started


def replica(work: Path, history: Path) -> tuple[dict[str, str], Path, int]:
    """The history grown as tests/nightlyindex.py grows it, and the index of the merge-base A1 (both CPUs' wheels)."""
    import nightlyindex as ni
    from carry.source import releases

    repo = work / "upstream.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", "--shared", str(history), str(repo)], check=True)
    sha = {name: ni.git(repo, "rev-parse", f"v{name[1:]}^{{commit}}") for name in ("v0.32.0", "v0.33.0")}
    ni.grow(repo, sha, PR)
    names = ("vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl", "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl")
    served = [
        ni.reversion(wheel, work / "wheels", ni.nightly_version("0.33.1", 1, sha["A1"], "cu130"))
        for wheel in releases.fetch(ROOT / "examples" / "vllm" / "releases.yaml", list(names))
    ]
    ni.publish(work / "index", sha["A1"], served)
    shutil.rmtree(work / "wheels")
    return sha, repo, sum(path.stat().st_size for path in (work / "index").rglob("*.whl"))


def project(clone: Path, work: Path, repo: Path, pin: str, name: str, services, pyless: dict[str, str]) -> Path:
    """The clone's examples/vllm (its series and build section), on the replica's PR commit, its pins replaced by the
    root's nightly block, its image section the root's shape on the test registry and the Python-less bases."""
    import nightlyindex as ni

    text = (ROOT / "build.yaml").read_text()
    nightly = re.search(r"\n    nightly:\n(?:      .*\n)+", text)
    assert nightly and f"${{{VAR}}}" in nightly.group(0), "the root config reads its index from the environment"
    packages = re.search(r"\n(  runtime_packages: .*\n)", text)  # the compiler Triton and FlashInfer's JIT need
    assert packages, "the root config names the runtime packages its image needs"
    config = ni.make_project(clone / "examples" / "vllm", work / "project", repo, pin, PR, nightly.group(0)[1:])
    shutil.rmtree(config.parent / "runtime-lock")  # the root has none: `lock` writes it
    text = config.read_text()
    config.write_text(
        text[: text.index("\nimage:\n") + 1]
        + f'image:\n  name: {name}\n  tags: ["{{version}}", latest]\n  runtime_python: auto\n{packages.group(1)}'
        + "  platforms:\n"
        + "".join(f'    {platform}: {{runtime_image: "{ref}"}}\n' for platform, ref in pyless.items())
        + "  lock: runtime-lock\n  entrypoint: [vllm, serve]\n"
        + "  env: {CUDA_HOME: /opt/venv/lib/python3.11/site-packages/nvidia/cu13}\n"
    )
    subprocess.run(["git", "-C", str(config.parent), "init", "-q"], check=True, capture_output=True)
    commit(config.parent, "the project as its maintainer wrote it")
    return config


def commit(project: Path, message: str) -> None:
    """The project's work tree committed as its maintainer would: its build outputs (dist/) left out."""
    for args in (
        ("add", "-A", "--", ".", ":(exclude)dist"),
        ("-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-qm", message),
    ):
        subprocess.run(["git", "-C", str(project), *args], check=True, capture_output=True)


def measure_all(work: Path) -> dict:
    import dockerenv
    import nightlyindex as ni
    import realvllm

    services = dockerenv.load()
    settings = dockerenv._settings()
    work.mkdir(parents=True, exist_ok=True)
    run = uuid.uuid4().hex[:8]
    name = f"{services.registry}/carry-bench/root-{run}"
    clone = work / "carry"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    result: dict = {
        "image": name,
        "commit": subprocess.run(
            ["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip(),
    }
    history = Path(realvllm.build(work / "history")["path"])
    sha, repo, result["index_bytes"] = replica(work, history)
    pyless = {}
    for platform, key in (("linux/amd64", "CARRY_TEST_PYLESS_BASE"), ("linux/arm64", "CARRY_TEST_PYLESS_BASE_ARM64")):
        ref = f"carry-bench/root-pyless-{run}:{platform.split('/')[1]}"  # this run's own: nothing derived earlier
        subprocess.run(
            [DOCKER, "build", "--platform", platform, "--tag", ref, "-"],
            input=f"FROM {os.environ.get(key) or settings[key]}\nLABEL io.carry.bench.run={run}\n",
            text=True,
            capture_output=True,
            check=True,
            env={**os.environ, "DOCKER_BUILDKIT": "1"},
        )
        pyless[platform] = ref
    server = ni.Server(work / "index")
    try:
        config = project(clone, work, repo, sha["P1"], name, services, pyless)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CARRY_", "CCACHE_", "SCCACHE_"))}
        env.update(
            {
                VAR: server.url,
                "CARRY_CACHE": str(work / "cache"),
                "CARRY_DOWNLOADS": realvllm.download_store(),
                "CARRY_REGISTRY_USER": services.registry_user,
                "CARRY_REGISTRY_PASSWORD": services.registry_password(),
            }
        )
        steps: dict[str, float] = {}
        pinned, steps["pin"] = carry(clone, config, env, "pin")
        assert pinned.returncode == 0, pinned.stderr[-3000:]
        result["pin_out"] = pinned.stdout
        checked, steps["pin --check"] = carry(clone, config, env, "pin", "--check")
        assert checked.returncode == 0, checked.stderr[-2000:]
        locked, steps["lock"] = carry(clone, config, env, "lock")
        assert locked.returncode == 0, locked.stderr[-3000:]
        result["derived"] = runtimebase.derivations(locked.stderr)
        pushed, steps["image --push"] = carry(clone, config, env, "image", "--push", "--json")
        assert pushed.returncode == 0, pushed.stderr[-3000:]
        found = json.loads(pushed.stdout)
        result["smoke"] = {p["platform"]: p["smoke"] for p in found["platforms"]}
        ref = f"{name}:{(config.parent / 'VERSION').read_text().strip()}"
        for platform in pyless:
            verified, steps[f"verify {platform}"] = carry(clone, config, env, "verify", ref, "--platform", platform)
            assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
        fresh, steps["lock --check"] = carry(clone, config, env, "lock", "--check")
        assert fresh.returncode == 0, fresh.stderr[-2000:]
        result["derived_again"] = runtimebase.derivations(fresh.stderr)
        result["written"] = subprocess.run(  # what carry wrote in the project (nothing else touched it)
            ["git", "-C", str(config.parent), "status", "--porcelain", "--untracked-files=all"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        # The PR head moves: the replica's refs/pull/53899/head is P2, the PR rebased onto A2 (whose nightlies the
        # index does not hold). The maintainer commits what pin and lock wrote; `follow`, with no REF, takes the
        # PR head, re-pins to it and builds, on a branch of its own.
        commit(config.parent, "pin and lock, as carry wrote them")
        followed, steps["follow (the PR head)"] = carry(clone, config, env, "follow", "--json")
        assert followed.returncode == 0, followed.stdout[-3000:] + followed.stderr[-3000:]
        result["follow"] = json.loads(followed.stdout)
        result["follow_sha"] = {"P1": sha["P1"], "P2": sha["P2"]}
        result["follow_config"] = subprocess.run(
            ["git", "-C", str(config.parent), "show", f"{result['follow']['branch']}:build.yaml"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        result["steps"] = steps
    finally:
        server.stop()
        runtimebase.forget_derived(pyless.values())
        dockerenv.forget(name)
    return result


def report(result: dict) -> list[tuple[str, str, str, bool]]:
    rows = [
        (
            "replica index at the merge-base A1 (real 0.33.0 wheels as cu130 nightlies)",
            f"{result['index_bytes'] / 1e6:.0f} MB",
            "",
            True,
        ),
        ("pins written by `pin`", "; ".join(result["pin_out"].strip().splitlines()), "", True),
    ]
    rows += [(f"`{step}`", f"{seconds:.1f} s", "", True) for step, seconds in result["steps"].items()]
    for platform, (_, seconds) in sorted(result["derived"].items()):
        again = result["derived_again"].get(platform, ("", None))[1]
        rows.append(
            (
                f"{platform}: Python base derived (apt{', QEMU' if platform == 'linux/arm64' else ''})",
                f"first {seconds:.0f} s; then {'made earlier' if again is None else f'{again:.0f} s'}",
                "reused",
                again is None,
            )
        )
    written = sorted(line[3:] for line in result["written"].splitlines())
    outputs = [path for path in written if path.startswith("dist/")]  # the wheels, their gate reports, the SBOMs
    inputs = [path for path in written if not path.startswith("dist/")]
    rows.append(
        (
            "what the path wrote in the project besides dist/ (git status; no hand edit between the steps)",
            f"{', '.join(inputs)} (and {len(outputs)} file(s) in dist/)",
            "build.yaml + the two locks",
            inputs == ["build.yaml", "runtime-lock/linux-amd64.txt", "runtime-lock/linux-arm64.txt"],
        )
    )
    followed, sha = result["follow"], result["follow_sha"]
    pinned = re.search(r"\n  commit: ([0-9a-f]{40})", result["follow_config"])
    rows.append(
        (
            "`follow` (no REF): the PR head moved from P1 to P2 (rebased onto A2); the branch's pin",
            f"{followed['ref']} at {followed['commit'][:12]}, branch {followed['branch']}, build.yaml's commit "
            f"{pinned.group(1)[:12] if pinned else '?'}; exit {followed['exit']}",
            f"P2 {sha['P2'][:12]}, exit 0",
            followed["exit"] == 0 and followed["commit"] == sha["P2"] and bool(pinned) and pinned.group(1) == sha["P2"],
        )
    )
    for step in followed["steps"]:
        rows.append(
            (f"  follow: {step['step']}", f"{step['seconds']:.1f} s; " + "; ".join(step["lines"][-2:]), "", True)
        )
    return rows


def main() -> int:
    import measure

    return measure.part_main("rootpath", measure_all, report)


def bench(work: Path, row) -> list:
    """bench/run.py's part `rootpath`."""
    return [row("rootpath", m, v, t, ok if t else None) for m, v, t, ok in report(measure_all(work / "rootpath"))]


if __name__ == "__main__":
    sys.exit(main())
