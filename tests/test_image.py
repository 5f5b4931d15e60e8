"""The demo image through the real Dockerfile on a real engine, pushed to and pulled from an authenticated
registry, verified after the pull; and no secret anywhere it could leak."""

from __future__ import annotations

import os
import shutil

import pytest

import dockerenv
from procwatch import command_lines
from helpers import ROOT, carry

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SECRET = "build-secret-" + os.urandom(8).hex()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    env = dockerenv.require()
    base = tmp_path_factory.mktemp("image")
    project = base / "demo"
    shutil.copytree(ROOT / "examples" / "demo", project)
    config = project / "build.yaml"
    name = f"{env.registry}/carry-demo-{os.urandom(3).hex()}"
    text = config.read_text().replace("  name: carry-demo", f"  name: {name}")
    config.write_text(
        text + f"  base_image: {env.build_base}\n  runtime_image: {env.runtime_base}\n"
        "  secret_env: [CARRY_TEST_BUILD_SECRET]\n"
    )
    version = (project / "VERSION").read_text().strip()
    run_env = {
        "CARRY_CACHE": str(base / "cache"),
        "CARRY_DOCKER": dockerenv.DOCKER_CLI,
        "DOCKER_HOST": env.docker_host,
        "DOCKER_CONFIG": str(base / "docker-config"),
        "CARRY_TEST_BUILD_SECRET": SECRET,
        "CARRY_REGISTRY_USER": env.registry_user,
        "CARRY_REGISTRY_PASSWORD": env.registry_password(),
    }
    with command_lines() as argv_seen:
        pushed = carry("--config", str(config), "image", "--hermetic", "--push", env=run_env)
    assert pushed.code == 0, pushed.out + pushed.err
    return {
        "env": env, "run_env": run_env, "config": config, "name": name, "version": version,
        "pushed": pushed, "argv": argv_seen, "cache": base / "cache",
    }


def run(setup, *args: str, **extra):
    return carry("--config", str(setup["config"]), *args, env={**setup["run_env"], **extra})


def test_push_reports_every_tag_with_a_digest(setup):
    lines = setup["pushed"].out.strip().splitlines()
    version = setup["version"]
    expected = {f"{setup['name']}:{version}", f"{setup['name']}:{version}-cu130", f"{setup['name']}:latest"}
    assert {line.split()[0] for line in lines} == expected
    assert all(line.split()[1].startswith("sha256:") for line in lines)
    assert "] build:" in setup["pushed"].err and "] push:" in setup["pushed"].err


def test_pull_after_deleting_local_copy_then_verify(setup):
    client = dockerenv.docker_client()
    ref = f"{setup['name']}:{setup['version']}"
    for tag in ("latest", f"{setup['version']}-cu130", setup["version"]):
        client.images.remove(f"{setup['name']}:{tag}", force=True)
    with pytest.raises(Exception):
        client.images.get(ref)
    result = run(setup, "verify", ref)
    assert result.code == 0, result.out + result.err
    assert "verified" in result.out
    image = client.images.get(ref)
    labels = image.labels
    checked = run(setup, "check", "--json")
    import json

    report = json.loads(checked.out)
    assert labels["io.carry.upstream.commit"] == report["base"]
    assert labels["org.opencontainers.image.revision"] == report["base"]
    assert labels["io.carry.series.hash"] == report["series_hash"]
    assert labels["io.carry.cuda_arches"] == "9.0,12.0,12.1"
    assert labels["org.opencontainers.image.version"] == setup["version"]
    assert labels["io.carry.patches"] == ",".join(p["name"] for p in report["patches"])


def test_verify_after_version_bump_fails_naming_version(setup):
    version_file = setup["config"].parent / "VERSION"
    saved = version_file.read_text()
    try:
        assert run(setup, "version", "bump").code == 0
        result = run(setup, "verify", f"{setup['name']}:{setup['version']}")
        assert result.code == 1
        assert "MISMATCH label version" in result.out and "MISMATCH buildinfo version" in result.out
    finally:
        version_file.write_text(saved)


def test_image_runs_the_wheel_and_runtime_env_defaults(setup):
    client = dockerenv.docker_client()
    ref = f"{setup['name']}:{setup['version']}"
    out = client.containers.run(ref, ["python3", "-c", "import pledemo, pledemo.buildinfo as b; "
                                      "print(pledemo.__version__, b.load()['series']['hash'])"],
                                remove=True, network_disabled=True).decode()
    assert f"+carry.{setup['version']}" in out
    assert len(out.split()[1]) == 64


def test_no_secret_in_history_labels_logs_buildinfo_or_argv(setup):
    client = dockerenv.docker_client()
    ref = f"{setup['name']}:{setup['version']}"
    image = client.images.get(ref)
    history = " ".join(str(layer) for layer in image.history())
    password = setup["env"].registry_password()
    for secret in (SECRET, password):
        assert secret not in history
        assert secret not in str(image.labels) and secret not in str(image.attrs["Config"])
        assert secret not in setup["pushed"].out + setup["pushed"].err
        for log in (setup["cache"] / "logs").glob("*.log"):
            assert secret not in log.read_text(errors="replace"), log
        assert not any(secret in argv for argv in setup["argv"]), "a secret was on a command line"
    assert any(" build " in argv and "--label" in argv for argv in setup["argv"]), "the watcher saw the build"
    filesystem = client.containers.run(ref, ["sh", "-c", "grep -rl " + SECRET[:20] + " /etc /opt /usr/local || true"],
                                       remove=True, network_disabled=True, entrypoint=[]).decode()
    assert filesystem.strip() == ""


def test_push_with_wrong_password_is_refused(setup):
    result = run(setup, "image", "--hermetic", "--push", CARRY_REGISTRY_PASSWORD="wrong-" + SECRET)
    assert result.code == 1
    assert "login to" in result.err and "failed" in result.err
    assert "wrong-" + SECRET not in result.err + result.out


def test_bad_tag_is_exit_2(setup):
    result = run(setup, "image", "--tag", "bad tag!")
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1 and "Traceback" not in result.err


def test_foreign_platform_without_buildx_is_one_line_exit_2(setup):
    result = run(setup, "image", "--platform", "linux/arm64")
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
    assert "only the native platform linux/amd64 can be built" in result.err
