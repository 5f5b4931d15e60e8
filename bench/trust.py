"""Signing, SBOM and provenance on the real vLLM image (examples/vllm, real 0.33.0, both platforms): `image --push`
with $CARRY_SIGNING_KEY, the seconds it spends on the SBOM, the provenance and the signatures (its --json `trust`
part) against the whole push (wall clock); the SBOM's size and component count per platform against the lock's
packages + the fixed wheel; `verify IMAGE --platform P --key PUB` against plain `verify IMAGE --platform P`.

    python bench/trust.py [--json OUT]      (needs `bash ci/setup.sh`; part `trust` of bench/run.py)

Everything it makes (a temp project, its cache, the registry repository) is removed afterwards; the locked wheels
stay in the download store, as every vLLM run leaves them.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(HERE)]

import measure  # noqa: E402

SHARE = 0.05  # SBOM + provenance + signatures <= this share of the whole push
VERIFY_KEY_RATIO = 1.25  # verify --key <= this x plain verify


def _carry(config: Path, env: dict, cwd: Path, *args: str) -> measure.Measured:
    return measure.run([sys.executable, str(ROOT / "build.py"), "--config", str(config), *args], env, cwd=cwd).check()


def measure_all(work: Path) -> dict:
    import os

    import dockerenv
    from test_locked_image import make_project

    services = dockerenv.load()
    work.mkdir(parents=True, exist_ok=True)
    name = f"{services.registry}/carry-bench/trust-{uuid.uuid4().hex[:8]}"
    result: dict = {"image": name, "free_before_gb": round(shutil.disk_usage(work).free / 1e9, 1)}
    try:
        config, env = make_project(work, services, name)
        env = {**os.environ, **env}
        project = config.parent
        _carry(config, env, project, "lock")
        keys = work / "keys"
        _carry(config, env, project, "keygen", str(keys))
        env["CARRY_SIGNING_KEY"] = str(keys / "carry.key")
        pushes = []
        for label in ("first push (download store as found)", "push again, nothing changed"):
            run = _carry(config, env, project, "image", "--push", "--no-smoke", "--json")
            found = json.loads(run.out)
            pushes.append({"label": label, "wall_s": run.wall_s, "trust": found["trust"], "pushed": found["pushed"]})
        result["pushes"] = pushes
        sboms = {}
        for published in pushes[0]["trust"]["published"]:
            if published.get("sbom"):
                path = project / published["sbom"]
                sboms[published["platform"]] = {
                    "file": path.name,
                    "bytes": path.stat().st_size,
                    "components": published["components"],
                }
        from carry import config as config_module
        from carry.image.locked import runtimelock
        from carry.platforms import Platform

        loaded = config_module.load(config)
        for platform, entry in sboms.items():
            entry["lock_packages"] = len(runtimelock.read(loaded, Platform.parse(platform, "bench")).packages)
        result["sboms"] = sboms
        ref = next(ref for ref in pushes[0]["pushed"] if not ref.rsplit(":", 1)[1].endswith(("amd64", "arm64")))
        env.pop("CARRY_SIGNING_KEY")
        verifies = {}
        for platform in ("linux/amd64", "linux/arm64"):
            plain = _carry(config, env, project, "verify", ref, "--platform", platform)
            keyed = _carry(
                config, env, project, "verify", ref, "--platform", platform, "--key", str(keys / "carry.pub")
            )
            proven = [
                line.strip()
                for line in keyed.out.splitlines()
                if line.strip().startswith(("signature:", "SBOM:", "provenance:", "trust checks:"))
            ]
            own = next((line.split()[-2] for line in proven if line.startswith("trust checks:")), "nan")
            verifies[platform] = {
                "plain_s": plain.wall_s,
                "key_s": keyed.wall_s,
                "trust_s": float(own),
                "plain_cpu_s": plain.cpu_s,
                "key_cpu_s": keyed.cpu_s,
                "others_cpu_s": plain.others_cpu_s + keyed.others_cpu_s,
                "proven": proven,
            }
        result["verify"] = verifies
    finally:
        dockerenv.remove_repository(name)
        shutil.rmtree(work, ignore_errors=True)
    return result


def report(result: dict) -> list[tuple[str, str, str, bool | None]]:
    rows: list[tuple[str, str, str, bool | None]] = []
    for platform, entry in sorted(result["sboms"].items()):
        wanted = entry["lock_packages"] + 1
        rows.append(
            (
                f"{platform} SBOM ({entry['file']})",
                f"{entry['bytes'] / 1e3:,.1f} kB, {entry['components']} components = the lock's "
                f"{entry['lock_packages']} packages + the fixed wheel",
                f"= {wanted}",
                entry["components"] == wanted,
            )
        )
    for push in result["pushes"]:
        seconds = push["trust"]["seconds"]
        spent = sum(seconds.values())
        share = spent / push["wall_s"]
        rows.append(
            (
                f"`image --push` signed, {push['label']}: facts + SBOM + provenance + signatures",
                f"{spent:.1f} s (facts: hashing the wheels {seconds['facts']:.1f} s, SBOM {seconds['sbom']:.1f} s, "
                f"provenance {seconds['provenance']:.2f} s, signatures and attachments {seconds['signatures']:.1f} s) "
                f"of {push['wall_s']:.0f} s = {share:.1%}",
                f"<= {SHARE:.0%}" if push is result["pushes"][0] else "",
                share <= SHARE if push is result["pushes"][0] else None,
            )
        )
    for platform, entry in sorted(result["verify"].items()):
        ratio = entry["key_s"] / entry["plain_s"]
        rows.append(
            (
                f"`verify IMAGE --platform {platform} --key` against plain verify",
                f"{entry['key_s']:.1f} s against {entry['plain_s']:.1f} s = {ratio:.2f}x (the trust checks "
                f"themselves {entry.get('trust_s', float('nan')):.1f} s; cpu {entry.get('key_cpu_s', 0):.0f} s "
                f"against {entry.get('plain_cpu_s', 0):.0f} s, others {entry.get('others_cpu_s', 0):.0f} s)",
                f"<= {VERIFY_KEY_RATIO:.2f}x",
                ratio <= VERIFY_KEY_RATIO,
            )
        )
    return rows


def bench(work: Path, row) -> list:
    """bench/run.py's part `trust`."""
    return [row("trust", m, v, t, ok) for m, v, t, ok in report(measure_all(work / "trust"))]


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    parser.add_argument("--offline", action="store_true", help="no Docker or registry: the SBOM and signing alone")
    options = parser.parse_args()
    if options.offline:
        found = measure_offline()
        print(json.dumps(found, indent=2))
        if options.json:
            options.json.write_text(json.dumps(found, indent=2))
        return 0
    result = measure_all(Path(tempfile.mkdtemp(prefix="carry-bench-trust-")))
    rows = report(result)
    print("\n".join(f"{m}: {v}" + (f"  target {t}  {'PASS' if ok else 'FAIL'}" if t else "") for m, v, t, ok in rows))
    if options.json:
        options.json.write_text(json.dumps(result, indent=2))
    return 1 if any(ok is False for *_, ok in rows) else 0


