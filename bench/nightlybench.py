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

Twice: over loopback as fast as it goes (sendfile: 670 MB in about a second, so carry's fixed cost, a Python
process that runs git and reads the index, about 0.5 s, weighs most; reported), and over a 1 Gbit/s link, which
the server paces, shared by both connections, as a runner's link to vLLM's CDN would be (the target).
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
PACED_RUNS = 3
LINK_BYTES_S = 125e6  # 1 Gbit/s: a generous CI runner's link to a CDN
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
        targets = [work / "alone" / w.name for w in served]

        def rounds(runs: int) -> dict[str, float]:
            """Medians of `runs` interleaved rounds: each way of downloading the two wheels alone, then `pin`."""
            times: dict[str, list[float]] = {"curl": [], "parallel": [], "python": [], "pin": []}
            for _ in range(runs):
                for way, fetch in (
                    ("curl", lambda: sum(_curl(url, target, env) for url, target in zip(urls, targets))),
                    ("parallel", lambda: _curl_at_once(urls, targets, env)),
                    ("python", lambda: _python_copy(urls, targets, env)),
                ):
                    (work / "alone").mkdir(exist_ok=True)
                    times[way].append(fetch())
                    shutil.rmtree(work / "alone")
                config.write_text(original)
                times["pin"].append(
                    measure.carry(config, {**env, "CARRY_DOWNLOADS": str(work / "store")}, "pin").wall_s
                )
                shutil.rmtree(work / "store")
            return {way: measure.median(values) for way, values in times.items()}

        loopback = rounds(RUNS)
        walk = measure.carry(walked, {**env, "CARRY_DOWNLOADS": str(work / "store")}, "pin")
        shutil.rmtree(work / "store")
        server.link = ni.Link(LINK_BYTES_S)
        paced = rounds(PACED_RUNS)
    finally:
        server.stop()
        for part in ("wheels", "index"):
            shutil.rmtree(work / part, ignore_errors=True)
    rows = [
        Row(
            "pin",
            "replica: per-commit index (vLLM's layout) of the real 0.33.0 wheels as cu130 nightlies, on loopback",
            f"x86_64 + aarch64 at the merge-base A1, {size / 1e6:.0f} MB",
        )
    ]
    for label, found, runs, target in (
        ("loopback (sendfile, no limit)", loopback, RUNS, None),
        (
            f"a {LINK_BYTES_S * 8 / 1e9:.0f} Gbit/s link (the server paces what it sends)",
            paced,
            PACED_RUNS,
            RATIO_TARGET,
        ),
    ):
        alone = min(found["curl"], found["parallel"], found["python"])
        ratio = found["pin"] / alone
        rows += [
            Row(
                "pin",
                f"over {label}: the two wheels alone, median of {runs}: curl one after the other / both at once / "
                f"a plain Python stream copy (no hashing)",
                f"{found['curl']:.2f} s / {found['parallel']:.2f} s / {found['python']:.2f} s",
            ),
            Row(
                "pin",
                "  `carry pin` whole process (mirror fetched, empty store): merge-base, index, both downloads hashed "
                "as they stream, proof, build.yaml written",
                f"{found['pin']:.2f} s = {ratio:.2f}x the fastest alone (+{found['pin'] - alone:.2f} s)",
                f"<= {target}x" if target else "",
                ratio <= target if target else None,
            ),
        ]
    rows.append(
        Row("pin", "`carry pin` where linux/arm64 walks one commit back (P2), loopback", f"{walk.wall_s:.2f} s")
    )
    return rows


def _curl(url: str, target: Path, env: dict[str, str]) -> float:
    return measure.run(["curl", "-sSf", "-o", str(target), url], env).check().wall_s


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
