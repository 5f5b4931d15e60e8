"""A fresh CI runner with the registry as its only state (issue 38), on examples/vllm's real 0.33.0 wheels, both
platforms, every figure from one run:

- runner A builds and pushes VERSION N cold: an empty carry cache, an empty download store (every locked wheel
  downloaded from the index), `image --push --discard-wheels` (as a CI runner that starts empty runs it), signed;
- `verify IMAGE` of VERSION N (both platforms) on runner A: the yardstick of the no-change run;
- a fresh runner (an empty carry cache, an empty download store, the second Docker engine of tests/secondengine.py
  with only the base images) takes a Python-only patch change as VERSION N+1 and runs `image --push` on the default
  path; then `verify IMAGE --key` of what it pushed;
- runner A, warm, makes the same VERSION N+1: its layers must be the fresh runner's, byte for byte;
- another fresh runner with no change at all (VERSION N+1 again).

Measured: seconds (whole processes); bytes downloaded (what the download store received, the registry bodies carry
read, the mirror's objects); bytes pushed (every body carry sent to the registry) against the layers written; peak
disk of each run on this machine's filesystem, less what the registry's own storage grew by (for a CI runner the
registry is remote), sampled every second.

    python bench/freshrunner.py [--json OUT]      (needs `bash ci/setup.sh`; run under the heavy lock)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

N, N1 = "20261201.1", "20261201.2"

import secondengine  # noqa: E402
from diskwatch import DiskWatch, size_of  # noqa: E402


def carry(config: Path, env: dict, *args: str, cwd: Path | None = None, timeout: float = 3600) -> tuple:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "--config", str(config), *args],
        env={**os.environ, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise SystemExit(f"bench: {' '.join(args)} exited {done.returncode}\n{done.stderr[-4000:]}")
    return done, time.monotonic() - started


def _patch(work: Path, history: Path) -> str:
    """A Python-only patch: a comment line added to vllm/logger.py (no patch of the series touches it)."""
    scratch = work / "patchwork"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(history), str(scratch)], check=True)
    import realvllm

    subprocess.run(["git", "-C", str(scratch), "checkout", "-q", realvllm.V0_33_0, "--", "vllm/logger.py"], check=True)
    target = scratch / "vllm" / "logger.py"
    target.write_text(target.read_text() + "# carried by carry\n")
    diff = subprocess.run(
        ["git", "-C", str(scratch), "diff", "--", "vllm/logger.py"], capture_output=True, text=True, check=True
    ).stdout
    shutil.rmtree(scratch)
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: carry bench <bench@carry>\n"
        "Subject: [PATCH] logger: say it is carried\n\nUpstream-Status: Inappropriate [bench]\n---\n" + diff
    )


def _runner(work: Path, base: dict, engine: secondengine.Engine | None = None) -> dict:
    """A runner's environment: its own empty carry cache and download store (and the second engine, emptied)."""
    (work / "downloads").mkdir(parents=True)
    env = {**base, "CARRY_CACHE": str(work / "cache"), "CARRY_DOWNLOADS": str(work / "downloads")}
    if engine is not None:
        engine.empty()
        env["DOCKER_HOST"] = engine.host
    return env


def _fresh_run(project: Path, env: dict, root: Path, remote: Path) -> dict:
    with DiskWatch(root, remote=remote) as disk:
        done, seconds = carry(project / "build.yaml", env, "image", "--push", "--json", cwd=project)
    found = json.loads(done.stdout)
    mirrors = Path(env["CARRY_CACHE"]) / "mirrors"
    mirror = sum(size_of(path / "objects") for path in mirrors.glob("*.git")) if mirrors.is_dir() else 0
    return {
        "seconds": seconds,
        "peak_disk": disk.peak,
        "result": found,
        "err": done.stderr,
        "store": size_of(Path(env["CARRY_DOWNLOADS"])),
        "mirror": mirror,
    }


def _keep(result: dict) -> None:
    """What was measured so far, into $CARRY_BENCH_PARTIAL when set (a run takes half an hour)."""
    if os.environ.get("CARRY_BENCH_PARTIAL"):
        Path(os.environ["CARRY_BENCH_PARTIAL"]).write_text(json.dumps(result, indent=1))


