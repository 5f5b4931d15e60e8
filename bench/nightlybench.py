"""`carry pin` on a replica of vLLM's per-commit wheel index, against downloading the two wheels alone.

The replica (tests/nightlyindex.py): the real vLLM history (examples/vllm/make_upstream.py) grown on main, vLLM
0.33.0's released x86_64 and aarch64 wheels re-versioned as the cu130 nightlies of commit A1 (and A2's x86_64 only),
laid out as vLLM's generate-nightly-index.py lays them out and served on loopback (sendfile). The project is
examples/vllm on the PR commit P1 (merge-base A1) with a `nightly` block.

Measured in one run, interleaved (the machine is shared), median of RUNS:
- the two wheels downloaded alone: by curl one after the other, by two curl processes at once, and by a plain
  Python stream copy (urllib, 1 MB reads, no hashing); the fastest of the three is the baseline;
- `carry pin`, the whole process, with the upstream mirror fetched and an empty download store: the merge-base,
  the index read, both wheels downloaded at once and hashed as they stream, their versions proven, build.yaml
  written;
- for scale, `pin` on P2, where linux/arm64 walks one commit back (reported).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import measure
import vllmbench

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the replica is the tests' own

import nightlyindex as ni  # noqa: E402

RUNS = 5
RATIO_TARGET = 1.3
VAR = "CARRY_BENCH_NIGHTLY"
PR = 53899


def bench(work: Path, Row) -> list:
    work.mkdir(parents=True, exist_ok=True)
    env = vllmbench.env_for(work)
    history = Path(vllmbench.history(env)["path"])
    repo = work / "upstream.git"
    subprocess.run(["git", "clone", "--quiet", "--bare", "--shared", str(history), str(repo)], check=True)
    sha = {name: ni.git(repo, "rev-parse", f"v{name[1:]}^{{commit}}") for name in ("v0.32.0", "v0.33.0")}
    ni.grow(repo, sha, PR)
    from carry.source import releases

    example = ROOT / "examples" / "vllm"
    names = ("vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl", "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl")
    x86, arm = releases.fetch(example / "releases.yaml", list(names))
    served = [
        ni.reversion(x86, work / "wheels" / "A1", ni.nightly_version("0.33.1", 1, sha["A1"], "cu130")),
        ni.reversion(arm, work / "wheels" / "A1", ni.nightly_version("0.33.1", 1, sha["A1"], "cu130")),
    ]
    ni.publish(work / "index", sha["A1"], served)
    ni.publish(
        work / "index",
        sha["A2"],
        [ni.reversion(x86, work / "wheels" / "A2", ni.nightly_version("0.33.1", 2, sha["A2"], "cu130"))],
    )
    size = sum(w.stat().st_size for w in served)
    server = ni.Server(work / "index")
    try:
        env = {**env, VAR: server.url, "CARRY_CACHE": str(work / "pin-cache")}
        config = ni.make_project(example, work / "project" / "vllm", repo, sha["P1"], PR, ni.nightly_block(VAR))
        walked = ni.make_project(example, work / "walked" / "vllm", repo, sha["P2"], PR, ni.nightly_block(VAR))
        original = config.read_text()
        measure.carry(config, env, "check")  # the mirror fetched, as a CI job's cache has it
        urls = [f"{server.url}/{sha['A1']}/{urllib.parse.quote(w.name)}" for w in served]
        curl, parallel, python, pin = [], [], [], []
        for _ in range(RUNS):
            target = work / "alone"
            target.mkdir(exist_ok=True)
            curl.append(
                sum(
                    measure.run(["curl", "-sSf", "-o", str(target / w.name), url], env).check().wall_s
                    for w, url in zip(served, urls)
                )
            )
            shutil.rmtree(target)
            target.mkdir()
            parallel.append(_curl_at_once(urls, [target / w.name for w in served], env))
            shutil.rmtree(target)
            target.mkdir()
            python.append(_python_copy(urls, [target / w.name for w in served], env))
            shutil.rmtree(target)
            config.write_text(original)
            store = work / "store"
            result = measure.carry(config, {**env, "CARRY_DOWNLOADS": str(store)}, "pin")
            pin.append(result.wall_s)
            shutil.rmtree(store)
        walk = measure.carry(walked, {**env, "CARRY_DOWNLOADS": str(work / "store")}, "pin")
        shutil.rmtree(work / "store")
    finally:
        server.stop()
        for part in ("wheels", "index"):
            shutil.rmtree(work / part, ignore_errors=True)
    alone = min(measure.median(curl), measure.median(parallel), measure.median(python))
    ratio = measure.median(pin) / alone
    return [
        Row(
            "pin",
            "replica: per-commit index (vLLM's layout) of the real 0.33.0 wheels as cu130 nightlies, on loopback",
            f"x86_64 + aarch64 at the merge-base A1, {size / 1e6:.0f} MB",
        ),
        Row(
            "pin",
            f"the two wheels downloaded alone: curl, one after the other (median of {RUNS})",
            f"{measure.median(curl):.2f} s",
        ),
        Row("pin", "  curl, both at once (two processes)", f"{measure.median(parallel):.2f} s"),
        Row("pin", "  a plain Python stream copy (urllib, 1 MB reads, no hashing)", f"{measure.median(python):.2f} s"),
        Row(
            "pin",
            "`carry pin` whole process (mirror fetched, empty store): merge-base, index, 2 downloads hashed, "
            "proof, build.yaml written",
            f"{measure.median(pin):.2f} s = {ratio:.2f}x the fastest download alone",
            f"<= {RATIO_TARGET}x",
            ratio <= RATIO_TARGET,
        ),
        Row("pin", "  `carry pin` where linux/arm64 walks one commit back (P2)", f"{walk.wall_s:.2f} s"),
    ]


def _curl_at_once(urls: list[str], targets: list[Path], env: dict[str, str]) -> float:
    """The two URLs fetched by two curl processes at once: from the first start to the last end."""
    import time

    start = time.perf_counter()
    running = [
        subprocess.Popen(["curl", "-sSf", "-o", str(target), url], env=env, stdin=subprocess.DEVNULL)
        for url, target in zip(urls, targets)
    ]
    if any(process.wait() for process in running):
        raise SystemExit("bench: curl failed")
    return time.perf_counter() - start


def _python_copy(urls: list[str], targets: list[Path], env: dict[str, str]) -> float:
    """The two URLs copied to `targets` by a plain Python process (urllib), its whole run."""
    code = (
        "import shutil, sys, urllib.request\n"
        "for url, dest in zip(sys.argv[1::2], sys.argv[2::2]):\n"
        "    with urllib.request.urlopen(url) as r, open(dest, 'wb') as h:\n"
        "        shutil.copyfileobj(r, h, 1 << 20)\n"
    )
    args = [arg for pair in zip(urls, map(str, targets)) for arg in pair]
    return measure.run([sys.executable, "-c", code, *args], env).check().wall_s
