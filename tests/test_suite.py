"""`suite` on a small real upstream: its own tests (a conftest, test data, markers, a module that needs a hub) run on
the release wheel and on the fixed one, each in an environment uv makes, compared per test id. A series that breaks
a function the tests cover regresses named tests (exit 1); one that fixes the upstream's own failure is FIXED; a
patch that adds a test lists it on one side; a patch that breaks the conftest's import regresses every test. Bad
input is one line, exit 2, nothing written. The report is what `verify` checks. The real vLLM: test_suite_vllm.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from carry.config.build import Deselection, UpstreamTests
from carry.gputest import pytestplugin, suiterun, upstreamsuite
from helpers import Upstream, assert_bad_input, carry, write_config
from lib.wheels import make_wheel

# one worker, in this file's order: the module's cache makes the environments and the release side once, and the
# fixing series reads back the release side the sabotaged one ran (under --dist loadgroup a test of another worker
# found its own cache empty)
pytestmark = pytest.mark.xdist_group("suite")

PACKAGE = """\
def dedup(items):
    return list(dict.fromkeys(items))


def add(a, b):
    return a + b


def answer():
    return 41  # the upstream's own bug: its test fails on the release too
"""
FILES = {
    "pyproject.toml": (
        '[project]\nname = "tinyup"\nversion = "1.0"\n\n[tool.pytest.ini_options]\n'
        'markers = ["cpu_test: runs without a GPU", "gpu: needs a GPU"]\n'
    ),
    "tinyup/__init__.py": PACKAGE,
    "tests/__init__.py": "",
    "tests/conftest.py": (
        "import pytest\n\nfrom tinyup import add\n\n\n@pytest.fixture\ndef two():\n    return add(1, 1)\n"
    ),
    "tests/data/expected.txt": "3 1 2\n",
    "tests/test_core.py": """\
import os
import pathlib
import socket

import pytest

import tinyup

pytestmark = pytest.mark.cpu_test


def test_dedup_keeps_the_first_of_each():
    expected = (pathlib.Path(__file__).parent / "data" / "expected.txt").read_text().split()
    assert tinyup.dedup([3, 1, 3, 2, 1]) == [int(x) for x in expected]


@pytest.mark.parametrize(("a", "b", "total"), [(1, 2, 3), (2, 2, 4), (0, 0, 0)])
def test_add(a, b, total):
    assert tinyup.add(a, b) == total


def test_two(two):
    assert two == 2


def test_answer():
    assert tinyup.answer() == 42


@pytest.mark.parametrize("name", sorted(name for name in dir(tinyup) if not name.startswith("_")))
def test_public_names_are_functions(name):
    assert callable(getattr(tinyup, name))


@pytest.mark.skip(reason="the upstream skips it")
def test_skipped():
    raise AssertionError


def test_runs_without_a_gpu():
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_reaches_no_other_host():
    with pytest.raises(OSError, match="no network"):
        socket.create_connection(("192.0.2.1", 80), timeout=5)


def test_reaches_this_machine():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        socket.create_connection(server.getsockname(), timeout=5).close()
""",
    "tests/test_gpu_only.py": "import pytest\n\n\n@pytest.mark.gpu\ndef test_kernel():\n    pass\n",
    "tests/test_needs_hub.py": "import a_model_from_the_hub  # noqa: F401\n\n\ndef test_model():\n    pass\n",
}
SELECTION = """\
build:
  cuda_arches: []
  upstream_tests:
    paths: [{paths}]
    marker: {marker}
    deselect:
      tests/test_needs_hub.py: imports a model from a hub
    requires: [pytest==9.2.0, pytest-timeout==2.4.0]
    timeout: 60
"""
# test_core.py: dedup, add x3, two, answer, public names x3, skipped, no gpu, no network, loopback (gpu_only: marker)
RELEASE_TESTS = 13


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    return Upstream.create(tmp_path_factory.mktemp("suite") / "tinyup", FILES)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One carry cache for the module: the environments and the release side's result are made once."""
    return tmp_path_factory.mktemp("suite-cache")


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    directory = tmp_path_factory.mktemp("release")
    return make_wheel(directory, "tinyup", "1.0", {"tinyup/__init__.py": PACKAGE.encode()})


def project(root: Path, upstream: Upstream, patches: dict[str, dict[str, str | None]], selection: str = "") -> Path:
    """A carry project on `upstream` carrying `patches` (name -> files), and the fixed wheel of what they make of
    tinyup/ (in root/dist)."""
    config = write_config(
        root, str(upstream.path), upstream.head(), extra=selection or SELECTION.format(paths="tests", marker="cpu_test")
    )
    (root / "VERSION").write_text("20261201.1\n")
    package = PACKAGE
    for name, files in patches.items():
        upstream.make_patch(root / "patches" / name, name.removesuffix(".patch"), files)
        package = files.get("tinyup/__init__.py") or package
    (root / "dist").mkdir()
    make_wheel(root / "dist", "tinyup", "1.0+carry.20261201.1", {"tinyup/__init__.py": package.encode()})
    return config


