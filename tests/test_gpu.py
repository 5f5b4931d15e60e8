"""GPU truth: install a demo wheel built by carry and run its kernels against the CPU references.

Runs only where a CUDA GPU answers (`nvidia-smi -L`); skips elsewhere. The wheel comes from
$CARRY_GPU_WHEEL (a wheel built elsewhere for this machine's Python), else carry builds one here
for the GPU's arch. $CARRY_GPU_FOREIGN_WHEEL may name a wheel built without this GPU's arch: it
must fail with CUDA's "no kernel image" error, the failure the arch gate exists to prevent.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, carry

pytestmark = pytest.mark.gpu

KERNEL_CHECK = r"""
import json, random, sys
from array import array
import pledemo
from pledemo import reference

random.seed(7)
dim, rows = 64, 512
table = array("f", (random.uniform(-1, 1) for _ in range(dim * rows)))
indices = array("i", (random.randrange(rows) for _ in range(1000)))
x = array("f", (random.uniform(-1, 1) for _ in range(dim * 200)))
y = array("f", (random.uniform(-1, 1) for _ in range(dim * 200)))
scales = array("f", (random.uniform(0.5, 2) for _ in range(200)))

def worst(got, want):
    assert len(got) == len(want), (len(got), len(want))
    return max(abs(a - b) for a, b in zip(got, want))

results = {
    "saxpy": worst(pledemo.saxpy(1.5, x, y), reference.saxpy(1.5, x, y)),
    "ple_gather": worst(pledemo.ple_gather(table, indices, dim), reference.ple_gather(table, indices, dim)),
    "row_scale": worst(pledemo.row_scale(x, scales, dim), reference.row_scale(x, scales, dim)),
    "row_sum": worst(pledemo.row_sum(x, dim), reference.row_sum(x, dim)),
}
print(json.dumps({"version": pledemo.__version__, "max_abs_error": results}))
"""


def gpu_capability() -> str | None:
    """The first GPU's compute capability (e.g. '9.0'), or None where no GPU answers."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"], capture_output=True, text=True
    )
    if out.returncode != 0 or not out.stdout.strip():
        return None
    print(f"GPU: {out.stdout.strip()}")
    return out.stdout.strip().splitlines()[0].split(",")[-1].strip()


@pytest.fixture(scope="module")
def capability():
    found = gpu_capability()
    if found is None:
        pytest.skip("no CUDA GPU here (nvidia-smi -L finds none)")
    return found


def install(wheel: Path, target: Path) -> dict[str, str]:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
    )
    return {**os.environ, "PYTHONPATH": str(target)}


def built_wheel(capability: str, tmp_path: Path) -> Path:
    given = os.environ.get("CARRY_GPU_WHEEL")
    if given:
        return Path(given)
    project = tmp_path / "demo"
    shutil.copytree(ROOT / "examples" / "demo", project)
    config = project / "build.yaml"
    config.write_text(config.read_text().replace("compiler_cache: auto", "compiler_cache: none"))
    result = carry(
        "--config",
        str(config),
        "wheel",
        "--arch",
        capability,
        "--out",
        str(tmp_path / "dist"),
        env={"CARRY_CACHE": str(tmp_path / "cache")},
    )
    assert result.code == 0, result.err
    return Path(result.out.strip())


def test_demo_kernels_match_cpu_reference_on_the_gpu(capability, tmp_path):
    wheel = built_wheel(capability, tmp_path)
    env = install(wheel, tmp_path / "site")
    run = subprocess.run([sys.executable, "-c", KERNEL_CHECK], env=env, capture_output=True, text=True, cwd=tmp_path)
    print(run.stdout, run.stderr)
    assert run.returncode == 0, run.stderr
    import json

    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert "+carry." in report["version"]
    for kernel, error in report["max_abs_error"].items():
        assert error < 1e-4, (kernel, error)


def test_wheel_without_this_gpus_arch_fails_with_no_kernel_image(capability, tmp_path):
    foreign = os.environ.get("CARRY_GPU_FOREIGN_WHEEL")
    if not foreign:
        pytest.skip("set CARRY_GPU_FOREIGN_WHEEL to a wheel built without this GPU's arch")
    env = install(Path(foreign), tmp_path / "site")
    run = subprocess.run([sys.executable, "-c", KERNEL_CHECK], env=env, capture_output=True, text=True, cwd=tmp_path)
    print(run.stdout, run.stderr)
    assert run.returncode != 0
    assert "no kernel image is available" in run.stderr
