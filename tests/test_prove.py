"""build.tests, `test` and `prove`.

Series prefixes, the flip table, the report format and `verify` of a report run everywhere, against real git, a
real venv and real wheels. Where a GPU answers (`nvidia-smi`), the `gpu` test proves the demo: base and base+0001
fail the PR's reproducer, base+0001+0002 passes it; without one, `test` and `prove` must exit 2 before building.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from wheel.wheelfile import WheelFile

from carry.app import App
from carry.config.build import TestCommand
from carry.gputest import gpu, prove, testrun
from carry.source import apply, upstream
from helpers import ROOT, assert_bad_input, carry

DEMO = ROOT / "examples" / "demo"
NOT_A_GPU = gpu.Gpu("recorded for the test, no GPU used", "9.0", "580.0", 1)
REPRO = "python -m pledemo.ple_offload.repro"


def command(*argv: str) -> TestCommand:
    return TestCommand(argv, " ".join(argv))


def demo_project(tmp_path: Path) -> Path:
    """A copy of the demo (config, VERSION, patches, bundle) that builds without a compiler cache."""
    project = tmp_path / "demo"
    shutil.copytree(DEMO, project, ignore=shutil.ignore_patterns("upstream", "__pycache__"))
    config = project / "build.yaml"
    config.write_text(config.read_text().replace("compiler_cache: auto", "compiler_cache: none"))
    return config


@pytest.fixture
def demo_session(tmp_path, monkeypatch) -> App:
    monkeypatch.setenv("CARRY_CACHE", str(tmp_path / "cache"))
    return App.open(DEMO / "build.yaml")


def test_prefixes_of_the_demo_series_apply_in_order_each_to_its_own_tree(demo_session, tmp_path):
    series = demo_session.series()
    mirror = upstream.ensure_base(demo_session.config, demo_session.cache)
    base = demo_session.config.upstream.commit
    found = prove.prefixes(series)
    assert [p.label for p in found] == ["base", "base+0001", "base+0001+0002"]
    assert [p.added.name if p.added else None for p in found] == [None, *(p.name for p in series.patches)]
    assert [len(p.series.patches) for p in found] == [0, 1, 2]
    assert len({p.series.hash for p in found}) == 3
    reports = [apply.check(mirror, base, p.series, tmp_path / "scratch") for p in found]
    assert all(report.ok for report in reports)
    assert len({report.tree for report in reports}) == 3
    assert reports[-1].tree == demo_session.check().report.tree
    # 0002 needs 0001's lines: alone it does not apply, so the prefixes are the only order that builds.
    alone = dataclasses.replace(series, patches=series.patches[1:])
    assert not apply.check(mirror, base, alone, tmp_path / "scratch").ok


def _step(prefix: prove.Prefix, verdicts: dict[str, int]) -> prove.Step:
    results = tuple(
        testrun.CommandResult(name, status, 0.5, f"last line of {name}\n") for name, status in verdicts.items()
    )
    report = testrun.TestReport(
        testrun.Artifact(testrun.ArtifactKind.WHEEL, f"{prefix.label}.whl", "sha256:00"),
        NOT_A_GPU,
        "3.11",
        "2026-11-30T00:00:00+00:00",
        1.0,
        None,
        results,
    )
    return prove.Step(prefix, Path(f"{prefix.label}.whl"), Path(f"{prefix.label}.whl.test.json"), report, False)


def test_flips_name_the_patch_that_changes_each_test(demo_session):
    base, first, both = prove.prefixes(demo_session.series())
    steps = (
        _step(base, {REPRO: 1, "quant": 1}),
        _step(first, {REPRO: 1, "quant": 0}),
        _step(both, {REPRO: 0, "quant": 0}),
    )
    proof = prove.Proof(NOT_A_GPU, steps)
    assert [(f.patch[:4], f.command, f.before, f.after) for f in proof.flips] == [
        ("0001", "quant", "FAIL", "PASS"),
        ("0002", REPRO, "FAIL", "PASS"),
    ]
    assert proof.passed
    text = prove.table(proof)
    assert f"{both.added.name} fixes `{REPRO}`: FAIL -> PASS" in text
    assert "\nbase+0001       FAIL  base+0001.whl\n" in text and "\nbase+0001+0002  PASS  " in text
    data = proof.to_json()
    assert [p["passed"] for p in data["prefixes"]] == [False, False, True]
    assert data["flips"][1] == {"patch": both.added.name, "command": REPRO, "before": "FAIL", "after": "PASS"}
    # A patch that makes a passing test fail is named too, and the series then does not pass.
    broken = prove.Proof(NOT_A_GPU, steps[:2] + (_step(both, {REPRO: 0, "quant": 2}),))
    assert f"{both.added.name} breaks `quant`: PASS -> FAIL" in prove.table(broken)
    assert not broken.passed
    unchanged = prove.Proof(NOT_A_GPU, (_step(base, {REPRO: 0}), _step(first, {REPRO: 0})))
    assert "no patch changes the outcome of any test" in prove.table(unchanged)


@pytest.fixture
def probe_wheel(tmp_path) -> Path:
    """A real, minimal pure-Python wheel whose module says where it was imported from."""
    path = tmp_path / "dist" / "carryprobe-1.0-py3-none-any.whl"
    path.parent.mkdir()
    with WheelFile(path, "w") as wheel:
        wheel.writestr("carryprobe/__init__.py", "WHERE = __file__\n")
        wheel.writestr("carryprobe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: carryprobe\nVersion: 1.0\n")
        wheel.writestr(
            "carryprobe-1.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
    return path


def test_wheel_runs_in_a_fresh_venv_and_the_report_records_each_command(probe_wheel, tmp_path):
    commands = (
        command("python", "-c", "import sys, carryprobe, yaml; print(sys.prefix); print(carryprobe.WHERE)"),
        command("python", "-c", "import sys; print('stale reads: 3'); sys.exit(3)"),
        command("python", "-c", "import time; time.sleep(120)"),
        command(
            "no-such-command-for-carry",
        ),
    )
    report = testrun.run_on_wheel(probe_wheel, commands, NOT_A_GPU, tmp_path / "scratch", timeout=3)
    ok, failing, hanging, missing = report.results
    prefix, where = ok.output_tail.split()[-2:]
    assert ok.passed and prefix != sys.prefix and where.startswith(prefix), ok.output_tail
    assert (failing.exit_status, failing.last_line()) == (3, "stale reads: 3")
    assert hanging.exit_status is None and 3 <= hanging.duration_s < 60 and "killed after 3 s" in hanging.output_tail
    assert missing.exit_status == 127
    assert not report.passed
    assert [entry.name for entry in (tmp_path / "scratch").iterdir()] == []  # the venv is gone

    path = testrun.write(report, testrun.wheel_report_path(probe_wheel))
    assert path.name == probe_wheel.name + ".test.json"
    data = json.loads(path.read_text())
    assert data["artifact"] == {
        "kind": "wheel",
        "name": probe_wheel.name,
        "digest": "sha256:" + hashlib.sha256(probe_wheel.read_bytes()).hexdigest(),
    }
    assert data["gpu"] == {"name": NOT_A_GPU.name, "capability": "9.0", "driver": "580.0", "count": 1}
    assert [t["exit_status"] for t in data["tests"]] == [0, 3, None, 127]
    assert [t["command"] for t in data["tests"]] == [c.text for c in commands]
    assert data["passed"] is False and data["format"] == testrun.FORMAT and data["buildinfo"] is None
    assert testrun.read_report(path).to_json() == report.to_json()


def test_verify_accepts_a_report_only_beside_the_wheel_it_names(probe_wheel, tmp_path):
    report = testrun.run_on_wheel(
        probe_wheel, (command("python", "-c", "import carryprobe"),), NOT_A_GPU, tmp_path / "scratch", timeout=60
    )
    path = testrun.write(report, testrun.wheel_report_path(probe_wheel))
    accepted = carry("verify", str(path), cwd=tmp_path)
    assert accepted.code == 0, accepted.err
    assert "PASS python -c import carryprobe (exit 0)" in accepted.out
    assert "report belongs to the artifact beside it" in accepted.out

    moved = tmp_path / "elsewhere" / f"other-1.0-py3-none-any.whl{testrun.SUFFIX}"
    moved.parent.mkdir()
    shutil.copy(path, moved)
    shutil.copy(probe_wheel, moved.parent / "other-1.0-py3-none-any.whl")
    renamed = carry("verify", str(moved), cwd=tmp_path)
    assert renamed.code == 1 and "MISMATCH artifact name" in renamed.out

    probe_wheel.write_bytes(probe_wheel.read_bytes() + b"\0")
    tampered = carry("verify", str(path), cwd=tmp_path)
    assert tampered.code == 1 and "MISMATCH sha256" in tampered.out and "NOT verified" in tampered.out

    path.write_text('{"format": 1}\n')
    garbage = carry("verify", str(path), cwd=tmp_path)
    assert garbage.code == 1 and "not a carry test report" in garbage.err and "Traceback" not in garbage.err
    assert_bad_input(carry("verify", str(tmp_path / "nope.whl.test.json"), cwd=tmp_path), "no such report")


@pytest.mark.slow
def test_demo_wheel_imports_its_gpu_modules_without_a_gpu_and_verify_checks_its_report(tmp_path):
    """The demo's PLE modules (and their reproducer) import where no GPU is; verify WHEEL checks the report."""
    config = demo_project(tmp_path)
    env = {"CARRY_CACHE": str(tmp_path / "cache")}
    built = carry("--config", str(config), "wheel", "--arch", "9.0", "--out", str(tmp_path / "dist"), env=env)
    assert built.code == 0, built.err
    wheel = Path(built.out.strip())
    imports = command("python", "-c", "import pledemo.ple_offload.repro as r, pledemo._C as c; print(c.__file__)")
    report = testrun.run_on_wheel(wheel, (imports,), NOT_A_GPU, tmp_path / "scratch", timeout=120)
    assert report.passed, report.results[0].output_tail
    assert report.buildinfo["series_hash"] and len(report.buildinfo["patches"]) == 2
    path = testrun.write(report, testrun.wheel_report_path(wheel))
    verified = carry("--config", str(config), "verify", str(wheel), env=env)
    assert verified.code == 0, verified.out + verified.err
    assert f"test report {path.name}: 1/1 passed on {NOT_A_GPU.describe()}" in verified.out

    data = json.loads(path.read_text())
    data["artifact"]["digest"] = "sha256:" + "0" * 64
    path.write_text(json.dumps(data))
    rejected = carry("--config", str(config), "verify", str(wheel), env=env)
    assert rejected.code == 1 and "MISMATCH test report" in rejected.out