def suite(config: Path, cache: Path, release: Path, *args: str):
    wheel = next((config.parent / "dist").glob("*.whl"))
    env = {"CARRY_CACHE": str(cache)}
    return carry("--config", str(config), "suite", str(wheel), "--against", str(release), *args, env=env), wheel


def report_of(wheel: Path) -> dict:
    return json.loads(upstreamsuite.report_path(wheel).read_text())


def test_a_series_keeps_every_test_fixes_its_own_and_lists_the_one_only_it_has(tmp_path, upstream, cache, release):
    new_test = "import pytest\n\nimport tinyup\n\npytestmark = pytest.mark.cpu_test\n\n\ndef test_sub():\n"
    new_test += "    assert tinyup.sub(3, 1) == 2\n"
    patched = PACKAGE + "\n\ndef sub(a, b):\n    return a - b\n"
    config = project(
        tmp_path, upstream, {"0001-add-sub.patch": {"tinyup/__init__.py": patched, "tests/test_sub.py": new_test}}
    )
    result, wheel = suite(config, cache, release)
    assert result.code == 0, result.out + result.err
    report = report_of(wheel)
    summary = report["summary"]
    assert summary["same"] == RELEASE_TESTS  # the hub test's module is deselected, the gpu one left out by -m
    assert (summary["passed_both"], summary["failed_both"], summary["skipped_both"]) == (RELEASE_TESTS - 2, 1, 1)
    assert (summary["regressed"], summary["fixed"], summary["only_fixed"], summary["only_against"]) == (0, 1, 1, 0)
    tests = report["tests"]
    assert tests["tests/test_sub.py::test_sub"]["class"] == "fixed"  # the series' own test: fails on the release
    assert tests["tests/test_core.py::test_public_names_are_functions[sub]"] == {
        "against": None,
        "fixed": "passed",
        "class": "only-fixed",
        "message": "",
    }
    assert tests["tests/test_core.py::test_answer"]["class"] == "same"
    assert "assert 41 == 42" in tests["tests/test_core.py::test_answer"]["message"]
    assert report["wheel"]["version"] == "1.0+carry.20261201.1" and report["against"]["version"] == "1.0"
    assert report["verdict"] == "PASS" and report["environment"]["same_deps"]
    assert "summary   13 same (11 passed both, 1 failed both, 1 skipped both) · 0 regressed · 1 fixed" in result.out
    assert "FIXED (1):\n  tests/test_sub.py::test_sub  failed -> passed: AttributeError" in result.out
    assert "FAILED BOTH (the upstream's own, on the release too) (1):" in result.out
    assert "ONLY FIXED (1):\n  tests/test_core.py::test_public_names_are_functions[sub]  None -> passed" in result.out
    imported = report["wheel"]["imported"]["tinyup"]
    assert imported.startswith(str(cache / "suites" / "envs")) and "site-packages/tinyup/" in imported

    checked = carry(
        "--config", str(config), "verify", str(upstreamsuite.report_path(wheel)), env={"CARRY_CACHE": str(cache)}
    )
    assert checked.code == 0, checked.out + checked.err
    assert "report belongs to the wheel beside it" in checked.out and "label: PASS same=13 regressed=0" in checked.out
    config.write_text(config.read_text().replace("timeout: 60", "timeout: 30"))
    stale = carry(
        "--config", str(config), "verify", str(upstreamsuite.report_path(wheel)), env={"CARRY_CACHE": str(cache)}
    )
    assert stale.code == 1 and "MISMATCH selection: report sha256:" in stale.out, stale.out
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    tampered = carry("verify", str(upstreamsuite.report_path(wheel)), cwd=tmp_path / "dist")
    assert tampered.code == 1 and "MISMATCH sha256: report sha256:" in tampered.out, tampered.out


def test_a_sabotaged_series_regresses_the_tests_that_cover_it(tmp_path, upstream, cache, release):
    broken = PACKAGE.replace("return list(dict.fromkeys(items))", "return list(items)")
    config = project(tmp_path, upstream, {"0001-dedup-keep-everything.patch": {"tinyup/__init__.py": broken}})
    result, wheel = suite(config, cache, release)
    assert result.code == 1, result.out + result.err
    assert "REGRESSED (1):\n  tests/test_core.py::test_dedup_keeps_the_first_of_each  passed -> failed" in result.out
    assert "0 regressed" not in result.out and "verdict   FAIL" in result.out
    report = report_of(wheel)
    assert report["summary"]["regressed"] == 1 and report["verdict"] == "FAIL"


