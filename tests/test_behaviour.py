"""`status --test`: each patch's test run on REF without the patch, on a real Python-only upstream built into real
wheels (`cuda_arches: []`), tests that need no GPU run without one, and what `prove` learned used when a patch names
no test itself."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import Upstream, assert_bad_input, carry, write_config

pytestmark = pytest.mark.slow

SETUP_PY = """\
import os
from setuptools import setup

setup(name="sizes", version=os.environ.get("SIZES_VERSION", "1.0"), packages=["sizes"])
"""
PARSE = '''\
"""Sizes like 2k or 3M, in bytes."""

UNITS = {"k": 1000, "m": 1000 ** 2, "g": 1000 ** 3}


def parse_size(text):
    number, unit = text[:-1], text[-1]
    value = int(number)
    size = UNITS[unit]
    return value * size


def largest_unit(n):
    """The largest unit that `n` bytes fill at least once."""
    found = "k"
    for unit, size in UNITS.items():
        if n >= size:
            found = unit
    return found


def format_size(n):
    unit = largest_unit(n)
    return f"{n // UNITS[unit]}{unit}"
'''
FILES = {
    "setup.py": SETUP_PY,
    "pyproject.toml": '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n',
    "sizes/__init__.py": "",
    "sizes/parse.py": PARSE,
}
UPPER = "python -c \"from sizes.parse import parse_size; assert parse_size('2K') == 2000, parse_size('2K')\""
EMPTY = "python -c \"from sizes.parse import format_size; assert format_size(0) == '0 B', format_size(0)\""
BUILD = f"""build:
  cuda_arches: []
  wheel_version: "1.0+carry.{{version}}"
  version_env: [SIZES_VERSION]
  build_isolation: false
  compiler_cache: none
  tests:
    - {{run: {json.dumps(UPPER)}, gpu: false}}
    - {{run: {json.dumps(EMPTY)}, gpu: false}}