@pytest.mark.docker
def test_image_report_is_keyed_by_image_id_and_verify_follows_the_ref(tmp_path):
    import dockerenv

    env = dockerenv.require()
    run_env = {**dockerenv.cli_env(), "CARRY_DOCKER": dockerenv.DOCKER_CLI}
    ref = env.runtime_base
    image_id, runtime_args = testrun._inspect_image(dockerenv.DOCKER_CLI, ref)
    assert image_id.startswith("sha256:") and runtime_args == []
    report = testrun.TestReport(
        testrun.Artifact(testrun.ArtifactKind.IMAGE, ref, image_id),
        NOT_A_GPU,
        "(in the image)",
        "2026-11-30T00:00:00+00:00",
        1.0,
        None,
        (testrun.CommandResult(REPRO, 0, 1.0, "ok\n"),),
    )
    path = testrun.write(report, testrun.image_report_path(tmp_path / "dist", image_id))
    assert path.name == f"image-{image_id.replace(':', '-')}.test.json"
    accepted = carry("verify", str(path), env=run_env)
    assert accepted.code == 0 and "report belongs to the artifact beside it" in accepted.out, accepted.out
    data = json.loads(path.read_text())
    data["artifact"]["digest"] = "sha256:" + "1" * 64
    path.write_text(json.dumps(data))
    moved = carry("verify", str(path), env=run_env)
    assert moved.code == 1 and f"MISMATCH image id: report sha256:{'1' * 64}, {ref} is {image_id}" in moved.out

    # Each command runs with `docker run --gpus all`; this engine has no NVIDIA runtime, so docker refuses it.
    ran = testrun.run_on_image(
        ref, (command("python3", "-c", "print(1)"),), NOT_A_GPU, dockerenv.DOCKER_CLI, tmp_path / "scratch", timeout=120
    )
    assert ran.artifact.digest == image_id and not ran.passed
    assert ran.results[0].exit_status == 125 and "[[gpu]]" in ran.results[0].output_tail


