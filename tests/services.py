"""The redis that compile-cache tests share (started by `.ci/services.sh`), and private ones a test may stop.

Facts come from the env file like the registry's (tests/dockerenv.py): CARRY_TEST_REDIS (host:port) and
CARRY_TEST_REDIS_PASSWORD_FILE (mode 600). A password is only ever read from a file or handed over in the
environment (REDISCLI_AUTH for redis-cli, CARRY_REMOTE_CACHE_PASSWORD for carry), never put on a command line.
Outside CI a missing redis skips the test; with $CI set it fails it.
"""

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

import pytest

from dockerenv import _read_env_file, env_file, in_ci

SETUP_HINT = "run `bash .ci/services.sh` as root"


@dataclasses.dataclass(frozen=True)
class Redis:
    host: str
    port: int
    password: str

    def url(self, db: int) -> str:
        return f"redis://{self.host}:{self.port}/{db}"

    def cli(self, *args: str, db: int = 0) -> str:
        """redis-cli against this server, the password in the environment."""
        result = subprocess.run(
            ["redis-cli", "-h", self.host, "-p", str(self.port), "-n", str(db), *args],
            env={**os.environ, "REDISCLI_AUTH": self.password},
            capture_output=True,
            text=True,
            timeout=30,
        )
        if result.returncode != 0 or result.stdout.startswith(("ERR", "NOAUTH", "WRONGPASS")):
            raise RuntimeError(f"redis-cli {args[0]} failed: {result.stdout}{result.stderr}")
        return result.stdout.strip()

    def flush(self, db: int) -> None:
        assert self.cli("FLUSHDB", db=db) == "OK"

    def keys(self, db: int) -> int:
        return int(self.cli("DBSIZE", db=db))


def _shared() -> Redis | str:
    settings = _read_env_file(env_file())
    settings.update(
        {k: os.environ[k] for k in ("CARRY_TEST_REDIS", "CARRY_TEST_REDIS_PASSWORD_FILE") if os.environ.get(k)}
    )
    address, password_file = settings.get("CARRY_TEST_REDIS"), settings.get("CARRY_TEST_REDIS_PASSWORD_FILE")
    if not address or not password_file:
        return f"CARRY_TEST_REDIS not set (looked in {env_file()} and the environment); {SETUP_HINT}"
    if shutil.which("redis-cli") is None:
        return f"redis-cli is not installed; {SETUP_HINT}"
    host, port = address.rsplit(":", 1)
    try:
        redis = Redis(host, int(port), Path(password_file).read_text().strip())
        redis.cli("PING")
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        return f"the test redis on {address} does not answer: {error}; {SETUP_HINT}"
    return redis


def require_redis() -> Redis:
    """The shared test redis, or skip (fail when $CI is set)."""
    found = _shared()
    if isinstance(found, Redis):
        return found
    if in_ci():
        pytest.fail(f"{found} (CI is set, so this fails instead of skipping)", pytrace=False)
    pytest.skip(found)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def private_redis(
    directory: Path, password: str | None = None, **settings: str
) -> Iterator[tuple[Redis, subprocess.Popen]]:
    """A redis-server of this test's own on a free port, its password (default: random hex) in a mode-600
    config file; yields the connection facts and the process (a test may stop it)."""
    if shutil.which("redis-server") is None:
        require_redis()  # explains the skip / failure the same way
    directory.mkdir(parents=True, exist_ok=True)
    port, password = free_port(), password or secrets.token_hex(16)
    config = directory / "redis.conf"
    fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    extra = "".join(f"{key} {value}\n" for key, value in settings.items())
    quoted = '"' + password.replace("\\", "\\\\").replace('"', '\\"') + '"'
    with os.fdopen(fd, "w") as handle:
        handle.write(
            f'bind 127.0.0.1\nport {port}\ndir {directory}\nsave ""\nappendonly no\nrequirepass {quoted}\n{extra}'
        )
    process = subprocess.Popen(["redis-server", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    redis = Redis("127.0.0.1", port, password)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.cli("PING")
                break
            except (RuntimeError, subprocess.SubprocessError):
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"redis-server on port {port} did not start") from None
                time.sleep(0.1)
        yield redis, process
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=20)