def measure_all(work: Path) -> dict:
    import dockerenv
    import realvllm
    from lib.lockedvllm import make_project

    services = dockerenv.load()
    remote = dockerenv.env_file().parent / "registry" / "data"
    name = f"{services.registry}/carry-bench/fresh-{uuid.uuid4().hex[:8]}"
    result: dict = {"image": name}
    work.mkdir(parents=True, exist_ok=True)
    try:
        history = Path(realvllm.build(work / "history")["path"])
        config, base_env = make_project(work / "a", services, name, history)
        project_a = config.parent
        subprocess.run(
            [sys.executable, str(ROOT / "build.py"), "keygen", str(work / "keys")], check=True, capture_output=True
        )
        base_env = {**base_env, "CARRY_SIGNING_KEY": str(work / "keys" / "carry.key")}
        carry(config, {**base_env, "CARRY_CACHE": str(work / "lock-cache")}, "lock")
        shutil.rmtree(work / "lock-cache")
        release = sum(p.stat().st_size for p in Path(realvllm.download_store()).glob("*/vllm-0.33.0-*.whl"))
        result["release_bytes"] = release

        # runner A: VERSION N cold
        env_a = _runner(work / "runner-a", base_env)
        with DiskWatch(work, remote=remote) as disk:
            done, seconds = carry(config, env_a, "image", "--push", "--json", "--discard-wheels", cwd=project_a)
        result["cold"] = {
            "seconds": seconds,
            "peak_disk": disk.peak,
            "result": json.loads(done.stdout),
            "err": done.stderr,
        }
        _, result["verify_s"] = carry(config, env_a, "verify", f"{name}:{N}", cwd=project_a)
        _keep(result)

        # the fresh runner: a Python-only patch change as VERSION N+1
        project_b = work / "b"
        shutil.copytree(project_a, project_b, ignore=shutil.ignore_patterns("dist"))
        (project_b / "patches" / "0003-logger-say-carried.patch").write_text(_patch(work, history))
        (project_b / "VERSION").write_text(f"{N1}\n")
        bases = (services.runtime_base, services.runtime_base_arm64)
        with secondengine.started(bases, services.docker_host) as engine:
            env_b = _runner(work / "runner-b", base_env, engine)
            result["fresh"] = _fresh_run(project_b, env_b, work, remote)
            _keep(result)
            verified, seconds = carry(
                project_b / "build.yaml", env_b, "verify", f"{name}:{N1}", "--key", str(work / "keys" / "carry.pub"),
                cwd=project_b,
            )  # fmt: skip
            result["fresh_verify"] = {"seconds": seconds, "out": verified.stdout[-3000:]}
            # runner A, warm: the same VERSION N+1
            project_w = work / "w"
            shutil.copytree(project_b, project_w, ignore=shutil.ignore_patterns("dist"))
            done, seconds = carry(project_w / "build.yaml", env_a, "image", "--push", "--json", cwd=project_w)
            result["warm"] = {"seconds": seconds, "result": json.loads(done.stdout)}
            _keep(result)
            # a fresh runner with no change at all
            project_c = work / "c"
            shutil.copytree(project_b, project_c, ignore=shutil.ignore_patterns("dist"))
            env_c = _runner(work / "runner-c", base_env, engine)
            result["nochange"] = _fresh_run(project_c, env_c, work, remote)
            engine.empty()
    finally:
        dockerenv.forget(name)
        shutil.rmtree(work, ignore_errors=True)
    return result


def _pushed_layers(found: dict) -> int:
    return sum(layer["size"] for p in found["platforms"] for layer in p["layers"] if layer["action"] == "pushed")