def test_test_image_through_the_cli_writes_the_report_keyed_by_image_id(tmp_path):
    """`build.py test IMAGE` end to end. This machine has no GPU: an `nvidia-smi` that answers like one with a
    driver gets carry past its GPU check; the engine has no NVIDIA runtime, so each command fails as
    `docker run --gpus all` does there, and the report says so."""
    import dockerenv

    env = dockerenv.require()
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Not A GPU, 9.0, 580.0'\n")
    fake.chmod(0o755)
    run_env = {
        **dockerenv.cli_env(),
        "CARRY_DOCKER": dockerenv.DOCKER_CLI,
        "CARRY_CACHE": str(tmp_path / "cache"),
        "PATH": f"{fake.parent}:{os.environ['PATH']}",
    }
    out = tmp_path / "dist"
    result = carry(
        "--config",
        str(ROOT / "examples" / "demo" / "build.yaml"),
        "test",
        env.runtime_base,
        "--out",
        str(out),
        env=run_env,
    )
    assert result.code == 1, result.out + result.err
    (report,) = out.glob("image-sha256-*.test.json")
    data = json.loads(report.read_text())
    assert data["artifact"]["kind"] == "image" and data["artifact"]["name"] == env.runtime_base
    assert data["passed"] is False and len(data["tests"]) == 2
    assert all(entry["exit_status"] == 125 for entry in data["tests"])


