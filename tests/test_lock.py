"""`lock`: the runtime lock per platform, resolved with uv through this machine's own index settings for the Python
and glibc read from the real runtime base images; on a small real upstream (a Python-only wheel with real
Requires-Dist) and on the real vLLM 0.33.0 of examples/vllm, whose lock files are committed."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import dockerenv
from helpers import ROOT, Upstream, assert_bad_input, carry, write_config
from lib.vllm import example_project

pytestmark = [pytest.mark.docker]  # slow: the tests that resolve with uv (tests/conftest.py SLOW_MODULE_FIXTURES)

DOCKER = dockerenv.DOCKER_CLI
# this test's own tags of the runtime bases, removed afterwards: one name per xdist worker, since two of this
# module's tests on two workers would otherwise retag (the stale-base test) or remove each other's bases mid-test
OWN = f"carry-test-lock-issue-24-lock-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}/runtime"

PYPROJECT = """[build-system]
requires = ["setuptools>=61", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "minilock"
dynamic = ["version"]
dependencies = ["idna>=3.4"]
"""
SETUP_PY = "import os\nfrom setuptools import setup\nsetup(version=os.environ['MINILOCK_VERSION'])\n"
FILES = {"pyproject.toml": PYPROJECT, "setup.py": SETUP_PY, "minilock/__init__.py": "NAME = 'minilock'\n"}
BUILD = """build:
  cuda_arches: []
  wheel_version: "0.1.0+carry.{version}"
  version_env: [MINILOCK_VERSION]
  build_isolation: false
  compiler_cache: none
"""


def image_section(amd64: str, arm64: str, lock: str = "  lock: runtime-lock\n") -> str:
    return (
        f"image:\n  name: carry-test-lock\n  platforms:\n    linux/amd64: {{runtime_image: {amd64}}}\n"
        f"    linux/arm64: {{runtime_image: {arm64}}}\n{lock}"
    )


def tag(source: str, target: str) -> None:
    subprocess.run([DOCKER, "tag", source, target], check=True, capture_output=True)


@pytest.fixture
def project(tmp_path):
    env = dockerenv.require()
    amd64, arm64 = f"{OWN}:amd64", f"{OWN}:arm64"
    tag(env.runtime_base, amd64)
    tag(env.runtime_base_arm64, arm64)
    upstream = Upstream.create(tmp_path / "upstream", FILES)
    config = write_config(
        tmp_path / "project", str(upstream.path), upstream.head(), extra=BUILD + image_section(amd64, arm64)
    )
    (config.parent / "VERSION").write_text("20261201.1\n")
    cache = {"CARRY_CACHE": str(tmp_path / "cache")}
    yield config, cache, upstream, env
    subprocess.run([DOCKER, "rmi", amd64, arm64, f"{OWN}:other"], capture_output=True)


def image_id(ref: str) -> str:
    return subprocess.run(
        [DOCKER, "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True, check=True
    ).stdout.strip()


def content_digest(ref: str) -> str:
    """The image's content digest as `docker image inspect` gives the facts: its platform, layers and run-time
    config, hashed (carry.image.locked.runtimebase.content_digest)."""
    from carry.image.locked import runtimebase

    inspected = subprocess.run([DOCKER, "image", "inspect", ref], capture_output=True, text=True, check=True)
    return runtimebase.content_digest(json.loads(inspected.stdout)[0])


def lock(config: Path, env: dict, *args: str):
    return carry("--config", str(config), "lock", *args, env=env)


def test_lock_pins_every_platform_from_the_base_image_and_a_rerun_rewrites_nothing(project):
    config, env, _, _ = project
    made = lock(config, env)
    assert made.code == 0, made.err
    files = {p: config.parent / "runtime-lock" / f"linux-{p}.txt" for p in ("amd64", "arm64")}
    for arch, machine in (("amd64", "x86_64"), ("arm64", "aarch64")):
        text = files[arch].read_text()
        header = text.splitlines()
        assert header[0] == "# carry runtime lock: written by `build.py lock`; do not edit (relock: build.py lock)"
        assert header[1:8] == [
            "# format: 2",
            f"# platform: linux/{arch}",
            "# python: 3.11.2",
            f"# target: {machine}-manylinux_2_36",
            f"# base: {OWN}:{arch}",
            f"# base-content: {content_digest(f'{OWN}:{arch}')}",
            "# base-python: own",
        ]
        assert re.fullmatch(r"# requires-dist: sha256:[0-9a-f]{64}", header[8])
        assert header[9] == "# requires: minilock==0.1.0+carry.20261201.1"
        assert header[10].startswith("idna==") and header[11].strip().startswith("--hash=sha256:")
        # the base is named by what it holds, never by this engine's image ID
        assert image_id(f"{OWN}:{arch}").removeprefix("sha256:") not in text
        assert f"linux/{arch}: 1 packages, python 3.11.2, target {machine}-manylinux_2_36" in made.out
    assert made.out.count("wrote runtime-lock/linux-") == 2
    # the base's facts were read from the images themselves (python3 run in each, arm64 emulated)
    assert f"linux/arm64: {OWN}:arm64" in made.err and "glibc 2.36" in made.err

    before = {arch: (path.read_bytes(), path.stat().st_mtime_ns) for arch, path in files.items()}
    again = lock(config, env)
    assert again.code == 0, again.err
    assert again.out.count(": up to date") == 2
    assert {arch: (path.read_bytes(), path.stat().st_mtime_ns) for arch, path in files.items()} == before
    checked = lock(config, env, "--check")
    assert checked.code == 0, checked.err
    assert checked.out.splitlines() == ["linux/amd64: fresh", "linux/arm64: fresh"]

    # determinism: resolved afresh (no lock to prefer, then --upgrade) it is the same bytes
    for path in files.values():
        path.unlink()
    assert lock(config, env).code == 0
    assert lock(config, env, "--upgrade").code == 0
    assert {arch: path.read_bytes() for arch, path in files.items()} == {a: b for a, (b, _) in before.items()}


def test_a_stale_lock_names_what_drifted(project, tmp_path):
    config, env, upstream, docker_env = project
    assert lock(config, env, "--platform", "linux/amd64").code == 0
    path = config.parent / "runtime-lock" / "linux-amd64.txt"
    old_digest = path.read_text().splitlines()[8].split(": ")[1]

    # Requires-Dist changed: a patch adds a dependency
    upstream.make_patch(
        config.parent / "patches" / "0001-needs-six.patch",
        "Depend on six",
        {"pyproject.toml": PYPROJECT.replace('["idna>=3.4"]', '["idna>=3.4", "six"]')},
    )
    stale = lock(config, env, "--platform", "linux/amd64", "--check")
    assert stale.code == 1, stale.err
    line = stale.out.strip()
    assert (
        line.startswith("runtime-lock/linux-amd64.txt is stale (linux/amd64): requires-dist ")
        or "linux-amd64.txt is stale (linux/amd64): requires-dist " in line
    )
    assert f"requires-dist {old_digest[:19]}… -> sha256:" in line
    assert f"relock: `build.py --config {config} lock`" in line
    relocked = lock(config, env, "--platform", "linux/amd64")
    assert relocked.code == 0, relocked.err
    assert "six==" in path.read_text() and "linux/amd64: 2 packages" in relocked.out

    # the same image under another name is the same base: fresh
    tag(docker_env.runtime_base, f"{OWN}:other")
    config.write_text(config.read_text().replace(f"{OWN}:amd64", f"{OWN}:other"))
    renamed = lock(config, env, "--platform", "linux/amd64", "--check")
    assert renamed.code == 0 and renamed.out.strip() == "linux/amd64: fresh", renamed.out + renamed.err
    config.write_text(config.read_text().replace(f"{OWN}:other", f"{OWN}:amd64"))

    # the base changed: another image retagged as the runtime image
    old_content = path.read_text().splitlines()[6].split(": ")[1]
    tag(docker_env.build_base, f"{OWN}:amd64")
    stale = lock(config, env, "--platform", "linux/amd64", "--check")
    assert stale.code == 1
    new_content = content_digest(docker_env.build_base)
    assert f"base {OWN}:amd64 {old_content[:19]}… -> {new_content[:19]}…" in stale.out
    assert "requires-dist" not in stale.out

    # the image side's check (runtimelock.check_fresh): one line, exit 2, per field
    from carry import config as configuration
    from carry.image.locked import runtimelock
    from carry.platforms import Platform
    from carry.util.cache import Cache
    from carry.util.errors import BadInput

    loaded = configuration.load(config)
    current = runtimelock.read(loaded, Platform.LINUX_AMD64)
    wheel = max((Path(env["CARRY_CACHE"]) / "artifacts").glob("*/minilock-*.whl"), key=lambda w: w.stat().st_mtime)
    with pytest.raises(BadInput) as raised:  # the base retagged above
        runtimelock.require_fresh(loaded, Platform.LINUX_AMD64, wheel, Cache(Path(env["CARRY_CACHE"])))
    assert f"base {OWN}:amd64 {old_content[:19]}… -> {new_content[:19]}…" in str(raised.value)
    wheel_requires = ["idna>=3.4", "six"]

    def base(python: str = "3.11.2", content: str = current.base_content, origin: str = "own"):
        return runtimelock.BaseFacts(python, "2.36", content, current.base, origin)

    runtimelock.check_fresh(current, requires_dist=wheel_requires, base=base())
    with pytest.raises(BadInput) as raised:
        runtimelock.check_fresh(current, requires_dist=wheel_requires, base=base("3.12.1"))
    assert "python 3.11.2 -> 3.12.1" in str(raised.value) and "\n" not in str(raised.value)
    assert BadInput.exit_code == 2
    with pytest.raises(BadInput) as raised:
        runtimelock.check_fresh(current, requires_dist=["idna>=3.4"], base=base(content="sha256:" + "0" * 64))
    message = str(raised.value)
    assert "requires-dist" in message and f"base {OWN}:amd64" in message and "python" not in message.split(";")[0]
    with pytest.raises(BadInput) as raised:  # the same image, its Python now derived by a recipe
        runtimelock.check_fresh(current, requires_dist=wheel_requires, base=base(origin="apt sha256:" + "1" * 64))
    assert "base-python own -> apt sha256:111111111111…" in str(raised.value)


def test_bad_input_writes_nothing(project):
    config, env, _, _ = project
    text = config.read_text()
    lock_dir = config.parent / "runtime-lock"

    config.write_text(text.replace("  lock: runtime-lock\n", ""))
    assert_bad_input(lock(config, env), "image.lock is not set", "lock: runtime-lock")

    config.write_text(text.replace(f"    linux/arm64: {{runtime_image: {OWN}:arm64}}\n", "    linux/arm64: {}\n"))
    assert_bad_input(lock(config, env), "no runtime image for linux/arm64", "runtime_image")

    config.write_text(text.replace(f"{OWN}:arm64", f"{OWN}:missing"))
    assert_bad_input(lock(config, env), f"runtime image {OWN}:missing (for linux/arm64) is not in the Docker engine")

    config.write_text(text.replace(f"{OWN}:arm64", f"{OWN}:amd64"))
    assert_bad_input(lock(config, env), f"runtime image {OWN}:amd64 is for linux/amd64, not linux/arm64")

    config.write_text(text)
    upstream_py = config.parent.parent / "upstream"
    Upstream(upstream_py).make_patch(
        config.parent / "patches" / "0001-impossible.patch",
        "Impossible pin",
        {"pyproject.toml": PYPROJECT.replace('"idna>=3.4"', '"idna==0.0.1"')},
    )
    failed = lock(config, env)  # found after the wheel is built: the error is the last line, after the progress
    assert failed.code == 2 and "Traceback" not in failed.err
    last = failed.err.strip().splitlines()[-1]
    assert last.startswith("carry: error: runtime lock for linux/amd64 (target x86_64-manylinux_2_36, python 3.11.2")
    assert "no version of idna==0.0.1" in last
    assert not lock_dir.exists()


def test_vllm_example_lock_is_committed_and_fresh(tmp_path, vllm_history, fixed_wheels):
    """examples/vllm's lock, made from the real 0.33.0 fixed wheels (precompiled, both CPUs here; the run's own,
    tests/conftest.py `fixed_wheels`, in a copy of their cache): `lock` in a copy of the example on the run's vLLM
    history keeps every pin and hash of the committed files. The base is named by its content digest (its layers and
    run-time config), which is the committed one wherever .ci/base-images.sh built the same image (a reproducible
    build from the same Debian packages): then nothing is rewritten at all. The base is derived with
    image.runtime_packages (g++, libc6-dev, python3-dev: what vLLM compiles with at run time), and the CUDA toolkit
    wheels that make the image's CUDA_HOME are one release, torch's 13.0 (issue 47)."""
    from carry.image.locked import runtimebase

    dockerenv.require()
    example = ROOT / "examples" / "vllm"
    copy = tmp_path / "vllm"
    config = example_project(copy, vllm_history["path"])
    env = {"CARRY_CACHE": str(fixed_wheels.cache_copy(tmp_path / "cache"))}
    done = carry("--config", str(config), "lock", env=env, timeout=1800)
    assert done.code == 0, done.err[-3000:]
    for arch, machine in (("amd64", "x86_64"), ("arm64", "aarch64")):
        committed = (example / "runtime-lock" / f"linux-{arch}.txt").read_text()
        made = (copy / "runtime-lock" / f"linux-{arch}.txt").read_text()
        content = content_digest(f"carry-local/runtime-base:{arch}")
        python = f"apt {runtimebase.recipe_hash('apt', ('g++', 'libc6-dev', 'python3-dev'))}"
        assert f"# base: carry-local/runtime-base:{arch}\n# base-content: {content}\n# base-python: {python}\n" in made
        same_base = f"# base-content: {content}\n" in committed
        assert (made == committed) == same_base
        assert [x for x in made.splitlines() if not x.startswith("# base-content:")] == [
            x for x in committed.splitlines() if not x.startswith("# base-content:")
        ]
        line = f"linux/{arch}: 197 packages, python 3.11.2, target {machine}-manylinux_2_36"
        assert (
            f"{line}, base carry-local/runtime-base:{arch} ({content[:19]}…, python {python[:23]}…): "
            f"{'up to date' if same_base else f'wrote runtime-lock/linux-{arch}.txt'}" in done.out
        )
        assert f"# target: {machine}-manylinux_2_36" in committed and "# python: 3.11.2" in committed
        assert "\ntorch==2.14.0 \\\n" in committed and "\nnvidia-cuda-runtime==13.0.96 \\\n" in committed
        for toolkit in (
            "nvidia-cuda-nvcc==13.0.",
            "nvidia-cuda-crt==13.0.",
            "nvidia-nvvm==13.0.",
            "nvidia-cuda-cccl==13.0.",
        ):
            assert f"\n{toolkit}" in committed, toolkit
        assert "\nflashinfer-python==" in committed and "# requires: vllm==0.33.0+carry." in committed
        # one hash for torch: its wheel for this CPU and Python
        torch = committed.split("\ntorch==2.14.0 \\\n", 1)[1].split("\n")[0]
        assert torch.strip().startswith("--hash=sha256:") and not torch.endswith("\\")
    checked = carry("--config", str(config), "lock", "--check", env=env, timeout=1800)
    assert checked.code == 0, checked.out + checked.err[-2000:]
    assert checked.out.splitlines() == ["linux/amd64: fresh", "linux/arm64: fresh"]


def test_the_index_is_uvs_own_else_pips_remote_ones(tmp_path):
    from carry.image.locked import runtimelock

    pip = {
        "index-url": "https://user:secret@mirror.internal.example/simple",
        "extra-index-url": "file:///opt/local/simple https://extra.internal.example/simple",
    }
    uv_env = runtimelock.choose_index({"UV_DEFAULT_INDEX": "https://uv.internal.example/simple"}, tmp_path, lambda: pip)
    assert uv_env.source == "uv's own index settings" and "UV_INDEX_URL" not in uv_env.environ
    (tmp_path / "uv.toml").write_text('index-url = "https://uv.internal.example/simple"\n')
    assert runtimelock.choose_index({}, tmp_path, lambda: pip).source == "uv's own index settings"
    (tmp_path / "uv.toml").unlink()
    from_pip = runtimelock.choose_index({"XDG_CONFIG_HOME": str(tmp_path)}, tmp_path, lambda: pip)
    assert from_pip.environ["UV_INDEX_URL"] == pip["index-url"]
    assert from_pip.environ["UV_EXTRA_INDEX_URL"] == "https://extra.internal.example/simple"
    assert "secret" not in from_pip.source and "mirror.internal.example/simple" in from_pip.source
    assert "skipped pip's local file:///opt/local/simple" in from_pip.source
    # this machine: pip.conf's extra indexes are local directories, so uv's default index resolves
    here = runtimelock.choose_index({k: v for k, v in os.environ.items() if not k.startswith("UV_")}, ROOT)
    assert not here.environ.get("UV_EXTRA_INDEX_URL", "").startswith("file:")


def test_image_lock_entrypoint_and_cmd_are_parsed_and_checked(tmp_path):
    from carry import config as configuration

    base = "upstream:\n  url: /nowhere\n  commit: " + "a" * 40 + "\nimage:\n"
    path = tmp_path / "build.yaml"
    path.write_text(base + "  lock: runtime-lock\n  entrypoint: [vllm, serve]\n  cmd: []\n")
    loaded = configuration.load(path)
    assert loaded.image.lock == tmp_path / "runtime-lock"
    assert loaded.image.entrypoint == ("vllm", "serve") and loaded.image.cmd == ()
    path.write_text(base + "  entrypoint: vllm serve --port 8000\n")
    assert configuration.load(path).image.entrypoint == ("vllm", "serve", "--port", "8000")
    assert configuration.load(path).image.lock is None and configuration.load(path).image.cmd is None
    for bad, needle in (
        ("  lock: /abs/lock\n", "image.lock must be a directory relative to the config's"),
        ("  lock: ../elsewhere\n", "image.lock must be a directory relative"),
        ("  entrypoint: 7\n", "image.entrypoint must be a string or a list of strings"),
        ("  cmd: [python3, 3]\n", "image.cmd must be a string or a list of strings"),
    ):
        path.write_text(base + bad)
        assert_bad_input(carry("--config", str(path), "lock"), needle)


def test_a_lock_whose_cuda_toolkit_mixes_releases_is_refused(tmp_path, vllm_history):
    """examples/vllm's first committed lock (tests/data/lock: humming-kernels' unpinned nvcc resolved to 13.5 beside
    torch's runtime 13.0; FlashInfer's JIT failed on an H200): `lock --check` and `image` refuse it before any work,
    one line naming the packages and versions, exit 2, nothing written."""
    copy = tmp_path / "vllm"
    config = example_project(copy, vllm_history["path"])
    lock = copy / "runtime-lock" / "linux-amd64.txt"
    lock.write_text((ROOT / "tests" / "data" / "lock" / "vllm-0.33.0-cuda-13.0-and-13.5.txt").read_text())
    before = sorted(p.name for p in copy.rglob("*"))
    env = {"CARRY_CACHE": str(tmp_path / "cache")}
    for command in (("lock", "--check", "--platform", "linux/amd64"), ("image", "--platform", "linux/amd64")):
        done = carry("--config", str(config), *command, env=env, timeout=300)
        assert_bad_input(done)
        line = done.err.strip()
        assert "linux-amd64.txt: its CUDA toolkit is not one release: nvidia-cuda-runtime 13.0.96" in line, line
        for named in ("nvidia-cuda-nvcc 13.5.37", "nvidia-cuda-crt 13.5.37", "nvidia-nvvm 13.5.37", "cccl 13.3.5.0.6"):
            assert named in line, (named, line)
        assert sorted(p.name for p in copy.rglob("*")) == before
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.whl"))


def test_the_toolkit_is_held_to_the_runtimes_release():
    """cudatoolkit: no nvcc, nothing to agree; nvcc of torch's release agrees; another release is named and held."""
    from carry.image.locked import cudatoolkit

    runtime = {"nvidia-cuda-runtime": "13.0.96", "nvidia-cublas": "13.1.0.3"}
    assert cudatoolkit.mismatch(runtime) is None
    assert cudatoolkit.mismatch({**runtime, "nvidia-cuda-nvcc": "13.0.88", "nvidia-cuda-cccl": "13.0.85"}) is None
    pins = {**runtime, "nvidia-cuda-nvcc": "13.5.37", "nvidia-nvvm": "13.5.37", "nvidia-cuda-cccl": "13.0.85"}
    found = cudatoolkit.mismatch(pins)
    assert found is not None and found.release == "13.0"
    assert found.others == (("nvidia-cuda-nvcc", "13.5.37"), ("nvidia-nvvm", "13.5.37"))
    assert cudatoolkit.constraints(pins, found) == [
        "nvidia-cuda-cccl==13.0.*",
        "nvidia-cuda-nvcc==13.0.*",
        "nvidia-cuda-runtime==13.0.*",
        "nvidia-nvvm==13.0.*",
    ]
    cu12 = {"nvidia-cuda-runtime-cu12": "12.8.90", "nvidia-cuda-nvcc-cu12": "12.9.86"}
    assert cudatoolkit.mismatch(cu12).others == (("nvidia-cuda-nvcc-cu12", "12.9.86"),)
