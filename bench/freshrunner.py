"""A fresh CI runner with the registry as its only state (issue 38), on examples/vllm's real 0.33.0 wheels, both
platforms, every figure from one run:

- runner A builds and pushes VERSION N cold: an empty carry cache, an empty download store (every locked wheel
  downloaded from the index), `image --push --discard-wheels` (as a CI runner that starts empty runs it), signed;
- `verify IMAGE` of VERSION N (both platforms) on runner A: the yardstick of the no-change run;
- four fresh runners (each an empty carry cache, an empty download store, the second Docker engine of
  tests/secondengine.py with only the base images), each taking one change from VERSION N (`--cache-from NAME:N`) as
  its own VERSION and running `image --push` on the default path, then `verify IMAGE --key` of what it pushed (issue
  49): (a) a Python-only patch added, (b) a carried patch edited in place, (c) a new patch that adds a Python module,
  (d) a patch dropped from the series;
- after each, runner A, warm, makes the same VERSION: its layers must be the fresh runner's, byte for byte;
- another fresh runner with no change at all (case a's VERSION again).

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

N = "20261201.1"
# The fresh runners' changes, each from VERSION N as its own VERSION (issue 49)
CASES = {
    "a": ("20261201.2", "a Python-only patch added (a comment in vllm/logger.py)"),
    "b": ("20261201.3", "a carried patch edited in place (0002: same name, new content)"),
    "c": ("20261201.4", "a new patch that adds a Python module (vllm/carry_probe.py)"),
    "d": ("20261201.5", "a patch dropped from the series (0002)"),
}

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


def _runner(work: Path, base: dict, engine: secondengine.Engine | None = None) -> dict:
    """A runner's environment: its own empty carry cache and download store (and the second engine, emptied)."""
    (work / "downloads").mkdir(parents=True)
    env = {**base, "CARRY_CACHE": str(work / "cache"), "CARRY_DOWNLOADS": str(work / "downloads")}
    if engine is not None:
        engine.empty()
        env["DOCKER_HOST"] = engine.host
    return env


