"""`suite` on the real vLLM: examples/vllm's selection of vLLM 0.33.0's own tests (`-m cpu_test` over 12 paths, the
ones that need a model from a hub deselected) on its fixed wheel and on PyPI's release wheel, cold (both
environments made from uv's cache, both sides run at once), then again (the release side read back from the cache),
then with a sabotaged patch (tests/data/suite/: it drops the de-duplication tests/test_request_input_bounds.py
covers), which must regress those tests and exit 1.

The history is made from the pinned sdists (examples/vllm/make_upstream.py) into a fresh carry cache; the download
store and uv's cache are warm (ci/setup.sh and the tests fill them).

    python bench/suite.py [--json OUT]     (part `suite` of bench/run.py)
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "tests")]

import measure  # noqa: E402

SABOTAGE = ROOT / "tests" / "data" / "suite" / "0003-sampling-params-keep-duplicates-sabotage.patch"
MIN_TESTS = 150


def _suite(config: Path, env: dict[str, str], wheel: str) -> tuple[measure.Measured, dict]:
    done = measure.run([sys.executable, str(measure.BUILD_PY), "--config", str(config), "suite", wheel], env)
    report = json.loads(Path(wheel + ".suite.json").read_text()) if done.code in (0, 1) else {}
    return done, report


def measure_all(work: Path) -> dict:
    import realvllm
    from lib import vllm

    history = Path(realvllm.build(work / "history")["path"])
    config = vllm.example_project(work / "vllm", history)
    env = {**os.environ, "CARRY_CACHE": str(work / "cache"), "CARRY_DOWNLOADS": realvllm.download_store()}
    wheel = measure.carry(config, env, "wheel", "--out", str(work / "dist")).out.strip()
    cold, cold_report = _suite(config, env, wheel)
    again, again_report = _suite(config, env, wheel)
    sabotaged = vllm.example_project(work / "sabotaged", history)
    shutil.copy(SABOTAGE, sabotaged.parent / "patches" / SABOTAGE.name)
    broken = measure.carry(sabotaged, env, "wheel", "--out", str(work / "dist-sabotaged")).out.strip()
    sabotage, sabotage_report = _suite(sabotaged, env, broken)
    return {
        "runs": {
            name: {"code": run.code, "wall_s": run.wall_s, "cpu_s": run.cpu_s, "others_cpu_s": run.others_cpu_s}
            for name, run in (("cold", cold), ("again", again), ("sabotaged", sabotage))
        },
        "reports": {
            name: {key: report.get(key) for key in ("verdict", "line", "summary", "times", "wheel", "against")}
            for name, report in (("cold", cold_report), ("again", again_report), ("sabotaged", sabotage_report))
        },
        "regressed": sorted(t for t, row in sabotage_report.get("tests", {}).items() if row["class"] == "regressed"),
        "selection": cold_report.get("selection", {}),
    }


def report(result: dict) -> list[tuple[str, str, str, bool]]:
    runs, reports = result["runs"], result["reports"]
    cold, again = reports["cold"], reports["again"]
    selection = result["selection"]
    both = (cold["wheel"] or {}).get("collected"), (cold["against"] or {}).get("collected")
    rows = [
        (
            "examples/vllm's selection, real vLLM 0.33.0 (both wheels)",
            f"-m {selection.get('marker')} over {len(selection.get('paths', []))} paths, "
            f"{len(selection.get('deselect', {}))} deselected with a reason: {both[0]} tests fixed, {both[1]} release",
            f">= {MIN_TESTS} tests, both sides",
            runs["cold"]["code"] == 0 and min(x or 0 for x in both) >= MIN_TESTS and both[0] == both[1],
        ),
        ("per test, fixed vs release", cold["line"], "0 regressed", cold["summary"]["regressed"] == 0),
        (
            "cold: environments, then both sides at once",
            f"{runs['cold']['wall_s']:.1f} s wall, {runs['cold']['cpu_s']:.0f} CPU-s (environments "
            f"{cold['times']['environments_s']:.1f} s; release side {cold['times']['against_s']:.1f} s, fixed side "
            f"{cold['times']['fixed_s']:.1f} s)",
            "",
            True,
        ),
        (
            "again, nothing changed (release side read back)",
            f"{runs['again']['wall_s']:.1f} s wall = {runs['again']['wall_s'] / runs['cold']['wall_s']:.0%} of cold, "
            f"{runs['again']['cpu_s']:.0f} CPU-s = {runs['again']['cpu_s'] / runs['cold']['cpu_s']:.0%} of cold's "
            f"(release side cached: {again['times']['against_cached']}; fixed side {again['times']['fixed_s']:.1f} s)",
            "release side not run, CPU <= 65% of cold's",
            again["times"]["against_cached"] and runs["again"]["cpu_s"] <= 0.65 * runs["cold"]["cpu_s"],
        ),
        (
            "a sabotaged patch (sampling_params: duplicates kept)",
            f"exit {runs['sabotaged']['code']}; {reports['sabotaged']['line']}; regressed: "
            f"{', '.join(t.split('::')[-1] for t in result['regressed'])} ({runs['sabotaged']['wall_s']:.1f} s)",
            "exit 1, the de-duplication tests named",
            runs["sabotaged"]["code"] == 1
            and len(result["regressed"]) == 2
            and all("deduplicated" in test for test in result["regressed"]),
        ),
    ]
    return rows


def main() -> int:
    return measure.part_main("suite", measure_all, report)


def bench(work: Path, row) -> list:
    """bench/run.py's part `suite`."""
    return [row("suite", m, v, t, ok if t else None) for m, v, t, ok in report(measure_all(work / "suite"))]


if __name__ == "__main__":
    sys.exit(main())