"""


def without_gpu_tools() -> str:
    """PATH without any directory that holds nvidia-smi: no GPU answers, on any machine."""
    return os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "nvidia-smi").exists()
    )


@pytest.fixture
def project(tmp_path):
    upstream = Upstream.create(tmp_path / "upstream", FILES)
    pin = upstream.head()
    config = write_config(tmp_path / "project", str(upstream.path), pin, extra=BUILD)
    (config.parent / "VERSION").write_text("20261201.1\n")
    patches = config.parent / "patches"
    upstream.make_patch(
        patches / "0001-upper-case-units.patch",
        "Accept upper-case units",
        {"sizes/parse.py": PARSE.replace("text[:-1], text[-1]", "text[:-1], text[-1].lower()")},
        f"Upstream-Status: Submitted [https://example.invalid/pr/1]\nCarry-Test: {UPPER}",
    )
    zero = "    if n == 0:\n        return '0 B'\n    unit = largest_unit(n)\n"
    upstream.make_patch(
        patches / "0002-empty-size.patch",
        "Zero bytes are 0 B",
        {"sizes/parse.py": PARSE.replace("    unit = largest_unit(n)\n", zero)},
        f"Carry-Test: {EMPTY}",
    )
    # Upstream fixes upper-case units its own way (a wider table), and leaves empty sizes alone.
    fixed = PARSE.replace(
        'UNITS = {"k": 1000, "m": 1000 ** 2, "g": 1000 ** 3}',
        'UNITS = {"k": 1000, "m": 1000 ** 2, "g": 1000 ** 3}\nUNITS.update({u.upper(): v for u, v in UNITS.items()})',
    )
    main = upstream.commit("Upper-case units", {"sizes/parse.py": fixed})
    env = {"CARRY_CACHE": str(tmp_path / "cache"), "PATH": without_gpu_tools()}
    return config, env, main


def test_fixed_upstream_and_still_needed_by_tests_on_real_wheels(project):
    config, env, main = project
    result = carry("--config", str(config), "status", "--against", "main", "--test", "--json", env=env)
    assert result.code == 0, result.err
    verdicts = {p["name"]: p for p in json.loads(result.out)["refs"][0]["patches"]}
    upper = verdicts["0001-upper-case-units.patch"]
    assert (upper["verdict"], upper["test"]) == ("FIXED-UPSTREAM", "test")
    assert upper["behaviour"]["outcome"] == "pass" and upper["behaviour"]["mode"] == "wheel"
    assert "passes on REF without the patch: upstream fixed it its own way" in upper["evidence"][0]
    assert "tested on REF as it is, built into a wheel" in "\n".join(upper["evidence"])
    assert "the text alone says NEEDED (decided by forward-apply):" in "\n".join(upper["evidence"])
    assert upper["advice"] == "Upstream-Status says Submitted, but REF needs it no more (FIXED-UPSTREAM): drop it"
    empty = verdicts["0002-empty-size.patch"]
    assert (empty["verdict"], empty["test"], empty["behaviour"]["outcome"]) == ("NEEDED", "test", "fail")
    assert "fails on REF without the patch: still needed" in empty["evidence"][0]
    assert "AssertionError: 0k" in "\n".join(empty["evidence"])
    # 0002 sits on 0001's line: it was tested on REF with 0001 applied, as status judged it.
    assert (
        "tested on REF with the earlier patches as far as they apply there (0001-upper-case-units.patch NEEDED), "
        "built into a wheel"
    ) in empty["evidence"]
    # The wheels were real: built by the configured builder into the cache, never into the project.
    assert list((Path(env["CARRY_CACHE"]) / "artifacts").rglob("sizes-1.0+carry.20261201.1-*.whl"))
    assert not (config.parent / "dist").exists()


def test_a_test_that_needs_a_gpu_is_not_run_without_one_and_says_so(project, tmp_path):
    config, env, _ = project
    patch = config.parent / "patches" / "0001-upper-case-units.patch"
    patch.write_text(patch.read_text().replace(f"Carry-Test: {UPPER}", "Carry-Test: python -m sizes.gpu_check"))
    (config.parent / "patches" / "0002-empty-size.patch").unlink()
    result = carry("--config", str(config), "status", "--against", "main", "--test", "--json", env=env)
    assert result.code == 0, result.err
    upper = json.loads(result.out)["refs"][0]["patches"][0]
    assert upper["verdict"] == "NEEDED" and upper["behaviour"]["outcome"] == "needs a GPU"
    line = (
        "its test `python -m sizes.gpu_check` needs a GPU and nvidia-smi is not on PATH: not run, the verdict is "
        "the text's"
    )
    assert line in upper["evidence"]
    assert [row for row in result.err.splitlines() if "needs a GPU" in row] == [
        f"carry: 0001-upper-case-units.patch: {line}"
    ]
    assert not (Path(env["CARRY_CACHE"]) / "artifacts").exists()  # decided before anything was built


def test_drop_takes_a_patch_fixed_upstream_by_its_test(project):
    config, env, _ = project
    refused = carry("--config", str(config), "drop", "0001", "--against", "main", env=env)
    assert_bad_input(refused, "0001-upper-case-units.patch is NEEDED against main", "--test")
    dropped = carry("--config", str(config), "drop", "0001", "--against", "main", "--test", env=env)
    assert dropped.code == 0, dropped.err
    assert "0001-upper-case-units.patch: FIXED-UPSTREAM against main" in dropped.out
    assert not (config.parent / "patches" / "0001-upper-case-units.patch").exists()


def test_prove_learns_without_a_gpu_and_status_test_uses_it(project):
    config, env, _ = project
    patches = config.parent / "patches"
    for patch in patches.glob("*.patch"):  # no trailers: only what prove learns names their tests
        patch.write_text(
            "\n".join(line for line in patch.read_text().split("\n") if not line.startswith("Carry-Test:"))
        )
    proved = carry("--config", str(config), "prove", "--out", str(config.parent / "dist"), env=env)
    assert proved.code == 0, proved.out + proved.err
    assert proved.out.splitlines()[0] == "gpu no GPU (none needed) (none), driver none"
    assert f"0001-upper-case-units.patch fixes `{UPPER}`: FAIL -> PASS" in proved.out
    learned = json.loads((patches / "PROVED.json").read_text())
    assert learned["format"] == 1 and set(learned["patches"]) == {
        "0001-upper-case-units.patch",
        "0002-empty-size.patch",
    }
    assert learned["patches"]["0001-upper-case-units.patch"]["fixes"] == [UPPER]
    assert carry("--config", str(config), "check", env=env).code == 0  # PROVED.json may sit beside the patches
    result = carry("--config", str(config), "status", "--against", "main", "--test", "--json", env=env)
    assert result.code == 0, result.err
    upper = json.loads(result.out)["refs"][0]["patches"][0]
    assert upper["verdict"] == "FIXED-UPSTREAM"
    assert upper["behaviour"]["source"].startswith("what prove learned on ")
    assert upper["behaviour"]["source"].endswith("(patches/PROVED.json)")


def test_test_runs_a_wheel_without_a_gpu_when_no_test_needs_one(project, tmp_path):
    config, env, _ = project
    built = carry("--config", str(config), "wheel", "--out", str(tmp_path / "dist"), env=env)
    assert built.code == 0, built.err
    tested = carry("--config", str(config), "test", built.out.strip(), env=env)
    assert tested.code == 0, tested.out + tested.err
    assert tested.out.splitlines()[0] == "gpu no GPU (none needed) (none), driver none"
    report = json.loads(Path(built.out.strip() + ".test.json").read_text())
    assert report["gpu"]["count"] == 0 and report["passed"] is True
    # cuda_arches: [] has nothing for a GPU to run: a test that does not say `gpu` needs none.
    config.write_text(config.read_text().replace(", gpu: false}\n", "}\n"))
    assert carry("--config", str(config), "test", built.out.strip(), env=env).code == 0
    config.write_text(config.read_text().replace("}\n", ", gpu: true}\n", 1))  # the first now needs a GPU
    assert_bad_input(
        carry("--config", str(config), "test", built.out.strip(), env=env),
        "`test` needs a CUDA GPU and nvidia-smi is not on PATH",
    )


def test_a_carry_test_trailer_that_does_not_parse_is_bad_input(project):
    config, env, _ = project
    patch = config.parent / "patches" / "0001-upper-case-units.patch"
    patch.write_text(patch.read_text().replace(f"Carry-Test: {UPPER}", "Carry-Test: python -c 'unclosed"))
    before = patch.read_bytes()
    assert_bad_input(
        carry("--config", str(config), "status", "--test", env=env),
        "0001-upper-case-units.patch: Carry-Test",
        "does not parse",
        "close the quote",
    )
    assert patch.read_bytes() == before
