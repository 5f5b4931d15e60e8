"""A private redis-server for the second-runner bench: a free loopback port, a generated password read from a
mode-600 config file (never a command line), empty at start, stopped afterwards."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Redis:
    url: str
    password: str


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def started(directory: Path) -> Iterator[Redis]:
    from carry.config.build import RemoteCache
    from carry.wheelbuild import compilecache

    if shutil.which("redis-server") is None:
        raise SystemExit("bench: redis-server is not installed; run `bash .ci/services.sh` (Debian redis-server)")
    directory.mkdir(parents=True, exist_ok=True)
    port, password = _free_port(), secrets.token_hex(16)
    config = directory / "redis.conf"
    fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f'bind 127.0.0.1\nport {port}\ndir {directory}\nsave ""\nappendonly no\nrequirepass {password}\n')
    server = subprocess.Popen(["redis-server", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    redis = Redis(f"redis://127.0.0.1:{port}/0", password)
    try:
        remote, credentials = RemoteCache.parse(redis.url, "bench"), compilecache.Credentials(None, password)
        deadline = time.monotonic() + 20
        while not compilecache.probe(remote, credentials, timeout=1).usable:
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"bench: redis-server on port {port} did not start")
            time.sleep(0.1)
        yield redis
    finally:
        server.terminate()
        server.wait(timeout=30)
