"""The locked, layered vLLM image (examples/vllm, real 0.33.0), on the default path (the smoke test on): cold
two-platform `image --push` from an empty carry cache (the download store and uv's cache warm; the smoke test pulls
both platforms back and keeps them in the engine), against the same arm64 install under QEMU (a measured fraction:
pip installing a few of the locked aarch64 wheels in the arm64 runtime base, scaled by installed bytes); a
Python-only patch change with the smoke test (the fixed wheels derived from the cold run's PEP 517 builds; the
pull fetches what changed), and another with --no-smoke; the bytes each smoke test pulled; what the engine holds
after them and after a VERSION bump (one image per platform); bytes pushed against the vLLM layer; image size per
platform against vLLM's published 6.93 GB for GH200; no file stored twice; peak disk of the cold run; isal against
zlib on a layer's tar stream.

    python bench/lockedimage.py [--json OUT]     (needs `bash ci/setup.sh`; part `locked` of bench/run.py)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from diskwatch import DiskWatch  # noqa: E402

VLLM_GH200_GB = 6.93  # vLLM's docs: the arm64 image built natively on GH200
QEMU_SAMPLE = ("idna", "packaging", "filelock", "jinja2", "numpy", "regex", "pyyaml", "pillow", "scipy")


def carry(config: Path, env: dict, *args: str, timeout: float = 3000) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "build.py"), "--config", str(config), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def compression(sample_wheel: Path, limit: int = 400 << 20) -> dict:
    """MB/s and ratio of isal (levels 0-2) and zlib level 1 on the tar stream of one big wheel's install."""
    from isal import isal_zlib

    from carry.image.locked import ocilayer, wheelinstall

    entries = wheelinstall.plan(sample_wheel, wheelinstall.Venv("/opt/venv", "3.11")).entries
    data = bytearray()
    for chunk in ocilayer.stream(ocilayer.items_for(entries)):
        data += chunk
        if len(data) >= limit:
            break
    data = bytes(data)
    found = {}
    for name, make in (
        ("isal 0", lambda: isal_zlib.compressobj(0, isal_zlib.DEFLATED, 31)),
        ("isal 1", lambda: isal_zlib.compressobj(1, isal_zlib.DEFLATED, 31)),
        ("isal 2", lambda: isal_zlib.compressobj(2, isal_zlib.DEFLATED, 31)),
        ("zlib 1", lambda: zlib.compressobj(1, zlib.DEFLATED, 31)),
    ):
        started = time.monotonic()
        compressor = make()
        size = sum(len(compressor.compress(data[i : i + (1 << 20)])) for i in range(0, len(data), 1 << 20))
        size += len(compressor.flush())
        seconds = time.monotonic() - started
        found[name] = {"MB/s": round(len(data) / seconds / 1e6), "ratio": round(size / len(data), 3)}
    return {"sample": f"{sample_wheel.name}, first {len(data) / 1e6:.0f} MB of its layer tar", **found}


def qemu_fraction(store: Path, lock: Path, base: str) -> dict:
    """pip installing a few locked aarch64 wheels into a venv in the arm64 runtime base under QEMU, timed."""
    from carry.image.locked import wheelinstall

    wheels = []
    text = lock.read_text()
    for name in QEMU_SAMPLE:
        line = next((candidate for candidate in text.splitlines() if candidate.lower().startswith(f"{name}==")), None)
        if line is None:
            continue
        block = text.split(line, 1)[1].split("\n")
        hashes = [entry.split("--hash=sha256:", 1)[1].split()[0] for entry in block[:6] if "--hash=sha256:" in entry]
        for sha in hashes:
            found = list((store / sha).glob("*.whl"))
            if found:
                wheels.append(found[0])
                break
    installed = sum(
        sum(e.size for e in wheelinstall.plan(w, wheelinstall.Venv("/opt/venv", "3.11")).entries) for w in wheels
    )
    with tempfile.TemporaryDirectory(prefix="carry-bench-qemu-") as tmp:
        for wheel in wheels:
            shutil.copy(wheel, Path(tmp) / wheel.name)
        # the venv (ensurepip) is made first; only pip's install of the wheels is timed, inside the container
        script = (
            "python3 -m venv /v && python3 -c 'import time; print(time.time())' && /v/bin/python -m pip "
            "install --no-index --no-deps --no-compile --disable-pip-version-check -q /w/*.whl && "
            "python3 -c 'import time; print(time.time())'"
        )
        run = subprocess.run(
            [
                "/usr/bin/docker",
                "run",
                "--rm",
                "--network=none",
                "--platform",
                "linux/arm64",
                "-v",
                f"{tmp}:/w:ro",
                base,
                "sh",
                "-c",
                script,
            ],
            capture_output=True,
            text=True,
            timeout=1800,
        )
    if run.returncode != 0:
        raise RuntimeError(f"pip under QEMU failed: {run.stderr[-500:]}")
    stamps = [float(line) for line in run.stdout.split()[-2:]]
    return {"wheels": [w.name for w in wheels], "installed": installed, "seconds": stamps[1] - stamps[0]}


