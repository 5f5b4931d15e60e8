"""`suite` on the real vLLM: vLLM 0.33.0's own tests (a CI-sized part of examples/vllm's selection: the `cpu_test`
files that need no model and start fast) on examples/vllm's fixed wheel (the `fixed_wheels` fixture, not built
again) and on PyPI's release wheel it was made from, each in an environment of PyPI's CUDA torch 2.14.0 and vLLM's
requirements (uv's cache), no network, no GPU. The same counts on both sides; a sabotaged patch (it drops the
de-duplication tests/test_request_input_bounds.py covers) regresses exactly those tests, exit 1, ids printed, the
release side read back from the cache. examples/vllm's whole selection (331 tests) is measured by bench/suite.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from carry.gputest import upstreamsuite
from helpers import ROOT, assert_bad_input, carry
from lib import vllm

SABOTAGE = ROOT / "tests" / "data" / "suite" / "0003-sampling-params-keep-duplicates-sabotage.patch"
# examples/vllm's selection, cut to the files that start fast (skip_global_cleanup) and cover the sabotaged code
CI_PATHS = ["tests/test_request_input_bounds.py", "tests/test_outputs.py", "tests/test_audio_media_size_precheck.py"]
CI_DESELECT = {
    "tests/test_request_input_bounds.py::test_stop_string_limit_can_be_overridden": (
        "16 s in a subprocess: left out of the CI test's selection for time (examples/vllm's selection runs it)"
    )
}
CI_TESTS = 87  # what that selection collects at v0.33.0 (the pinned tree: the same on every machine)
REGRESSED = (
    "tests/test_request_input_bounds.py::test_duplicate_bad_words_are_deduplicated_in_order",
    "tests/test_request_input_bounds.py::test_duplicate_stop_token_ids_are_deduplicated_in_order",
)

pytestmark = pytest.mark.xdist_group("suite-vllm")  # one worker: the environments and the release side, once


def ci_selection(config: Path, paths: list[str] = CI_PATHS) -> None:
    data = yaml.safe_load(config.read_text())
    tests = data["build"]["upstream_tests"]
    tests["paths"] = paths
    tests["deselect"] = {k: v for k, v in tests["deselect"].items() if k.split("::")[0] in paths} | CI_DESELECT
    config.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture(scope="module")
def project(tmp_path_factory, vllm_history, fixed_wheels):
    """examples/vllm on the history with the CI selection, a hardlinked copy of the fixed wheels' cache, and the
    fixed x86_64 wheel linked into a dist/ of its own (its report goes beside it, not into the shared fixture)."""
    root = tmp_path_factory.mktemp("suite-vllm")
    config = vllm.example_project(root / "vllm", vllm_history["path"])
    ci_selection(config)
    cache = fixed_wheels.cache_copy(root / "cache")
    (root / "dist").mkdir()
    built = fixed_wheels.wheels["linux/amd64"]
    wheel = root / "dist" / Path(built).name
    os.link(built, wheel)
    yield {"root": root, "config": config, "env": {"CARRY_CACHE": str(cache)}, "wheel": wheel}
    # the environments (CUDA torch and vLLM's requirements: 14 GB) go when the module ends, not with the session:
    # the locked vLLM image's peak comes later in the same run
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def first(project):
    """`suite` of the fixed wheel against vLLM's release wheel (build.precompiled's), both sides run."""
    result = carry("--config", str(project["config"]), "suite", str(project["wheel"]), env=project["env"])
    report = json.loads(upstreamsuite.report_path(project["wheel"]).read_text()) if result.code in (0, 1) else None
    return result, report


def test_the_fixed_wheel_passes_vllms_own_tests_as_the_release_does(project, first):
    result, report = first
    assert result.code == 0, result.out + result.err
    summary, fixed, against = report["summary"], report["wheel"], report["against"]
    assert fixed["counts"] == against["counts"], (fixed["counts"], against["counts"])
    assert fixed["collected"] == against["collected"] == summary["tests"] == summary["same"] == CI_TESTS
    assert (summary["regressed"], summary["fixed"], summary["only_fixed"], summary["only_against"]) == (0, 0, 0, 0)
    assert against["source"] == "build.precompiled.wheels.linux/amd64"
    assert against["sha256"].endswith("4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa")
    assert fixed["version"].startswith("0.33.0+carry.") and against["version"] == "0.33.0"
    for side in (fixed, against):  # vllm came from each wheel's own venv, not from the test tree
        assert side["imported"]["vllm"].startswith(side["env"]) and side["imported"]["vllm"].endswith(
            "/vllm/__init__.py"
        )
    assert report["environment"]["same_deps"] and report["environment"]["versions"]["torch"] == "2.14.0+cu130"
    assert f"summary   {CI_TESTS} same ({summary['passed_both']} passed both" in result.out
    assert set(report["upstream"]["tests"]) == {"tests", "pyproject.toml", "setup.cfg"}

    verified = carry("--config", str(project["config"]), "verify", str(project["wheel"]), env=project["env"])
    assert f"suite report {project['wheel'].name}.suite.json: PASS: {CI_TESTS} same" in verified.out, verified.out
    assert "MISMATCH suite report" not in verified.out


def test_a_sabotaged_patch_regresses_the_tests_that_cover_it(project, first, tmp_path):
    assert first[0].code == 0, "the release side ran and was cached by the first run"
    config = vllm.example_project(tmp_path / "vllm", yaml.safe_load(project["config"].read_text())["upstream"]["url"])
    ci_selection(config)
    shutil.copy(SABOTAGE, tmp_path / "vllm" / "patches" / SABOTAGE.name)
    built = carry("--config", str(config), "wheel", "--out", str(tmp_path / "dist"), env=project["env"])
    assert built.code == 0, built.err
    result = carry("--config", str(config), "suite", built.out.strip(), env=project["env"])
    assert result.code == 1, result.out + result.err
    assert "REGRESSED (2):" in result.out and "verdict   FAIL" in result.out
    for test in REGRESSED:
        assert f"  {test}  passed -> failed: " in result.out, result.out
    report = json.loads(upstreamsuite.report_path(Path(built.out.strip())).read_text())
    assert report["summary"]["regressed"] == 2 and report["summary"]["same"] == CI_TESTS - 2
    assert report["times"]["against_cached"] and report["times"]["against_s"] == 0.0
    assert "(cached, first run" in result.out


def test_a_tests_path_absent_at_the_pin_is_bad_input(project, tmp_path):
    config = tmp_path / "build.yaml"
    shutil.copytree(project["config"].parent, tmp_path, dirs_exist_ok=True)
    ci_selection(config, ["tests/test_inputs.py"])  # vLLM 0.33.0 has none (tests/test_outputs.py, ... it has)
    result = carry("--config", str(config), "suite", str(project["wheel"]), env=project["env"])
    assert_bad_input(result, "build.upstream_tests.paths: tests/test_inputs.py is not in the patched tree")
