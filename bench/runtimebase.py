"""The vLLM-sized path on runtime images without python3 (examples/vllm, real 0.33.0, both platforms), as the root
config runs it on NVIDIA's CUDA runtime images: a minimal Debian without python3 (.ci/base-images.sh) stands in for
them. `lock` derives the Python base per platform (apt; arm64 under QEMU) and locks; `lock` again reuses the
derived bases; `image --push` writes, pushes and smoke-tests both platforms on them; `verify IMAGE` per platform;
then the amd64 base derived again, as a fresh runner would, and `lock --check` still fresh.

    python bench/runtimebase.py [--json OUT]     (needs `bash ci/setup.sh`; part `runtimebase` of bench/run.py)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

DOCKER = "/usr/bin/docker"
DERIVED_RE = re.compile(
    r"(linux/\w+): \S+ \(sha256:\S+\) [^:]+: base (\S+), it \+ python3 python3-venv by apt: .*? "
    r"\((in (\d+)s|made earlier)"
)


def carry(config: Path, env: dict, *args: str, timeout: float = 3600) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "--config", str(config), *args],
        cwd=config.parent,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return done, time.monotonic() - started


def derivations(err: str) -> dict[str, tuple[str, float | None]]:
    """Per platform, (the derived base's tag, the seconds its derivation took, None when made earlier)."""
    return {m.group(1): (m.group(2), float(m.group(4)) if m.group(4) else None) for m in DERIVED_RE.finditer(err)}


def measure_all(work: Path) -> dict:
    import dockerenv
    from test_locked_image import make_project

    services = dockerenv.load()
    pyless = {
        "linux/amd64": os.environ.get("CARRY_TEST_PYLESS_BASE") or dockerenv._settings()["CARRY_TEST_PYLESS_BASE"],
        "linux/arm64": os.environ.get("CARRY_TEST_PYLESS_BASE_ARM64")
        or dockerenv._settings()["CARRY_TEST_PYLESS_BASE_ARM64"],
    }
    work.mkdir(parents=True, exist_ok=True)
    run = uuid.uuid4().hex[:8]
    name = f"{services.registry}/carry-bench/pyless-{run}"
    sources = {}
    result: dict = {"image": name}
    try:
        for platform, image in pyless.items():  # this run's own copy: nothing derived earlier is reused
            ref = f"carry-bench/pyless-{run}:{platform.split('/')[1]}"
            subprocess.run(
                [DOCKER, "build", "--platform", platform, "--tag", ref, "-"],
                input=f"FROM {image}\nLABEL io.carry.bench.run={run}\n",
                text=True,
                capture_output=True,
                check=True,
                env={**os.environ, "DOCKER_BUILDKIT": "1"},
            )
            sources[platform] = ref
        config, env = make_project(work, services, name)
        text = config.read_text()
        for platform, runtime in (("linux/amd64", services.runtime_base), ("linux/arm64", services.runtime_base_arm64)):
            text = text.replace(f'{{runtime_image: "{runtime}"}}', f'{{runtime_image: "{sources[platform]}"}}')
        config.write_text(text)
        locked, result["lock_s"] = carry(config, env, "lock")
        assert locked.returncode == 0, locked.stderr[-3000:]
        result["derived"] = derivations(locked.stderr)
        again, result["lock_again_s"] = carry(config, env, "lock")
        assert again.returncode == 0 and again.stdout.count("up to date") == 2, again.stderr[-2000:]
        result["derived_again"] = derivations(again.stderr)
        pushed, result["image_s"] = carry(config, env, "image", "--push", "--json")
        assert pushed.returncode == 0, pushed.stderr[-3000:]
        found = json.loads(pushed.stdout)
        result["smoke"] = {p["platform"]: p["smoke"] for p in found["platforms"]}
        result["base_layers"] = {
            p["platform"]: sum(x["size"] for x in p["layers"] if x["name"] == "base") for p in found["platforms"]
        }
        ref = f"{name}:{(config.parent / 'VERSION').read_text().strip()}"
        result["verify_s"] = {}
        for platform in sources:
            verified, result["verify_s"][platform] = carry(config, env, "verify", ref, "--platform", platform)
            assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
        amd64 = result["derived"]["linux/amd64"][0]
        subprocess.run([DOCKER, "image", "rm", amd64], check=True, capture_output=True)
        checked, result["fresh_runner_s"] = carry(config, env, "lock", "--check", "--platform", "linux/amd64")
        assert checked.returncode == 0 and checked.stdout.strip() == "linux/amd64: fresh", checked.stderr[-2000:]
        result["derived_fresh"] = derivations(checked.stderr)
    finally:
        forget_derived(sources.values())
        dockerenv.forget(name)
    return result


def forget_derived(sources) -> None:
    """The bases carry derived from each of `sources` (by their label naming it), then the sources themselves."""
    for ref in sources:
        for line in subprocess.run(
            [DOCKER, "image", "ls", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}}", "carry-derived/python"],
            capture_output=True,
            text=True,
        ).stdout.split():
            labels = subprocess.run(
                [DOCKER, "image", "inspect", "--format", "{{json .Config.Labels}}", line],
                capture_output=True,
                text=True,
            ).stdout
            if f'"{ref}"' in labels:
                subprocess.run([DOCKER, "image", "rm", line], capture_output=True)
        subprocess.run([DOCKER, "image", "rm", ref], capture_output=True)


def report(result: dict) -> list[tuple[str, str, str, bool]]:
    rows = []
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
    fresh = result["derived_fresh"]["linux/amd64"][1]
    rows.append(
        (
            "lock of both platforms (fixed wheels, both derivations, uv)",
            f"{result['lock_s']:.0f} s; again {result['lock_again_s']:.1f} s = "
            f"{result['lock_again_s'] / result['lock_s']:.1%}",
            "<= 25%",
            result["lock_again_s"] <= 0.25 * result["lock_s"],
        )
    )
    rows.append(
        (
            "image --push, both platforms on the derived bases (smoke-tested)",
            f"{result['image_s']:.0f} s; base layers "
            + ", ".join(f"{p} {s / 1e6:.0f} MB" for p, s in sorted(result["base_layers"].items())),
            "",
            True,
        )
    )
    rows.append(
        (
            "verify IMAGE per platform",
            ", ".join(f"{p} {s:.0f} s" for p, s in sorted(result["verify_s"].items())),
            "",
            True,
        )
    )
    rows.append(
        (
            "a fresh runner: linux/amd64 derived again, lock --check",
            f"fresh; derived in {fresh:.0f} s, the check {result['fresh_runner_s']:.0f} s",
            "fresh",
            True,
        )
    )
    return rows


def main() -> int:
    import measure

    return measure.part_main("runtimebase", measure_all, report)


def bench(work: Path, row) -> list:
    """bench/run.py's part `runtimebase`."""
    return [row("runtimebase", m, v, t, ok if t else None) for m, v, t, ok in report(measure_all(work / "runtimebase"))]


if __name__ == "__main__":
    sys.exit(main())
