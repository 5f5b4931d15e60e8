"""The real cosign (Debian's own build, which ci/cosign.sh unpacks and records as CARRY_TEST_COSIGN in the env file)
run against the test registry, offline and by key: `--tlog-upload=false` when signing, `--insecure-ignore-tlog=true`
when verifying, and `--allow-insecure-registry --allow-http-registry` for the plain-HTTP registry on loopback.

cosign logs in through a private DOCKER_CONFIG (`docker login --password-stdin` in a temp dir) and gets a private
HOME; a key's passphrase goes in COSIGN_PASSWORD, never on its command line. Every run is kept (argv, exit code,
output), for the tests that look for secrets in them. Outside CI a missing cosign skips the test; with $CI set it
fails it."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import dockerenv

ENV_KEY = "CARRY_TEST_COSIGN"
REGISTRY = ("--allow-insecure-registry", "--allow-http-registry")
OFFLINE_SIGN = ("--tlog-upload=false", "-y")
OFFLINE_VERIFY = ("--insecure-ignore-tlog=true",)
HINT = "run `bash ci/cosign.sh` (ci/setup.sh does): it unpacks Debian's cosign and records CARRY_TEST_COSIGN"


def binary() -> str:
    """The cosign binary ci/cosign.sh unpacked; skip the test (fail it when $CI is set) when there is none."""
    found = dockerenv.recorded(ENV_KEY)
    problem = None
    if not found:
        problem = f"{ENV_KEY} is not set (looked in {dockerenv.env_file()} and the environment)"
    elif not os.access(found, os.X_OK):
        problem = f"{ENV_KEY}={found} is not an executable file"
    if problem is None:
        return found
    if dockerenv.in_ci():
        pytest.fail(f"{problem}; {HINT} (CI is set, so this fails instead of skipping)", pytrace=False)
    pytest.skip(f"{problem}; {HINT}")


def package() -> str:
    """`cosign <Debian version> <arch> <sha256> <suite>`: the stamp ci/cosign.sh wrote beside what it unpacked."""
    return (Path(binary()).parents[2] / ".carry-deb").read_text().strip()


@dataclasses.dataclass(frozen=True)
class Ran:
    argv: tuple[str, ...]
    code: int
    out: str
    err: str

    def json_lines(self) -> list:
        """stdout's JSON documents, one a line (verify prints the payloads, verify-attestation and download the
        envelopes)."""
        return [json.loads(line) for line in self.out.splitlines() if line.startswith(("{", "["))]

    def statements(self) -> list[dict]:
        """The in-toto statements of the DSSE envelopes on stdout."""
        return [json.loads(base64.b64decode(envelope["payload"])) for envelope in self.json_lines()]

    def text(self) -> str:
        return f"$ {' '.join(self.argv)}\nexit {self.code}\n{self.out}{self.err}"


@dataclasses.dataclass
class Cosign:
    """cosign with a private login and HOME; `runs` keeps every run."""

    path: str
    docker_config: Path
    home: Path
    runs: list[Ran] = dataclasses.field(default_factory=list)

    def __call__(self, *args: str, password: str | None = None, cwd: Path | None = None) -> Ran:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "TMPDIR": str(self.home),
            "DOCKER_CONFIG": str(self.docker_config),
        }
        if password is not None:
            env["COSIGN_PASSWORD"] = password
        argv = (self.path, *args)
        done = subprocess.run(
            argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
        )
        ran = Ran(("cosign", *args), done.returncode, done.stdout, done.stderr)
        self.runs.append(ran)
        return ran

    def generate_key_pair(self, directory: Path, password: str) -> tuple[Path, Path]:
        directory.mkdir(parents=True, exist_ok=True)
        ran = self("generate-key-pair", password=password, cwd=directory)
        assert ran.code == 0, ran.text()
        return directory / "cosign.key", directory / "cosign.pub"

    def verify(self, key: Path, ref: str) -> Ran:
        return self("verify", "--key", str(key), *OFFLINE_VERIFY, *REGISTRY, ref)

    def verify_attestation(self, key: Path, ref: str, kind: str) -> Ran:
        return self("verify-attestation", "--key", str(key), "--type", kind, *OFFLINE_VERIFY, *REGISTRY, ref)

    def sign(self, key: Path, ref: str, password: str, *more: str) -> Ran:
        return self("sign", "--key", str(key), *OFFLINE_SIGN, *REGISTRY, *more, ref, password=password)

    def attest(self, key: Path, ref: str, kind: str, predicate: Path, password: str) -> Ran:
        return self(
            "attest",
            "--key",
            str(key),
            "--type",
            kind,
            "--predicate",
            str(predicate),
            *OFFLINE_SIGN,
            *REGISTRY,
            ref,
            password=password,
        )

    def download_attestation(self, ref: str, *more: str) -> Ran:
        return self("download", "attestation", *REGISTRY, *more, ref)


@contextlib.contextmanager
def logged_in(env: dockerenv.DockerEnv) -> Iterator[Cosign]:
    """cosign logged in to the test registry (in a temp DOCKER_CONFIG, the password over stdin), removed after."""
    path = binary()
    with tempfile.TemporaryDirectory(prefix="carry-cosign-") as directory:
        config, home = Path(directory) / "docker-config", Path(directory) / "home"
        config.mkdir()
        home.mkdir()
        result = dockerenv.login(config, env.registry, env.registry_user, env.registry_password())
        if result.returncode != 0:
            raise RuntimeError(f"docker login to {env.registry} failed: {result.stderr.strip()}")
        yield Cosign(path, config, home)
