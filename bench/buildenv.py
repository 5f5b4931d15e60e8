"""The build environment carry makes for vLLM 0.33.0's real `[build-system] requires` (carry/wheelbuild/buildenv.py):
cold, warm and reused, each the whole process (`python bench/buildenv.py ensure CACHE REQUIRES`, interpreter start and
imports included), and the disk one env takes beyond uv's cache.

- cold: an empty CARRY_CACHE and an empty private UV_CACHE_DIR: uv downloads everything (about 3 GB: torch
  2.14.0+cu130 and its NVIDIA wheels). With --quick the machine's own uv cache is used as found instead.
- warm: another empty CARRY_CACHE, the same uv cache (now warm): a new env dir, nothing downloaded.
- reused: the warm run's CARRY_CACHE again: the env is complete, nothing is made (median of 3).
- disk: the warm env's files, counted once per inode: what is hardlinked from uv's cache and what is its own.

The requires are read from the sdist in carry's download store (examples/vllm/releases.yaml; downloaded once).
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
from pathlib import Path
from stat import S_ISDIR, S_ISREG

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if __name__ == "__main__":
    sys.path[:0] = [str(ROOT)]

import measure  # noqa: E402

WARM_TARGET_S = 10.0
REUSED_TARGET_S = 0.5
OWN_DISK_TARGET = 0.05  # of the env's apparent size
REUSED_RUNS = 3


def vllm_requires() -> list[str]:
    from carry.source import releases
    from carry.wheelbuild import buildenv

    try:
        import tomllib
    except ImportError:
        import tomli as tomllib
    sdist = releases.fetch(ROOT / "examples" / "vllm" / "releases.yaml", ["vllm-0.33.0.tar.gz"])[0]
    with tarfile.open(sdist) as tar:
        return list(buildenv.requires_from_pyproject(tomllib.load(tar.extractfile("vllm-0.33.0/pyproject.toml"))))


def ensure(cache: Path, requires: list[str], uv_cache: Path | None) -> tuple[measure.Measured, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARRY_", "UV_"))}
    env["CARRY_CACHE"] = str(cache)
    if uv_cache is not None:
        env["UV_CACHE_DIR"] = str(uv_cache)
    run = measure.run(
        [sys.executable, str(Path(__file__).resolve()), "ensure", str(cache), json.dumps(requires)], env
    ).check()
    return run, json.loads(run.out)


def disk(root: Path) -> dict:
    """The env's files once per inode: their size, the part hardlinked from uv's cache (no new disk), and what
    only this env holds on disk (its own files and its directories, in blocks, as `du` counts them)."""
    seen: set[tuple[int, int]] = set()
    apparent = shared = own = files = linked = 0
    for path in root.rglob("*"):
        stat = path.lstat()
        if S_ISDIR(stat.st_mode):
            own += stat.st_blocks * 512
        if not S_ISREG(stat.st_mode) or (stat.st_dev, stat.st_ino) in seen:
            continue
        seen.add((stat.st_dev, stat.st_ino))
        files += 1
        apparent += stat.st_size
        if stat.st_nlink > 1:  # uv hardlinks from its cache; nothing else links into a fresh env
            linked += 1
            shared += stat.st_size
        else:
            own += stat.st_blocks * 512
    return {"apparent": apparent, "shared": shared, "own": own, "files": files, "linked": linked}


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def bench(work: Path, Row, quick: bool = False) -> list:
    requires = vllm_requires()
    uv_cache = None if quick else work / "buildenv" / "uv-cache"
    cold, cold_env = ensure(work / "buildenv" / "cold", requires, uv_cache)
    warm, warm_env = ensure(work / "buildenv" / "warm", requires, uv_cache)
    reused = [ensure(work / "buildenv" / "warm", requires, uv_cache) for _ in range(REUSED_RUNS)]
    if cold_env["reused"] or warm_env["reused"] or not all(env["reused"] for _, env in reused):
        raise SystemExit("bench: expected a new env cold and warm, then a reused one")
    if warm_env["root"] == cold_env["root"] or warm_env["downloaded"]:
        raise SystemExit(f"bench: the warm env downloaded {warm_env['downloaded']} packages")
    reused_s = measure.median([run.wall_s for run, _ in reused])
    reused_in = measure.median([env["seconds"] for _, env in reused])
    size = disk(Path(warm_env["root"]))
    versions = warm_env["versions"]
    cold_what = (
        "empty env dir, empty uv cache (private UV_CACHE_DIR)"
        if uv_cache is not None
        else "empty env dir, the machine's uv cache as found"
    )
    if uv_cache is not None:
        cold_value = f"{cold.wall_s:.1f} s, {cold_env['downloaded']} of {len(cold_env['packages'])} packages downloaded"
    else:
        cold_value = (
            f"{cold.wall_s:.1f} s, {cold_env['downloaded']} of {len(cold_env['packages'])} packages "
            f"downloaded (--quick: not a cold uv cache)"
        )
    return [
        Row(
            "buildenv",
            "vLLM 0.33.0 [build-system] requires",
            f"{len(requires)} requirements -> {len(warm_env['packages'])} packages (torch {versions.get('torch')}, "
            f"setuptools {versions.get('setuptools')}); uv {warm_env['uv']}",
        ),
        Row("buildenv", f"cold: {cold_what}", cold_value),
        Row(
            "buildenv",
            "warm: new env dir, uv's cache warm",
            f"{warm.wall_s:.2f} s = {100 * warm.wall_s / cold.wall_s:.0f}% of cold (ensure itself "
            f"{warm_env['seconds']:.2f} s), 0 downloaded",
            f"<= {WARM_TARGET_S:.0f} s",
            warm.wall_s <= WARM_TARGET_S,
        ),
        Row(
            "buildenv",
            f"reused: the env exists (median of {REUSED_RUNS})",
            f"{reused_s:.2f} s whole process (ensure itself {reused_in * 1000:.2f} ms)",
            f"<= {REUSED_TARGET_S} s",
            reused_s <= REUSED_TARGET_S,
        ),
        Row(
            "buildenv",
            "disk per env (the warm one, once per inode)",
            f"{gb(size['apparent'])} in {size['files']} files; {gb(size['shared'])} of it in {size['linked']} files "
            f"hardlinked from uv's cache, {gb(size['own'])} on disk its own",
            f"own <= {OWN_DISK_TARGET:.0%} of apparent",
            size["own"] <= OWN_DISK_TARGET * size["apparent"],
        ),
    ]


def _ensure_main(cache: str, requires: str) -> int:
    from carry.util.errors import CarryError
    from carry.wheelbuild import buildenv

    try:
        env = buildenv.ensure(buildenv.EnvSpec.resolve(json.loads(requires)), Path(cache))
    except CarryError as exc:
        print(f"carry: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(json.dumps(env.to_json()))
    print(env.describe(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "ensure":
        raise SystemExit("usage: python bench/buildenv.py ensure CACHE REQUIRES_JSON (bench/run.py runs this)")
    sys.exit(_ensure_main(sys.argv[2], sys.argv[3]))