def main() -> int:
    import measure

    return measure.part_main("locked", measure_all, report)


def bench(work: Path, row) -> list:
    """bench/run.py's part `locked`."""
    return [row("locked", m, v, t, ok if t else None) for m, v, t, ok in report(measure_all(work / "locked"))]


def measure_all(work: Path) -> dict:
    import dockerenv
    import realvllm

    services = dockerenv.load()
    work.mkdir(parents=True, exist_ok=True)
    name = f"{services.registry}/carry-bench/locked-{uuid.uuid4().hex[:8]}"
    result: dict = {"image": name}
    try:
        from test_locked_image import make_project

        config, env = make_project(work, services, name)
        result["engine_before"] = _engine(name)
        locked = carry(config, env, "lock")  # builds the fixed wheels for the Requires-Dist
        assert locked.returncode == 0, locked.stderr[-2000:]
        warm = carry(config, env, "image", "--push", "--no-smoke", "--json", "--tag", "warmup")  # store warm
        assert warm.returncode == 0, warm.stderr[-2000:]
        _registry_cleanup(name)
        shutil.rmtree(env["CARRY_CACHE"])  # the warm-up's own cache (the cold run has its own): disk for the engine
        # examples/vllm's own image (run.sh) holds the same layers: removed, so that the registry stores every
        # blob again and the peak disk is the real one (bench part `verify` pushes it again)
        from verifyimage import _ref

        _registry_cleanup(_ref().rsplit(":", 1)[0])
        # cold: an empty carry cache (mirror, build environment from uv's cache, both fixed wheels by the upstream's
        # PEP 517 build, every layer written and pushed, both platforms pulled back, smoke-tested and kept); only
        # the download store and uv's cache are warm
        env = {**env, "CARRY_CACHE": str(work / "cold-cache")}
        with DiskWatch(Path(realvllm.download_store()), every=0.5) as disk:
            started = time.monotonic()
            cold = carry(config, env, "image", "--push", "--json")
            cold_s = time.monotonic() - started
        assert cold.returncode == 0, cold.stderr[-2000:]
        cold_json = json.loads(cold.stdout)
        result["cold_s"] = cold_s
        result["cold_peak_disk"] = disk.peak
        result["cold"] = cold_json
        result["cold_pep517"] = cold.stderr.count("build: PEP 517 build_wheel")
        result["engine_cold"] = _engine(name)
        # a Python-only patch change, the default path (smoke test on), then another with --no-smoke
        patch = work / "vllm" / "patches" / "0003-logger-say-carried.patch"
        for key, comment, flags in (
            ("patch", "# carried by carry", ()),
            ("nosmoke", "# carried by carry, again", ("--no-smoke",)),
        ):
            patch.write_text(_patch_adding_a_line(work, comment))
            started = time.monotonic()
            patched = carry(config, env, "image", "--push", "--json", *flags)
            result[f"{key}_s"] = time.monotonic() - started
            assert patched.returncode == 0, patched.stderr[-2000:]
            result[key] = json.loads(patched.stdout)
            result[f"{key}_derive"] = [
                line.split("derive: ", 1)[1] for line in patched.stderr.splitlines() if "derive: " in line
            ]
            result[f"{key}_pep517"] = patched.stderr.count("build: PEP 517 build_wheel")
            result[f"engine_{key}"] = _engine(name)
        # a VERSION bump (smoke test on): the older VERSION's images untagged and removed
        version = work / "vllm" / "VERSION"
        old_version = version.read_text().strip()
        version.write_text(f"{old_version.rsplit('.', 1)[0]}.{int(old_version.rsplit('.', 1)[1]) + 1}\n")
        started = time.monotonic()
        bumped = carry(config, env, "image", "--push", "--json")
        result["bump_s"] = time.monotonic() - started
        assert bumped.returncode == 0, bumped.stderr[-2000:]
        result["bump"] = json.loads(bumped.stdout)
        result["bump_versions"] = [old_version, version.read_text().strip()]
        result["engine_bump"] = _engine(name)
        arm64 = next(p for p in cold_json["platforms"] if p["platform"] == "linux/arm64")
        result["qemu"] = qemu_fraction(
            Path(realvllm.download_store()),
            work / "vllm" / "runtime-lock" / "linux-arm64.txt",
            services.runtime_base_arm64,
        )
        arm64_installed = sum(layer["installed"] for layer in arm64["layers"] if layer["name"] != "base")
        result["qemu"]["scaled_s"] = result["qemu"]["seconds"] * arm64_installed / result["qemu"]["installed"]
        torch = next(Path(realvllm.download_store()).glob("*/torch-2.14.0-*x86_64.whl"), None)
        if torch is not None:
            result["compression"] = compression(torch)
    finally:
        dockerenv.forget(name)  # the images the smoke tests kept, and the registry repository
        shutil.rmtree(work, ignore_errors=True)
    return result


