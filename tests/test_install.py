"""A plain install runs every command: carry's own wheel, built from this checkout and installed non-editable into
a fresh venv, carries the Dockerfile the image is built from, runs as `python -m carry`, and builds the demo image
from a directory that is not this checkout."""

from __future__ import annotations

import os
import shutil
import zipfile

import pytest

import dockerenv
from helpers import ROOT
from lib.installed import clean_env, run

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def installed(installed_carry):
    """(venv, wheel): carry's wheel built from a copy of the checkout's files (the build writes nothing into the
    checkout), installed into a fresh venv with its dependencies; once per run (tests/conftest.py)."""
    return installed_carry.venv, installed_carry.wheel


def test_the_wheel_carries_the_dockerfile_and_the_image_files(installed):
    _, wheel = installed
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert archive.read("carry/resources/Dockerfile") == (ROOT / "Dockerfile").read_bytes()
    assert {"carry/__main__.py", "carry/image_files/entrypoint.sh"} <= names, sorted(names)
    assert (ROOT / "Dockerfile").is_symlink() and (ROOT / "Dockerfile").resolve() == (
        ROOT / "carry" / "resources" / "Dockerfile"
    )  # one file: the top-level Dockerfile links to the package's


def test_python_m_carry_runs_the_installed_cli(installed, tmp_path):
    venv, _ = installed
    where = run([venv / "bin" / "python", "-c", "import carry; print(carry.__file__)"], tmp_path, clean_env())
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr  # not this checkout
    for argv in ([venv / "bin" / "python", "-m", "carry", "--help"], [venv / "bin" / "carry", "--help"]):
        helped = run(argv, tmp_path, clean_env())
        assert helped.returncode == 0, helped.stderr
        assert helped.stdout.startswith("Usage: carry [OPTIONS] COMMAND [ARGS]...")
        for command in ("check", "wheel", "verify", "image", "status", "drop"):
            assert f"\n  {command} " in helped.stdout, helped.stdout
    version = run(
        [venv / "bin" / "python", "-m", "carry", "--config", ROOT / "examples" / "demo" / "build.yaml", "version"],
        tmp_path,
        clean_env(),
    )
    assert (
        version.returncode == 0
        and version.stdout.strip() == (ROOT / "examples" / "demo" / "VERSION").read_text().strip()
    ), version


@pytest.mark.docker
def test_the_installed_carry_builds_the_demo_image(installed, tmp_path):
    env = dockerenv.require()
    venv, _ = installed
    project = tmp_path / "demo"
    shutil.copytree(ROOT / "examples" / "demo", project)
    config = project / "build.yaml"
    name = f"{env.registry}/carry-installed-{os.urandom(3).hex()}"
    dockerenv.set_image_section(config, env.image_section(name, ("linux/amd64",)))
    version = (project / "VERSION").read_text().strip()
    run_env = clean_env(
        CARRY_CACHE=str(tmp_path / "cache"),
        CARRY_DOCKER=dockerenv.DOCKER_CLI,
        DOCKER_HOST=env.docker_host,
        DOCKER_CONFIG=str(tmp_path / "docker-config"),
    )
    try:
        built = run(
            [venv / "bin" / "carry", "--config", config, "image", "--platform", "linux/amd64", "--hermetic"],
            tmp_path,
            run_env,
            timeout=1800,
        )
        assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
        refs = [line.split()[0] for line in built.stdout.splitlines() if line.strip()]
        assert f"{name}:{version}" in refs, built.stdout
        labels = dockerenv.docker_client().images.get(f"{name}:{version}").labels
        assert (labels["io.carry.platform"], labels["io.carry.version"]) == ("linux/amd64", version), labels
        patches = sorted(p.name for p in (project / "patches").glob("*.patch"))
        assert labels["io.carry.patches"] == ",".join(patches), labels
    finally:
        client = dockerenv.docker_client()
        for image in client.images.list(name=name):
            client.images.remove(image.id, force=True)
