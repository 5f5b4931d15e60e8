"""A second Docker engine on this machine: another runner's empty Docker state, without touching the shared one.

A private `dockerd` with its own data root, exec root (and so its own containerd), socket and pidfile, its own
bridge interface and no iptables rules (builds run with --network=none or host), and only the base images it needs,
copied from the main engine with `docker save | docker load`. `empty()` brings it back to that state (images other
than the bases, and BuildKit's whole cache, cache mounts included, removed). Stopped and deleted afterwards.
Used by tests/test_image_cache.py and bench/imagecache.py; needs root and Debian's docker.io (dockerd 20.10).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

DOCKER_CLI = "/usr/bin/docker"
START_TIMEOUT_S = 60
# dockerd deletes the interface `docker0` when started with --bridge=none, which would cut the main engine's
# containers off their network: the second engine gets a bridge of its own instead.
BRIDGE_ADDRESS = "172.31.253.1/24"


@dataclasses.dataclass(frozen=True)
class Engine:
    host: str  # DOCKER_HOST of the second engine
    bases: tuple[str, ...]

    def docker(self, *args: str, timeout: float = 600) -> str:
        result = subprocess.run(
            [DOCKER_CLI, *args],
            env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": self.host},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise RuntimeError(f"docker {args[0]} on the second engine failed: {result.stderr.strip()[-500:]}")
        return result.stdout

    def empty(self) -> None:
        """Back to a fresh runner's state: only the base images, no build cache."""
        keep = {self.docker("image", "inspect", "--format", "{{.Id}}", base).strip() for base in self.bases}
        others = {line for line in self.docker("image", "ls", "--all", "--quiet", "--no-trunc").split() if line}
        if others - keep:
            self.docker("image", "rm", "--force", *sorted(others - keep))
        self.docker("builder", "prune", "--all", "--force")

    def counts(self) -> dict[str, int]:
        """`docker system df`'s counts: Images, Containers, Local Volumes, Build Cache."""
        rows = self.docker("system", "df", "--format", "{{.Type}}\t{{.TotalCount}}").splitlines()
        return {kind: int(count) for kind, count in (row.split("\t") for row in rows if row)}


def problem() -> str | None:
    """Why a second engine cannot start here, or None."""
    if shutil.which("dockerd") is None:
        return "dockerd is not installed (Debian's docker.io)"
    if not Path(DOCKER_CLI).exists():
        return f"{DOCKER_CLI} is missing"
    if subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip() != "0":
        return "a second dockerd needs root"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    return None


@contextlib.contextmanager
def own_bridge() -> Iterator[str]:
    """A bridge interface for the second engine, deleted afterwards."""
    name = f"carry-e2-{os.urandom(2).hex()}"
    for command in (
        ["link", "add", name, "type", "bridge"],
        ["addr", "add", BRIDGE_ADDRESS, "dev", name],
        ["link", "set", name, "up"],
    ):
        subprocess.run(["ip", *command], check=True, capture_output=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "link", "delete", name], capture_output=True)


@contextlib.contextmanager
def started(bases: tuple[str, ...], main_host: str) -> Iterator[Engine]:
    """Start the engine, copy `bases` from the engine at `main_host` into it; stop and delete it afterwards."""
    root = Path(tempfile.mkdtemp(prefix="carry-engine2-"))
    socket = root / "docker.sock"
    bridge = contextlib.ExitStack()
    with open(root / "dockerd.log", "wb") as log:
        daemon = subprocess.Popen(
            [
                "dockerd",
                "--data-root",
                str(root / "data"),
                "--exec-root",
                str(root / "exec"),
                "--host",
                f"unix://{socket}",
                "--pidfile",
                str(root / "dockerd.pid"),
                f"--bridge={bridge.enter_context(own_bridge())}",
                "--iptables=false",
                "--ip-masq=false",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    engine = Engine(f"unix://{socket}", bases)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                engine.docker("version", timeout=10)
                break
            except (RuntimeError, subprocess.SubprocessError):
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the second dockerd did not start; see {root / 'dockerd.log'}") from None
                time.sleep(0.2)
        saved = subprocess.Popen(
            [DOCKER_CLI, "save", *bases],
            env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": main_host},
            stdout=subprocess.PIPE,
        )
        loaded = subprocess.run(
            [DOCKER_CLI, "load", "--quiet"],
            stdin=saved.stdout,
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": engine.host},
            timeout=600,
        )
        saved.stdout.close()
        if saved.wait() != 0 or loaded.returncode != 0:
            raise RuntimeError(f"copying {', '.join(bases)} into the second engine failed: {loaded.stderr[-300:]}")
        yield engine
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        bridge.close()
        shutil.rmtree(root, ignore_errors=True)