no_gpu_only = pytest.mark.skipif(gpu.probe() is not None, reason="a GPU answers here; the no-GPU path is untestable")


@no_gpu_only
@pytest.mark.parametrize(
    "args",
    [("test", "dist/pledemo.whl"), ("test", "carry-demo:latest"), ("prove",), ("prove", "--json", "--arch", "9.0")],
)
def test_without_a_gpu_test_and_prove_exit_2_before_doing_anything(tmp_path, args):
    result = carry("--config", str(DEMO / "build.yaml"), *args, cwd=tmp_path, env={"CARRY_CACHE": str(tmp_path / "c")})
    assert_bad_input(result, f"`{args[0]}` needs a CUDA GPU", "GPU CI runner")
    assert list(tmp_path.iterdir()) == []  # no cache, no dist, no build


@pytest.mark.gpu
def test_prove_on_the_demo_gpu_shows_0002_fixes_the_stale_reads(tmp_path):
    found = gpu.probe()
    if found is None:
        pytest.skip("no CUDA GPU here (nvidia-smi finds none)")
    config = demo_project(tmp_path)
    out = tmp_path / "dist"
    result = carry(
        "--config",
        str(config),
        "prove",
        "--json",
        "--arch",
        found.capability,
        "--out",
        str(out),
        env={"CARRY_CACHE": str(tmp_path / "cache")},
    )
    assert result.code == 0, result.out + result.err
    proof = json.loads(result.out)
    assert [p["label"] for p in proof["prefixes"]] == ["base", "base+0001", "base+0001+0002"]
    assert [p["passed"] for p in proof["prefixes"]] == [False, False, True]
    stale = [json.loads(p["tests"][0]["last_line"])["stale_reads"] for p in proof["prefixes"]]
    assert stale[0] > 0 and stale[1] > 0 and stale[2] == 0, stale
    assert [(f["patch"][:4], f["before"], f["after"]) for f in proof["flips"]] == [
        ("0001", "FAIL", "PASS"),
        ("0002", "FAIL", "PASS"),
    ]
    assert "FP8_PER_CHANNEL_PER_TOKEN" in proof["flips"][0]["command"] and proof["flips"][1]["command"] == REPRO
    learned = json.loads((config.parent / "patches" / "PROVED.json").read_text())["patches"]
    assert {name[:4]: entry["fixes"] for name, entry in learned.items()} == {
        "0001": [proof["flips"][0]["command"]],
        "0002": [REPRO],
    }
    for prefix in proof["prefixes"]:
        check = carry("verify", prefix["report"])
        assert check.code == 0, check.out + check.err