def report(result: dict) -> list[tuple[str, str, str, bool]]:
    rows = []
    cold, fresh, nochange = result["cold"], result["fresh"], result["nochange"]
    gb = 1e9
    rows.append(
        (
            "runner A: VERSION N cold, both platforms (`image --push --discard-wheels`, empty cache and store)",
            f"{cold['seconds']:.0f} s; {_pushed_layers(cold['result']) / gb:.2f} GB of layers pushed",
            "",
            True,
        )
    )
    rows.append(("runner A: `verify IMAGE` of VERSION N, both platforms", f"{result['verify_s']:.1f} s", "", True))
    share = fresh["seconds"] / cold["seconds"]
    pep517 = fresh["err"].count("build: PEP 517")
    derived = fresh["err"].count("derive: from VERSION")
    rows.append(
        (
            "fresh runner: Python-only patch change, VERSION N+1, `image --push` (default path)",
            f"{fresh['seconds']:.1f} s = {share:.1%} of A's cold; {pep517} PEP 517 build(s), {derived} fixed wheel(s) "
            f"derived from VERSION N's rebuilt from its image",
            "<= 10% of A's cold",
            share <= 0.10,
        )
    )
    platforms = fresh["result"]["platforms"]
    received = platforms[-1]["registry"]["received"]
    downloaded = fresh["store"] + received + fresh["mirror"]
    ratio = downloaded / result["release_bytes"]
    rows.append(
        (
            "  bytes downloaded",
            f"{downloaded / 1e6:,.1f} MB (download store {fresh['store'] / 1e6:,.1f} MB, registry "
            f"{received / 1e6:,.2f} MB, mirror {fresh['mirror'] / 1e6:,.1f} MB) = {ratio:.3f}x the two release "
            f"wheels ({result['release_bytes'] / 1e6:,.1f} MB)",
            "<= 1.1x",
            ratio <= 1.1,
        )
    )
    registry = platforms[-1]["registry"]
    trust = registry.get("trust", 0)
    sent, changed = registry["sent"] - trust, _pushed_layers(fresh["result"])
    written = [
        f"{p['platform']} {layer['name']}" for p in platforms for layer in p["layers"] if layer["action"] == "pushed"
    ]
    rows.append(
        (
            "  bytes pushed: the image (layers, configs, manifests, records)",
            f"{sent:,} B = {sent / changed:.3f}x the layers written ({changed:,} B: {', '.join(written)})",
            "<= 1.1x",
            sent <= 1.1 * changed,
        )
    )
    rows.append(
        (
            "  bytes pushed besides, with $CARRY_SIGNING_KEY: signatures and attestations (SBOM, provenance)",
            f"{trust:,} B; everything sent {registry['sent']:,} B = {registry['sent'] / changed:.3f}x the layers "
            f"written (each platform's SBOM, its 198 distributions, is signed anew for each VERSION)",
            "",
            True,
        )
    )
    smokes = [p["smoke_record"]["how"] if p.get("smoke_record") else "none" for p in platforms]
    rows.append(
        (
            "  smoke test",
            "; ".join(p["smoke"] or "" for p in platforms)[:600],
            "light, nothing pulled",
            all(s == "light" for s in smokes) and all(p["engine"] is None for p in platforms),
        )
    )
    rows.append(
        (
            "  peak disk",
            f"{fresh['peak_disk'] / gb:.2f} GB",
            "<= 3 GB",
            fresh["peak_disk"] <= 3e9,
        )
    )
    ok = "verified" in result["fresh_verify"]["out"] and "NOT verified" not in result["fresh_verify"]["out"]
    rows.append(
        (
            "  `verify IMAGE --key` of VERSION N+1, both platforms",
            f"{result['fresh_verify']['seconds']:.1f} s",
            "passes",
            ok,
        )
    )
    same = all(
        [layer["digest"] for layer in w["layers"]] == [layer["digest"] for layer in f["layers"]]
        for w, f in zip(result["warm"]["result"]["platforms"], platforms)
    )
    rows.append(
        (
            "  its layers against runner A's warm VERSION N+1",
            f"warm run {result['warm']['seconds']:.1f} s; every layer digest {'the same' if same else 'NOT the same'}",
            "byte-identical",
            same,
        )
    )
    ratio = nochange["seconds"] / result["verify_s"]
    rows.append(
        (
            "fresh runner, no change at all (VERSION N+1 again)",
            f"{nochange['seconds']:.1f} s = {ratio:.2f}x `verify IMAGE` ({result['verify_s']:.1f} s); layers written: "
            f"{_pushed_layers(nochange['result'])} B",
            "<= 1.5x verify IMAGE",
            ratio <= 1.5,
        )
    )
    rows.append(
        (
            "peak disk, runner A's cold two-platform build",
            f"{cold['peak_disk'] / gb:.2f} GB",
            "<= 14 GB",
            cold["peak_disk"] <= 14e9,
        )
    )
    return rows


def main() -> int:
    import measure

    return measure.part_main("fresh", measure_all, report)


def bench(work: Path, row) -> list:
    """bench/run.py's part `fresh`."""
    return [row("fresh", m, v, t, ok if t else None) for m, v, t, ok in report(measure_all(work / "fresh"))]


if __name__ == "__main__":
    sys.exit(main())