def _fresh_run(project: Path, env: dict, root: Path, remote: Path, *args: str) -> dict:
    with DiskWatch(root, remote=remote) as disk:
        done, seconds = carry(project / "build.yaml", env, "image", "--push", "--json", *args, cwd=project)
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
    from lib import vllmpatches
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

        # fresh runners, each from VERSION N (--cache-from) with its own change, as its own VERSION; then runner A,
        # warm, makes the same VERSION: its layers must be the fresh runner's, byte for byte
        edited = project_a / "patches" / sorted(p.name for p in (project_a / "patches").glob("0002-*.patch"))[0]
        changes = {
            "a": {"0003-logger-say-carried.patch": vllmpatches.adding_a_line(history, "vllm/logger.py", "logger")},
            "b": {edited.name: vllmpatches.edited(history, edited)},
            "c": {"0003-vllm-add-carry-probe.patch": vllmpatches.adding_a_module(history)},
            "d": {edited.name: None},
        }
        bases = (services.runtime_base, services.runtime_base_arm64)
        with secondengine.started(bases, services.docker_host) as engine:
            for case, files in changes.items():
                version = CASES[case][0]
                project = work / f"case-{case}"
                shutil.copytree(project_a, project, ignore=shutil.ignore_patterns("dist"))
                for patch_name, text in files.items():
                    if text is None:
                        (project / "patches" / patch_name).unlink()
                    else:
                        (project / "patches" / patch_name).write_text(text)
                (project / "VERSION").write_text(f"{version}\n")
                env = _runner(work / f"fresh-{case}", base_env, engine)
                fresh = _fresh_run(project, env, work, remote, "--cache-from", f"{name}:{N}")
                verified, seconds = carry(
                    project / "build.yaml", env, "verify", f"{name}:{version}", "--key",
                    str(work / "keys" / "carry.pub"), cwd=project,
                )  # fmt: skip
                fresh["verify"] = {"seconds": seconds, "out": verified.stdout[-3000:]}
                project_w = work / f"case-{case}-warm"
                shutil.copytree(project, project_w, ignore=shutil.ignore_patterns("dist"))
                done, seconds = carry(project_w / "build.yaml", env_a, "image", "--push", "--json", cwd=project_w)
                fresh["warm"] = {"seconds": seconds, "result": json.loads(done.stdout), "err": done.stderr[-3000:]}
                result.setdefault("cases", {})[case] = fresh
                _keep(result)
                shutil.rmtree(work / f"fresh-{case}", ignore_errors=True)
            # a fresh runner with no change at all (case a's VERSION again)
            env_c = _runner(work / "runner-nochange", base_env, engine)
            project_c = work / "nochange"
            shutil.copytree(work / "case-a", project_c, ignore=shutil.ignore_patterns("dist"))
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
    cold, nochange = result["cold"], result["nochange"]
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
    for case, fresh in result["cases"].items():
        rows += _case_rows(case, fresh, cold, result["release_bytes"])
    ratio = nochange["seconds"] / result["verify_s"]
    rows.append(
        (
            "fresh runner, no change at all (case a's VERSION again)",
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


def _case_rows(case: str, fresh: dict, cold: dict, release_bytes: int) -> list[tuple[str, str, str, bool]]:
    """One fresh runner's change: time, downloads, pushes, smoke test, disk, verify --key, the warm machine's
    layers."""
    version, what = CASES[case]
    share = fresh["seconds"] / cold["seconds"]
    pep517 = fresh["err"].count("build: PEP 517")
    derived = fresh["err"].count("derive: from VERSION")
    envs = fresh["err"].count("env: making")
    rows = [
        (
            f"({case}) fresh runner, {what}, VERSION {version}, `image --push`",
            f"{fresh['seconds']:.1f} s = {share:.1%} of A's cold; {pep517} PEP 517 build(s), {envs} build "
            f"environment(s) made, {derived} fixed wheel(s) derived from VERSION N's rebuilt from its image",
            "<= 10% of A's cold, no PEP 517 build",
            share <= 0.10 and pep517 == 0,
        )
    ]
    platforms = fresh["result"]["platforms"]
    registry = platforms[-1]["registry"]
    downloaded = fresh["store"] + registry["received"] + fresh["mirror"]
    ratio = downloaded / release_bytes
    rows.append(
        (
            "  bytes downloaded",
            f"{downloaded / 1e6:,.1f} MB (download store {fresh['store'] / 1e6:,.1f} MB, registry "
            f"{registry['received'] / 1e6:,.2f} MB, mirror {fresh['mirror'] / 1e6:,.1f} MB) = {ratio:.3f}x the two "
            f"release wheels ({release_bytes / 1e6:,.1f} MB)",
            "<= 1.1x",
            ratio <= 1.1,
        )
    )
    trust = registry.get("trust", 0)
    sent, changed = registry["sent"] - trust, _pushed_layers(fresh["result"])
    written = [
        f"{p['platform']} {layer['name']}" for p in platforms for layer in p["layers"] if layer["action"] == "pushed"
    ]
    rows.append(
        (
            "  bytes pushed: the image (layers, configs, manifests, records), signatures and attestations besides",
            f"{sent:,} B = {sent / max(changed, 1):.3f}x the layers written ({changed:,} B: {', '.join(written)}); "
            f"{trust:,} B signed and attested",
            "only the fixed layer written",
            all(w.endswith("vllm-fixed") for w in written) and sent <= 1.1 * max(changed, 1) + 200_000,
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
    rows.append(("  peak disk", f"{fresh['peak_disk'] / 1e9:.2f} GB", "<= 3 GB", fresh["peak_disk"] <= 3e9))
    out = fresh["verify"]["out"]
    rows.append(
        (
            f"  `verify IMAGE --key` of VERSION {version}, both platforms",
            f"{fresh['verify']['seconds']:.1f} s",
            "passes",
            "verified" in out and "NOT verified" not in out,
        )
    )
    warm = fresh["warm"]["result"]["platforms"]
    same = all(
        [layer["digest"] for layer in w["layers"]] == [layer["digest"] for layer in f["layers"]]
        for w, f in zip(warm, platforms)
    )
    rows.append(
        (
            "  its layers against runner A's warm run of the same VERSION",
            f"warm run {fresh['warm']['seconds']:.1f} s; every layer digest {'the same' if same else 'NOT the same'}",
            "byte-identical",
            same,
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
