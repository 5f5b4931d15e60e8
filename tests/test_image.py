"""The demo image for linux/amd64 and linux/arm64 (GB10; built under QEMU here) through the real Dockerfile on a
real engine, pushed to an authenticated registry as one manifest list per shared tag, pulled back per platform
and verified; the arm64 wheel built alone in that platform's build stage; and no secret anywhere it could leak."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import docker.errors
import pytest

import dockerenv
from cuda_tools import cuobjdump
from helpers import ROOT, assert_bad_input, carry
from procwatch import command_lines

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SECRET = "build-secret-" + os.urandom(8).hex()
PLATFORMS = ("linux/amd64", "linux/arm64")
MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
AARCH64 = 183


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    env = dockerenv.require()
    base = tmp_path_factory.mktemp("image")
    project = base / "demo"
    shutil.copytree(ROOT / "examples" / "demo", project)
    config = project / "build.yaml"
    name = f"{env.registry}/carry-demo-{os.urandom(3).hex()}"
    dockerenv.set_image_section(config, env.image_section(name, PLATFORMS, "  secret_env: [CARRY_TEST_BUILD_SECRET]\n"))
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
        pushed = carry(
            "--config",
            str(config),
            "image",
            "--platform",
            "linux/amd64",
            "--platform",
            "linux/arm64",
            "--push",
            "--hermetic",
            "--cache-to",
            "inline",
            env=run_env,
            timeout=3000,
        )
    assert pushed.code == 0, pushed.out + pushed.err
    yield {
        "env": env,
        "run_env": run_env,
        "config": config,
        "name": name,
        "version": version,
        "pushed": pushed,
        "argv": argv_seen,
        "cache": base / "cache",
        "base": base,
    }
    dockerenv.forget(name)


def run(setup, *args: str, **extra):
    return carry("--config", str(setup["config"]), *args, env={**setup["run_env"], **extra}, timeout=3000)


def registry_manifest(setup, tag: str) -> dict:
    """The registry's own answer for a tag, read over its HTTP API with basic auth (not through carry)."""
    env = setup["env"]
    repository = setup["name"].split("/", 1)[1]
    request = urllib.request.Request(
        f"http://{env.registry}/v2/{repository}/manifests/{tag}",
        headers={
            "Accept": f"{MANIFEST_LIST}, application/vnd.oci.image.index.v1+json, "
            "application/vnd.docker.distribution.manifest.v2+json"
        },
    )
    token = base64.b64encode(f"{env.registry_user}:{env.registry_password()}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def shared_tags(setup) -> list[str]:
    return [setup["version"], f"{setup['version']}-cu130", "latest"]


def test_push_reports_platform_images_and_manifest_lists(setup):
    rows = {line.split("  ")[0]: line.split("  ")[1:] for line in setup["pushed"].out.strip().splitlines()}
    name, version = setup["name"], setup["version"]
    assert rows[f"{name}:{version}-amd64"][1] == "linux/amd64"
    assert rows[f"{name}:{version}-arm64"][1] == "linux/arm64"
    for tag in shared_tags(setup):
        digest, platforms = rows[f"{name}:{tag}"]
        assert digest.startswith("sha256:") and platforms == "linux/amd64, linux/arm64"
    # five images pushed; the rest of stdout is the SBOM written for each platform (no signing key in this test)
    assert len([ref for ref in rows if ref.startswith(f"{name}:")]) == 5, setup["pushed"].out
    others = [line for line in setup["pushed"].out.strip().splitlines() if not line.startswith(f"{name}:")]
    assert [line.split(":")[0] for line in others] == ["sbom       linux/amd64", "sbom       linux/arm64"], others
    err = setup["pushed"].err
    assert "linux/arm64 (emulated on linux/amd64), arches 12.1" in err and "] manifest:" in err


def test_every_shared_tag_in_the_registry_is_a_list_of_both_platforms(setup):
    for tag in shared_tags(setup):
        found = registry_manifest(setup, tag)
        assert found["mediaType"] == MANIFEST_LIST, found
        assert sorted(m["platform"]["architecture"] for m in found["manifests"]) == ["amd64", "arm64"]
    assert registry_manifest(setup, f"{setup['version']}-arm64")["mediaType"] != MANIFEST_LIST


def test_second_engine_rebuilds_each_platform_from_its_own_image(setup, second_engine):
    """Another runner (an empty second dockerd, a fresh CARRY_CACHE) rebuilds both platforms of this VERSION with
    --cache-from inline: each imports its own platform image's inline cache and compiles nothing."""
    env = setup["env"]
    engine = second_engine  # the run's one (tests/conftest.py), emptied: only the four base images
    engine.empty()
    assert set(engine.bases) == {env.build_base, env.runtime_base, env.build_base_arm64, env.runtime_base_arm64}
    try:
        result = run(
            setup,
            "image",
            "--platform",
            "linux/amd64",
            "--platform",
            "linux/arm64",
            "--hermetic",
            "--cache-from",
            "inline",
            DOCKER_HOST=engine.host,
            CARRY_CACHE=str(setup["base"] / "runner-b"),
        )
        assert result.code == 0, result.out + result.err
        arm64 = engine.docker(
            "image", "inspect", "--format", "{{.Architecture}}", f"{setup['name']}:{setup['version']}-arm64"
        )
    finally:
        engine.empty()
    log = next((setup["base"] / "runner-b" / "logs").glob("image-*.log")).read_text()
    for platform in PLATFORMS:
        assert f"layer cache: {platform}: build stage: cached, nothing compiled" in result.err
        assert f"importing cache manifest from {setup['name']}:{setup['version']}-{platform.split('/')[1]}" in log
    assert "] build: python -m build" not in log and arm64.strip() == "arm64"


def test_pull_arm64_runs_aarch64_python_with_an_aarch64_sm121_extension(setup, tmp_path):
    """`docker pull --platform linux/arm64` of the VERSION tag, then look inside with docker alone."""
    env = setup["env"]
    ref = f"{setup['name']}:{setup['version']}"
    with dockerenv.logged_in(env) as cli:
        pulled = subprocess.run(
            [dockerenv.DOCKER_CLI, "pull", "--platform", "linux/arm64", ref],
            env=cli,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert pulled.returncode == 0, pulled.stderr
        script = "import platform, pledemo._C as c; print(platform.machine()); print(c.__file__)"
        inside = subprocess.run(
            [
                dockerenv.DOCKER_CLI,
                "run",
                "--rm",
                "--network=none",
                "--platform",
                "linux/arm64",
                ref,
                "python3",
                "-c",
                script,
            ],
            env=cli,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert inside.returncode == 0, inside.stderr
        machine, so_path = inside.stdout.split()
        assert machine == "aarch64"
        box = subprocess.run(
            [dockerenv.DOCKER_CLI, "create", "--platform", "linux/arm64", ref],
            env=cli,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        try:
            subprocess.run(
                [dockerenv.DOCKER_CLI, "cp", f"{box}:{so_path}", str(tmp_path / "ext.so")],
                env=cli,
                check=True,
                capture_output=True,
            )
        finally:
            subprocess.run([dockerenv.DOCKER_CLI, "rm", box], env=cli, capture_output=True)
    header = (tmp_path / "ext.so").read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == AARCH64
    listed = subprocess.run([cuobjdump(), "--list-elf", str(tmp_path / "ext.so")], capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    assert "sm_121" in listed.stdout


def test_verify_one_platform_after_pulling_it(setup):
    result = run(setup, "verify", f"{setup['name']}:{setup['version']}", "--platform", "linux/arm64")
    assert result.code == 0, result.out + result.err
    assert "linux/arm64 (emulated on linux/amd64): python 3." in result.out and " on aarch64" in result.out
    assert re.search(r"_C +exact sm_121\n", result.out) and result.out.count("  verified") == 1
    assert "cpu: 1/1 shared object(s) are aarch64 code (linux/arm64)" in result.out


def test_verify_every_platform_of_the_shared_tag(setup):
    result = run(setup, "verify", f"{setup['name']}:latest")
    assert result.code == 0, result.out + result.err
    assert result.out.count("  verified") == 2
    assert "on x86_64" in result.out and "on aarch64" in result.out
    assert re.search(r"_C +exact sm_90 +exact sm_120 +exact sm_121", result.out)  # amd64 keeps the whole list


def test_shared_tag_holding_one_platform_fails_verify(setup):
    """A tag named like a shared tag must list every configured platform."""
    client = dockerenv.docker_client()
    own = f"{setup['name']}:{setup['version']}-arm64"
    with dockerenv.logged_in(setup["env"]) as cli:
        subprocess.run([dockerenv.DOCKER_CLI, "pull", own], env=cli, check=True, capture_output=True)
        client.images.get(own).tag(setup["name"], "one-platform")
        subprocess.run(
            [dockerenv.DOCKER_CLI, "push", f"{setup['name']}:one-platform"], env=cli, check=True, capture_output=True
        )
    result = run(setup, "verify", f"{setup['name']}:one-platform")
    assert result.code == 1
    assert "MISMATCH platforms: expected linux/amd64, linux/arm64, found linux/arm64" in result.out


def test_manifest_joins_platform_images_pushed_earlier(setup):
    """What CI's manifest job runs after each platform's runner pushed VERSION-ARCH."""
    result = run(setup, "manifest", "--tag", "joined")
    assert result.code == 0, result.out + result.err
    refs = [line.split()[0] for line in result.out.splitlines()]
    assert f"{setup['name']}:joined" in refs and f"{setup['name']}:{setup['version']}" in refs
    found = registry_manifest(setup, "joined")
    assert sorted(m["platform"]["architecture"] for m in found["manifests"]) == ["amd64", "arm64"]


def test_manifest_without_a_platform_image_in_the_registry_fails(setup, tmp_path):
    config = tmp_path / "build.yaml"
    shutil.copytree(setup["config"].parent, tmp_path, dirs_exist_ok=True)
    (tmp_path / "VERSION").write_text("20260101.7\n")
    result = carry("--config", str(config), "manifest", env=setup["run_env"])
    assert result.code == 1
    assert "20260101.7-amd64 is not in the registry" in result.err


def test_arm64_wheel_from_the_build_stage_passes_verify(setup, tmp_path):
    dist = tmp_path / "dist"
    result = run(setup, "wheel", "--platform", "linux/arm64", "--hermetic", "--out", str(dist))
    assert result.code == 0, result.out + result.err
    (wheel,) = dist.glob("*.whl")
    assert wheel.name.endswith("-linux_aarch64.whl") and f"+carry.{setup['version']}" in wheel.name
    assert Path(result.out.strip()) == wheel
    verified = run(setup, "verify", str(wheel))
    assert verified.code == 0, verified.out + verified.err
    assert "cpu: 1/1 shared object(s) are aarch64 code (linux/arm64)" in verified.out
    assert re.search(r"_C +exact sm_121\n", verified.out) and "tree check passed" in verified.out
    info = json.loads(
        subprocess.run(
            ["unzip", "-p", str(wheel), "*.dist-info/carry-buildinfo.json"], capture_output=True, check=True
        ).stdout
    )
    assert info["platform"] == "linux/arm64" and info["toolchain"]["machine"] == "aarch64"


@pytest.mark.parametrize(
    "command", [("wheel", "--platform", "linux/riscv64"), ("image", "--platform", "linux/riscv64")]
)
def test_platform_without_an_emulator_is_one_line_exit_2(setup, command):
    handler = Path("/proc/sys/fs/binfmt_misc/qemu-riscv64")
    assert not (handler.exists() and handler.read_text().startswith("enabled")), "this test needs no riscv64 handler"
    result = run(setup, *command)
    assert_bad_input(result, "cannot run linux/riscv64 programs", "update-binfmts --enable qemu-riscv64")


def test_pull_after_deleting_local_copy_then_verify(setup):
    client = dockerenv.docker_client()
    ref = f"{setup['name']}:{setup['version']}"
    for image in client.images.list(name=setup["name"]):
        client.images.remove(image.id, force=True)
    with pytest.raises(docker.errors.NotFound):  # ImageNotFound, or NotFound for a 404 worded otherwise
        client.images.get(ref)
    result = run(setup, "verify", ref, "--platform", "linux/amd64")
    assert result.code == 0, result.out + result.err
    assert "verified" in result.out
    labels = client.images.get(ref).labels
    report = json.loads(run(setup, "check", "--json").out)
    assert labels["io.carry.upstream.commit"] == report["base"]
    assert labels["org.opencontainers.image.revision"] == report["base"]
    assert labels["io.carry.series.hash"] == report["series_hash"]
    assert labels["io.carry.cuda_arches"] == "9.0,12.0,12.1" and labels["io.carry.platform"] == "linux/amd64"
    assert labels["org.opencontainers.image.version"] == setup["version"]
    assert labels["io.carry.patches"] == ",".join(p["name"] for p in report["patches"])


def test_verify_after_version_bump_fails_naming_version(setup):
    version_file = setup["config"].parent / "VERSION"
    saved = version_file.read_text()
    try:
        assert run(setup, "version", "bump").code == 0
        result = run(setup, "verify", f"{setup['name']}:{setup['version']}", "--platform", "linux/amd64")
        assert result.code == 1
        assert "MISMATCH label version" in result.out and "MISMATCH buildinfo version" in result.out
    finally:
        version_file.write_text(saved)


def test_image_runs_the_wheel_and_runtime_env_defaults(setup):
    client = dockerenv.docker_client()
    ref = f"{setup['name']}:{setup['version']}-amd64"
    with dockerenv.logged_in(setup["env"]) as cli:
        subprocess.run([dockerenv.DOCKER_CLI, "pull", ref], env=cli, check=True, capture_output=True)
    out = client.containers.run(
        ref,
        [
            "python3",
            "-c",
            "import pledemo, pledemo.buildinfo as b; print(pledemo.__version__, b.load()['series']['hash'])",
        ],
        remove=True,
        network_disabled=True,
    ).decode()
    assert f"+carry.{setup['version']}" in out
    assert len(out.split()[1]) == 64


def test_no_secret_in_history_labels_logs_buildinfo_or_argv(setup):
    client = dockerenv.docker_client()
    password = setup["env"].registry_password()
    for platform in PLATFORMS:
        ref = f"{setup['name']}:{setup['version']}-{platform.split('/')[1]}"
        with dockerenv.logged_in(setup["env"]) as cli:
            subprocess.run([dockerenv.DOCKER_CLI, "pull", ref], env=cli, check=True, capture_output=True)
        image = client.images.get(ref)
        history = " ".join(str(layer) for layer in image.history())
        for secret in (SECRET, password):
            assert secret not in history
            assert secret not in str(image.labels) and secret not in str(image.attrs["Config"])
        filesystem = client.containers.run(
            ref,
            ["sh", "-c", "grep -rl " + SECRET[:20] + " /etc /opt /usr/local || true"],
            remove=True,
            network_disabled=True,
            entrypoint=[],
        ).decode()
        assert filesystem.strip() == ""
    for secret in (SECRET, password):
        assert secret not in setup["pushed"].out + setup["pushed"].err
        for log in (setup["cache"] / "logs").glob("*.log"):
            assert secret not in log.read_text(errors="replace"), log
        assert not any(secret in argv for argv in setup["argv"]), "a secret was on a command line"
    assert any(" build " in argv and "--label" in argv for argv in setup["argv"]), "the watcher saw the build"
    assert any(" login " in argv and "--password-stdin" in argv for argv in setup["argv"]), "the watcher saw the login"


def test_push_with_wrong_password_is_refused(setup):
    result = run(
        setup, "image", "--hermetic", "--push", "--platform", "linux/amd64", CARRY_REGISTRY_PASSWORD="wrong-" + SECRET
    )
    assert_bad_input(result, "refused the login", "CARRY_REGISTRY_USER", "CARRY_REGISTRY_PASSWORD")
    assert "wrong-" + SECRET not in result.err + result.out


def test_bad_tag_is_exit_2(setup):
    assert_bad_input(run(setup, "image", "--tag", "bad tag!"), "--tag")