def _engine(name: str) -> list[dict]:
    """Every image of repository `name` in the engine (digest references included): ID, tags, platform, VERSION."""
    import dockerenv

    return [
        {
            "id": image.id,
            "tags": sorted(image.tags),
            "platform": (image.labels or {}).get("io.carry.platform"),
            "version": (image.labels or {}).get("io.carry.version"),
            "size": image.attrs.get("Size", 0),
        }
        for image in dockerenv.docker_client().images.list(name=name)
    ]


def _patch_adding_a_line(work: Path, line: str) -> str:
    """test_locked_image's Python-only patch (a comment line added to vllm/logger.py), with this line."""
    from test_locked_image import _patch_adding_a_line as patch_text

    return patch_text(work).replace("+# carried by carry\n", f"+{line}\n")


def _pull_rows(run: dict, indent: str, fixed_only: bool = False) -> list[tuple[str, str, str, bool]]:
    """One row per platform: what the smoke test's pull fetched (layers, compressed bytes) and its time; after a
    patch change only the new vllm-fixed layer may be fetched."""
    rows = []
    for outcome in run["platforms"]:
        engine = outcome.get("engine") or {}
        pulled = engine.get("pulled")
        if pulled is None:
            rows.append(
                (f"{indent}{outcome['platform']}: pulled by the smoke test", "nothing (no smoke test)", "", True)
            )
            continue
        image = sum(layer["size"] for layer in outcome["layers"])
        value = (
            f"{pulled['bytes'] / 1e6:,.2f} MB ({pulled['fetched']} of {pulled['layers']} layers, "
            f"{pulled['bytes'] / image:.2%} of the image) in {pulled['seconds']:.1f} s"
        )
        if fixed_only:
            fixed = outcome["layers"][-1]["size"]
            ok = pulled["fetched"] == 1 and pulled["bytes"] == fixed
            rows.append(
                (f"{indent}{outcome['platform']}: pulled by the smoke test", value, "the vllm-fixed layer only", ok)
            )
        else:
            rows.append((f"{indent}{outcome['platform']}: pulled by the smoke test", value, "", True))
    return rows


def _engine_row(images: list[dict], when: str, version: str, made: dict) -> tuple[str, str, str, bool]:
    """What the engine holds of the repository: one image per platform, of `version`, the one `made` kept."""
    kept = {o["platform"]: (o.get("engine") or {}).get("image") for o in made["platforms"]}
    value = "; ".join(f"{', '.join(i['tags']) or '(no tag)'} ({i['size'] / 1e9:.2f} GB)" for i in images) or "nothing"
    per_platform = sorted(i["platform"] for i in images)
    ok = (
        per_platform == sorted(kept)
        and all(i["version"] == version and i["id"] == kept[i["platform"]] for i in images)
        and all(len(i["tags"]) == 1 for i in images)
    )
    return (f"engine {when}", value, "one image per platform, of the latest VERSION", ok)


def _registry_cleanup(name: str) -> None:
    import dockerenv

    dockerenv.remove_repository(name)


