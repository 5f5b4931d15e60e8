"""The bundled demo: its bundle is what make_upstream.py generates, and README's main job works on it."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import ROOT, carry

DEMO = ROOT / "examples" / "demo"


def test_bundle_and_pin_are_up_to_date_with_the_sources():
    result = subprocess.run([sys.executable, str(DEMO / "make_upstream.py"), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_demo_check_json_has_both_patches_clean(tmp_path):
    result = carry("--config", str(DEMO / "build.yaml"), "check", "--json", env={"CARRY_CACHE": str(tmp_path)})
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert [p["status"] for p in report["patches"]] == ["clean", "clean"]
    assert report["tree"] and report["base"] in (DEMO / "build.yaml").read_text()


def test_demo_status_against_main_shows_0001_merged_and_0002_needed(tmp_path):
    result = carry(
        "--config",
        str(DEMO / "build.yaml"),
        "status",
        "--against",
        "main",
        "--json",
        env={"CARRY_CACHE": str(tmp_path)},
    )
    assert result.code == 0, result.err
    verdicts = [p["verdict"] for p in json.loads(result.out)["refs"][0]["patches"]]
    assert verdicts == ["MERGED-EXACT", "NEEDED"]