def measure_offline() -> dict:
    """Without Docker or a registry: examples/vllm's real facts per platform (its committed locks, the 197 locked
    wheels from the download store, the fixed wheels `wheel` left in $CARRY_CACHE, the release wheels), the SBOM
    written and validated, the provenance, signing and attaching to a registry kept in memory; timed by the
    same `Timings` `image --push` reports. (The part `trust` of bench/run.py measures the real push.)"""
    import hashlib
    import time

    from carry import config as config_module
    from carry import version as version_module
    from carry.image.attest import Attester, PlatformFacts
    from carry.image.locked import layerplan, runtimelock
    from carry.platforms import Platform
    from carry.source import series
    from carry.trust import keys
    from carry.util.cache import Cache
    from carry.util.download import Store

    class Memory:
        def __init__(self):
            self.blobs, self.manifests = {}, {}

        def upload_bytes(self, data, digest):
            self.blobs[digest] = data
            return True

        def put_manifest(self, reference, body, media_type):
            self.manifests[reference] = (media_type, body)
            return "sha256:" + hashlib.sha256(body).hexdigest()

        def get_manifest(self, reference):
            return self.manifests.get(reference)

        def get_blob(self, digest):
            return self.blobs[digest]

    config = config_module.load(ROOT / "examples" / "vllm" / "build.yaml")
    version = str(version_module.read(config.version_file))
    cache = Cache.from_env()
    store = Store.from_env(cache.root)
    result: dict = {"version": version, "platforms": {}}
    with tempfile.TemporaryDirectory(prefix="carry-bench-trust-") as tmp:
        key_path, _ = keys.keygen(Path(tmp) / "keys", {})
        key = keys.load_private(key_path, None)
        for platform in (Platform.LINUX_AMD64, Platform.LINUX_ARM64):
            lock = runtimelock.read(config, platform)
            wheels = {p.name: layerplan._stored(store, p, platform.machine) for p in lock.packages}
            missing = [name for name, path in wheels.items() if path is None]
            if missing:
                raise SystemExit(f"bench: {len(missing)} locked wheel(s) not in {store.root}; run examples/vllm/run.sh")
            fixed = sorted(
                (cache.root / "artifacts").glob(f"*/vllm-*+carry.{version}-*{platform.machine}.whl"),
                key=lambda p: p.stat().st_mtime,
            )
            if not fixed:
                raise SystemExit(f"bench: no fixed vLLM wheel for {platform} in {cache.root}/artifacts")
            chosen = config.build.precompiled.wheel_for(platform)
            release = store.find(chosen.pinned) if chosen else None
            attester = Attester(key, config, series.load(config.patches_dir), version, "bench", Path(tmp) / "dist")
            started = time.perf_counter()
            facts = attester.facts(
                PlatformFacts(
                    platform=platform,
                    labels={"org.opencontainers.image.created": "2026-12-01T00:00:00Z"},
                    fixed=fixed[-1],
                    release=release,
                    base_ref=config.target(platform).runtime_image or "runtime",
                    base={"Id": "sha256:" + "0" * 64},
                    lock=lock,
                    wheels=wheels,
                )
            )
            published = attester.platform(Memory(), facts, "sha256:" + "1" * 64, locked=True)
            attester.index(Memory(), "sha256:" + "2" * 64)
            wall = time.perf_counter() - started
            result["platforms"][str(platform)] = {
                "sbom_bytes": published.to_json()["sbom_bytes"],
                "components": published.to_json()["components"],
                "lock_packages": len(lock.packages),
                "seconds": attester.timings.to_json(),
                "wall_s": wall,
            }
    return result


if __name__ == "__main__":
    sys.exit(main())