def report(result: dict) -> list[tuple[str, str, str, bool]]:
    """(measure, value, target, ok) rows; target "" for what is reported only."""
    rows = []
    cold, patch = result["cold"], result["patch"]
    per_arch = {}
    for outcome in cold["platforms"]:
        layers = outcome["layers"]
        installed = sum(layer["installed"] for layer in layers)
        per_arch[outcome["platform"]] = layers
        rows.append(
            (
                f"{outcome['platform']} image",
                f"{installed / 1e9:.2f} GB installed, "
                f"{sum(layer['size'] for layer in layers) / 1e9:.2f} GB compressed; vLLM's own arm64 (GH200): "
                f"{VLLM_GH200_GB} GB",
                "",
                True,
            )
        )
        rows.append(
            (
                f"  {outcome['platform']} layers (compressed/installed)",
                ", ".join(
                    f"{layer['name']} {layer['size'] / 1e6:.1f}/{layer['installed'] / 1e6:.1f} MB" for layer in layers
                ),
                "",
                True,
            )
        )
    qemu = result["qemu"]
    arm64_s = next(o["seconds"] for o in cold["platforms"] if o["platform"] == "linux/arm64")
    rows.append(
        (
            "cold two-platform `image --push` (smoke test on), empty carry cache (download store and uv's cache warm)",
            f"{result['cold_s']:.0f} s: mirror, build environment, {result['cold_pep517']} fixed wheel(s) by the "
            f"upstream's PEP 517 build, every layer written and pushed (linux/arm64's {arm64_s:.0f} s), both "
            f"platforms pulled back, smoke-tested and kept; {len(result['engine_before'])} image(s) of the "
            f"repository in the engine before",
            "",
            True,
        )
    )
    rows += _pull_rows(cold, "  ")
    ratio = qemu["scaled_s"] / arm64_s
    rows.append(
        (
            "the arm64 install under QEMU (pip in the arm64 base), scaled by installed bytes",
            f"{qemu['scaled_s']:.0f} s ({len(qemu['wheels'])} wheels, {qemu['installed'] / 1e6:.0f} MB by pip in "
            f"{qemu['seconds']:.0f} s) = {ratio:.1f}x carry's linux/arm64 layers written, compressed and pushed; "
            f"{qemu['scaled_s'] / result['cold_s']:.1f}x the whole cold two-platform run",
            ">= 5x",
            ratio >= 5,
        )
    )
    for key, what in (
        ("patch", "Python-only patch change, `image --push` again (smoke test on: the default)"),
        ("nosmoke", "another Python-only patch change, `image --push --no-smoke`"),
    ):
        share = result[f"{key}_s"] / result["cold_s"]
        rows.append(
            (
                what,
                f"{result[f'{key}_s']:.0f} s = {share:.1%} of cold; {result[f'{key}_pep517']} PEP 517 build(s); "
                + "; ".join(result[f"{key}_derive"]),
                "<= 15%",
                share <= 0.15,
            )
        )
        rows += _pull_rows(result[key], "  ", fixed_only=True)
    for outcome in patch["platforms"]:
        before = {layer["digest"] for layer in per_arch[outcome["platform"]]}
        layers = outcome["layers"]
        pushed = sum(layer["size"] for layer in layers if layer["action"] == "pushed")
        fixed = layers[-1]
        unchanged = sum(layer["digest"] in before for layer in layers[:-1])
        total = sum(layer["size"] for layer in layers)
        rows.append(
            (
                f"  {outcome['platform']}: bytes pushed (layers)",
                f"{pushed} B = {pushed / fixed['size']:.2f}x the vllm-fixed layer ({fixed['files']} files, "
                f"{fixed['installed']} B installed: the patched files + the dist-info), {pushed / total:.4%} of "
                f"the image; {unchanged}/{len(layers) - 1} other digests unchanged",
                "<= 1.1x, <= 15%, all unchanged",
                pushed <= 1.1 * fixed["size"] and pushed <= 0.15 * total and unchanged == len(layers) - 1,
            )
        )
    old_version, new_version = result["bump_versions"]
    for key, when, version, made in (
        ("engine_cold", "after the cold run", old_version, cold),
        ("engine_patch", "after two runs (cold, patch change)", old_version, patch),
        ("engine_nosmoke", "after the --no-smoke run", old_version, patch),
        ("engine_bump", f"after a VERSION bump ({old_version} -> {new_version})", new_version, result["bump"]),
    ):
        rows.append(_engine_row(result[key], when, version, made))
    share = result["bump_s"] / result["cold_s"]
    rows.append(
        (
            "  the VERSION bump's `image --push` (the fixed wheels built again: the version is in them)",
            f"{result['bump_s']:.0f} s = {share:.1%} of cold; "
            + "; ".join(
                f"{o['platform']}: untagged {', '.join(o['engine']['untagged'])}" for o in result["bump"]["platforms"]
            ),
            "",
            True,
        )
    )
    rows.append(("files stored twice across layers", str(len(cold["duplicates"])), "0", not cold["duplicates"]))
    kept = sum(image["size"] for image in result["engine_cold"])  # what the engine holds for the two images
    rows.append(
        (
            "peak disk of the cold run (registry blobs, cache, the images the smoke test keeps; store warm)",
            f"{result['cold_peak_disk'] / 1e9:.1f} GB, of which the two kept images {kept / 1e9:.1f} GB (what "
            f"`docker run` of either needs): {(result['cold_peak_disk'] - kept) / 1e9:.1f} GB without them",
            "< 30 GB without them",
            result["cold_peak_disk"] - kept < 30e9,
        )
    )
    if "compression" in result:
        found = dict(result["compression"])
        sample = found.pop("sample")
        rows.append(
            (
                f"gzip on {sample}",
                ", ".join(f"{k} {v['MB/s']} MB/s ratio {v['ratio']}" for k, v in found.items()),
                "",
                True,
            )
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