def test_a_series_that_fixes_the_upstreams_failure_says_fixed(tmp_path, upstream, cache, release):
    config = project(
        tmp_path, upstream, {"0001-answer.patch": {"tinyup/__init__.py": PACKAGE.replace("return 41", "return 42")}}
    )
    result, wheel = suite(config, cache, release)
    assert result.code == 0, result.out + result.err
    assert "FIXED (1):\n  tests/test_core.py::test_answer  failed -> passed" in result.out
    report = report_of(wheel)
    assert (report["summary"]["fixed"], report["summary"]["failed_both"]) == (1, 0)
    # the sabotaged series ran the release side on the same test tree and selection: read back, not run
    assert report["times"]["against_cached"] and "(cached, first run" in result.out
    again, _ = suite(config, cache, release, "--rerun")
    assert again.code == 0 and not report_of(wheel)["times"]["against_cached"], "--rerun runs the release side"


def test_a_series_that_breaks_the_conftest_regresses_every_test(tmp_path, upstream, cache, release):
    gone = PACKAGE.replace("def add(a, b):\n    return a + b\n", "")
    config = project(tmp_path, upstream, {"0001-drop-add.patch": {"tinyup/__init__.py": gone}})
    result, wheel = suite(config, cache, release)
    assert result.code == 1, result.out + result.err
    report = report_of(wheel)
    assert report["summary"]["regressed"] == RELEASE_TESTS - 1  # all but the upstream's own failure
    assert "pytest did not start on this wheel" in report["tests"]["tests/test_core.py::test_two"]["message"]
    assert "ImportError" in report["tests"]["tests/test_core.py::test_two"]["message"]


@pytest.mark.parametrize(
    ("paths", "marker", "needles"),
    [
        (
            "tests",
            "cpu_test and not fast",
            ["marker 'cpu_test and not fast' names fast", "they register: cpu_test, gpu"],
        ),
        ("tests/test_core.py", "gpu", ["the selection collects no test (tests/test_core.py with marker 'gpu')"]),
        (
            "tests/test_inputs.py",
            "cpu_test",
            ["build.upstream_tests.paths: tests/test_inputs.py is not in the patched"],
        ),
    ],
    ids=["unknown-marker", "collects-nothing", "path-absent-at-the-pin"],
)
def test_a_selection_that_cannot_run_is_bad_input(tmp_path, upstream, cache, release, paths, marker, needles):
    config = project(tmp_path, upstream, {}, SELECTION.format(paths=paths, marker=marker))
    result, wheel = suite(config, cache, release)
    assert_bad_input(result, *needles)
    assert not upstreamsuite.report_path(wheel).exists()


def test_what_is_not_a_comparison_is_bad_input(tmp_path, upstream, cache, release):
    config = project(tmp_path, upstream, {}, "build:\n  cuda_arches: []\n")
    result, wheel = suite(config, cache, release)
    assert_bad_input(result, "build.upstream_tests is not set")
    config.write_text(config.read_text() + SELECTION.format(paths="tests", marker="cpu_test").split("\n", 2)[2])
    other = make_wheel(tmp_path, "otherpkg", "1.0", {"otherpkg/__init__.py": b""})
    assert_bad_input(
        carry("--config", str(config), "suite", str(wheel), "--against", str(other)), "different distributions"
    )
    arm = shutil.copy(wheel, tmp_path / wheel.name.replace("py3-none-any", "cp311-cp311-manylinux_2_28_aarch64"))
    assert_bad_input(carry("--config", str(config), "suite", str(arm), "--against", str(release)), "linux/arm64 wheel")
    assert_bad_input(carry("--config", str(config), "suite", str(wheel)), "no wheel to compare", "--against WHEEL")
    assert not list(tmp_path.rglob("*.suite.json"))


# --- the parts, without a run -------------------------------------------------------------------------------------


def test_the_marker_names_of_an_expression():
    assert pytestplugin.marker_names("cpu_test and not (slow or timeout(60))") == {"cpu_test", "slow", "timeout"}
    assert pytestplugin.marker_names("a and not b(x=1, y='z')") == {"a", "b"}


def test_each_pair_of_outcomes_has_one_class():
    assert upstreamsuite.classify("passed", "failed") == "regressed"
    assert upstreamsuite.classify("skipped", "error") == "regressed"
    assert upstreamsuite.classify("failed", "passed") == "fixed"
    assert upstreamsuite.classify("xfailed", "passed") == "same"
    assert upstreamsuite.classify("failed", "error") == "same"
    assert upstreamsuite.classify("passed", "skipped") == "skip-changed"
    assert upstreamsuite.classify(None, "failed") == "only-fixed"
    assert upstreamsuite.classify("passed", None) == "only-against"


