"""The test registry really demands credentials, and using them leaks nothing into argv."""

from __future__ import annotations

import base64
import contextlib
import secrets
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from dockerenv import DOCKER_CLI, DockerEnv, cli_env, docker_client, logged_in, login, require


@pytest.fixture
def env() -> DockerEnv:
    return require()


@pytest.fixture
def probe_image(env: DockerEnv, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A one-file image FROM the runtime base, tagged for the test registry.

    Yields (reference, marker): the marker is the random content of /marker.
    """
    marker = secrets.token_hex(8)
    (tmp_path / "marker").write_text(marker)
    (tmp_path / "Dockerfile").write_text(f"FROM {env.runtime_base}\nCOPY marker /marker\n")
    reference = f"{env.registry}/carry-test/registry-probe:{marker}"
    client = docker_client()
    client.images.build(path=str(tmp_path), tag=reference, rm=True, forcerm=True)
    yield reference, marker
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.remove(reference, force=True)


class ArgvWatcher:
    """Reads every process's /proc/<pid>/cmdline in a loop until stopped."""

    def __init__(self, secret: str) -> None:
        self.secret = secret.encode()
        self.leaks: list[bytes] = []
        self.seen: set[bytes] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> ArgvWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.is_set():
            for cmdline_file in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    cmdline = cmdline_file.read_bytes()
                except OSError:
                    continue  # the process ended between listing and reading
                self.seen.add(cmdline)
                if self.secret in cmdline:
                    self.leaks.append(cmdline)


def _docker(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([DOCKER_CLI, *args], env=env, capture_output=True, text=True, timeout=300)


def _manifest_status(env: DockerEnv, reference: str) -> int:
    """HTTP status of the registry's manifest for reference, asked with valid credentials."""
    repository, tag = reference.removeprefix(env.registry + "/").rsplit(":", 1)
    request = urllib.request.Request(
        f"http://{env.registry}/v2/{repository}/manifests/{tag}",
        method="HEAD",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    credentials = f"{env.registry_user}:{env.registry_password()}".encode()
    request.add_header("Authorization", "Basic " + base64.b64encode(credentials).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as answer:
        return answer.code


def _saw_docker(watcher: ArgvWatcher, verb: str) -> bool:
    return any(
        cmdline.startswith(DOCKER_CLI.encode() + b"\0") and f"\0{verb}\0".encode() in cmdline
        for cmdline in watcher.seen
    )


def test_push_and_pull_back_with_valid_credentials(env, probe_image):
    reference, marker = probe_image
    client = docker_client()
    with ArgvWatcher(env.registry_password()) as watcher, logged_in(env) as docker_env:
        pushed = _docker(docker_env, "push", reference)
        assert pushed.returncode == 0, pushed.stderr
        assert _manifest_status(env, reference) == 200
        digest = client.images.get(reference).attrs["RepoDigests"][0]
        client.images.remove(reference, force=True)
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(reference)
        pulled = _docker(docker_env, "pull", reference)
        assert pulled.returncode == 0, pulled.stderr

    assert client.images.get(reference).attrs["RepoDigests"] == [digest]
    # The CLI attaches before the container starts; reading logs afterwards can come up empty.
    shown = _docker(cli_env(), "run", "--rm", "--network=none", reference, "cat", "/marker")
    assert (shown.returncode, shown.stdout) == (0, marker), shown.stderr
    assert _saw_docker(watcher, "login"), "the argv scan never saw `docker login`"
    assert _saw_docker(watcher, "push"), "the argv scan never saw `docker push`"
    assert watcher.leaks == []


def test_login_with_wrong_password_is_refused(env, tmp_path):
    result = login(tmp_path, env.registry, env.registry_user, "not-" + env.registry_password())
    assert result.returncode != 0
    assert "401 Unauthorized" in result.stderr
    config = tmp_path / "config.json"
    assert not config.exists() or env.registry not in config.read_text()


def test_push_with_wrong_password_is_refused(env, probe_image):
    reference, _ = probe_image
    repository, tag = reference.rsplit(":", 1)
    wrong = {"username": env.registry_user, "password": "not-" + env.registry_password()}
    events = docker_client().images.push(repository, tag, auth_config=wrong, stream=True, decode=True)
    errors = [event["error"] for event in events if "error" in event]
    assert errors, "push with a wrong password went through"
    assert errors[-1] == "unauthorized: authentication required"
    assert _manifest_status(env, reference) == 404


def test_anonymous_push_is_refused(env, probe_image, tmp_path):
    reference, _ = probe_image
    pushed = _docker(cli_env(tmp_path), "push", reference)
    assert pushed.returncode != 0
    assert "no basic auth credentials" in pushed.stderr
    assert _manifest_status(env, reference) == 404


def test_argv_watcher_catches_a_secret_on_a_command_line():
    decoy = secrets.token_hex(16)
    with ArgvWatcher(decoy) as watcher:
        subprocess.run(["python3", "-c", "import time; time.sleep(0.5)", decoy], check=True)
    assert watcher.leaks and decoy.encode() in watcher.leaks[0]