def test_a_module_that_stops_importing_makes_its_tests_errors():
    def side(tests, errors=None):
        return suiterun.Side("w", "sha256:0", tests, errors or {}, len(tests), 1, 1.0, started=True)

    against = side({"t/test_a.py::x": ["passed", 0.1, ""], "t/test_b.py::y": ["passed", 0.1, ""]})
    fixed = side({"t/test_b.py::y": ["passed", 0.1, ""]}, {"t/test_a.py": "ImportError: no name dedup"})
    table = upstreamsuite.compare(against, fixed)
    assert table["t/test_a.py::x"]["class"] == "regressed"
    assert "its module did not import: ImportError" in table["t/test_a.py::x"]["message"]
    assert "t/test_a.py" not in table  # the module's error is its tests' outcome, not a test of its own


def test_reports_of_a_run_merge_into_one_outcome_per_test():
    def report(test, when, outcome, xfail=False, message=""):
        return {"event": "report", "id": test, "when": when, "outcome": outcome, "xfail": xfail, "duration": 0.5,
                "message": message}  # fmt: skip

    events = [
        report("a", "setup", "passed"), report("a", "call", "passed"), report("a", "teardown", "failed", message="x"),
        report("b", "setup", "skipped", message="no"), report("b", "teardown", "passed"),
        report("c", "setup", "passed"), report("c", "call", "skipped", xfail=True), report("c", "teardown", "passed"),
        {"event": "start", "id": "d"}, report("d", "setup", "passed"),
    ]  # fmt: skip
    tests, died = suiterun.merge(events, -11)
    assert tests["a"] == ["error", 1.5, "teardown: x"]
    assert tests["b"][0] == "skipped" and tests["c"][0] == "xfailed"
    assert tests["d"][0] == "error" and died == "died in d (exit -11)"


def test_the_pytest_command_line_is_the_selection():
    tests = UpstreamTests(
        paths=("tests/a", "tests/b.py"),
        marker="cpu_test",
        deselect=(Deselection("tests/a/test_x.py", "hub"), Deselection("tests/b.py::test_y", "hub")),
        timeout=30,
        workers=2,
    )
    argv = suiterun.pytest_argv(Path("/env/bin/python"), tests)
    assert argv[:3] == ["/env/bin/python", "-m", "pytest"]
    assert argv[argv.index("-m", 3) + 1] == "cpu_test" and "--timeout=30" in argv
    assert argv[argv.index("--ignore") + 1] == "tests/a/test_x.py"
    assert argv[argv.index("--deselect") + 1] == "tests/b.py::test_y"
    assert argv[argv.index("-n") + 1] == "2" and argv[-3:] == ["--", "tests/a", "tests/b.py"]
    assert suiterun.test_requirements(tests, "x")[-3:] == ("pytest", "pytest-timeout", "pytest-xdist")


def test_pytest_xdist_workers_give_the_same_table(tmp_path, upstream, cache, release):
    selection = (
        SELECTION.format(paths="tests", marker="cpu_test")
        .replace("timeout: 60", "timeout: 60\n    workers: 2")
        .replace("pytest-timeout==2.4.0]", "pytest-timeout==2.4.0, pytest-xdist==3.8.0]")
    )
    config = project(tmp_path, upstream, {}, selection)
    result, wheel = suite(config, cache, release)
    assert result.code == 0, result.out + result.err
    report = report_of(wheel)
    assert report["selection"]["workers"] == 2 and report["wheel"]["collected"] == RELEASE_TESTS
    assert report["summary"]["same"] == RELEASE_TESTS and report["summary"]["failed_both"] == 1
    assert report["tests"]["tests/test_core.py::test_reaches_no_other_host"]["fixed"] == "passed"  # in a worker too
    assert "2 xdist worker(s)" in result.out


def test_tests_that_import_the_package_from_the_tree_are_refused(tmp_path, upstream, cache, release):
    selection = SELECTION.format(paths="tests", marker="cpu_test") + "    checkout: [tinyup]\n"
    config = project(tmp_path, upstream, {}, selection)
    result, wheel = suite(config, cache, release)
    assert result.code == 1, result.out + result.err
    assert "the tests imported tinyup from " in result.err and "/tinyup/__init__.py, not from" in result.err
    assert "keep the upstream's package sources out of build.upstream_tests.checkout" in result.err
    assert not upstreamsuite.report_path(wheel).exists()
