"""The compiler cache around the upstream build: where the launcher keeps its files, the shared backend it may
use (probed first, and never the build's failure), and what it did, read from its own statistics. The backend's
password comes only from $CARRY_REMOTE_CACHE_PASSWORD and reaches the launcher through a private mode-600 file in
the build's scratch dir, never through argv, the build's environment, the log, buildinfo or the wheel.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import dataclasses
import json
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

from carry.config import Config
from carry.config.build import CompilerCache, Distributed, RemoteCache, RemoteScheme, overridden
from carry.util import redact, reporter
from carry.util.errors import BadInput
from carry.util.fsutil import write_private
from carry.util.run import execute
from carry.wheelbuild import distbuild
from carry.wheelbuild.toolchain import Launcher

URL_ENV = "CARRY_REMOTE_CACHE_URL"
USER_ENV = "CARRY_REMOTE_CACHE_USER"
PASSWORD_ENV = "CARRY_REMOTE_CACHE_PASSWORD"
PROBE_TIMEOUT_S = 3.0
# ccache's per-backend timeouts: a dead or slow backend costs at most this per compile, then ccache compiles.
CONNECT_TIMEOUT_MS = 500
OPERATION_TIMEOUT_MS = 10_000
# Settings of the caller's environment that would override what carry hands the launcher.
LAUNCHER_REMOTE_ENV = (
    "CCACHE_REMOTE_STORAGE",
    "CCACHE_SECONDARY_STORAGE",
    "CCACHE_REMOTE_ONLY",
    "CCACHE_NOREMOTE_ONLY",
    "SCCACHE_REDIS",
    "SCCACHE_REDIS_ENDPOINT",
    "SCCACHE_REDIS_CLUSTER_ENDPOINTS",
    "SCCACHE_REDIS_USERNAME",
    "SCCACHE_REDIS_PASSWORD",
    "SCCACHE_REDIS_DB",
    "SCCACHE_WEBDAV_ENDPOINT",
    "SCCACHE_WEBDAV_USERNAME",
    "SCCACHE_WEBDAV_PASSWORD",
    "SCCACHE_BUCKET",
    "SCCACHE_S3_KEY_PREFIX",
    "SCCACHE_GHA_ENABLED",
    "SCCACHE_CONF",
)


def remote_setting(config: Config, environ: Mapping[str, str]) -> RemoteCache | None:
    """build.remote_cache, or $CARRY_REMOTE_CACHE_URL when set (same grammar; `none` turns it off)."""
    return overridden(environ, URL_ENV, config.build.remote_cache, RemoteCache.parse, config.build.compiler_cache)


@dataclasses.dataclass(frozen=True)
class Credentials:
    user: str | None
    password: str | None = dataclasses.field(repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Credentials:
        return cls(environ.get(USER_ENV) or None, environ.get(PASSWORD_ENV) or None)

    def scrub(self, text: str) -> str:
        """`text` with the password (plain or URL-quoted) blanked out."""
        return redact.secrets(text, self.password)


def secret_free_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The caller's environment without carry's own secrets: the upstream build never sees them."""
    return {k: v for k, v in environ.items() if not (k.startswith("CARRY_") and ("PASSWORD" in k or "TOKEN" in k))}


# probing the backend -------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Reachability:
    usable: bool
    reason: str  # why not usable, or how it answered
    read_only: bool = False


def probe(remote: RemoteCache, credentials: Credentials, timeout: float = PROBE_TIMEOUT_S) -> Reachability:
    """Ask the backend once, with a short timeout, before the build relies on it."""
    start = time.monotonic()
    try:
        if remote.scheme in (RemoteScheme.REDIS, RemoteScheme.REDISS):
            answer = _probe_redis(remote, credentials, timeout)
        elif remote.scheme in (RemoteScheme.HTTP, RemoteScheme.HTTPS):
            answer = _probe_http(remote, credentials, timeout)
        else:
            return Reachability(True, "not probed here; sccache checks it when its server starts")
    except TimeoutError:
        return Reachability(False, f"no answer within {timeout:g} s")
    except ConnectionRefusedError:
        return Reachability(False, "connection refused")
    except socket.gaierror:
        return Reachability(False, f"host {remote.host} not found")
    except (OSError, ssl.SSLError) as exc:
        return Reachability(False, credentials.scrub(_reason(exc)))
    if answer.usable and not answer.read_only:
        return dataclasses.replace(answer, reason=f"answered in {1000 * (time.monotonic() - start):.0f} ms")
    return dataclasses.replace(answer, reason=credentials.scrub(answer.reason))


def _reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return str(reason).splitlines()[0]


def _resp(*words: str) -> bytes:
    """One redis command in RESP."""
    parts = [f"*{len(words)}\r\n".encode()]
    for word in words:
        data = word.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _read_reply(reader: BinaryIO) -> str:
    """A simple-string, error or integer reply as text ('-' kept for errors); bulk replies as their payload."""
    line = reader.readline()
    if not line:
        raise ConnectionResetError("the server closed the connection")
    text = line.decode(errors="replace").rstrip("\r\n")
    if text.startswith("$") and text[1:].lstrip("-").isdigit() and int(text[1:]) >= 0:
        return reader.read(int(text[1:]) + 2)[:-2].decode(errors="replace")
    return text


def _probe_redis(remote: RemoteCache, credentials: Credentials, timeout: float) -> Reachability:
    commands = []
    if credentials.password:
        user = [credentials.user] if credentials.user else []
        commands.append(("AUTH", *user, credentials.password))
    if remote.db:
        commands.append(("SELECT", str(remote.db)))
    commands += [("PING",), ("SET", "carry:probe", "1", "EX", "60")]
    with socket.create_connection((remote.host, remote.port or 6379), timeout=timeout) as raw:
        sock = raw
        if remote.scheme is RemoteScheme.REDISS:
            sock = ssl.create_default_context().wrap_socket(raw, server_hostname=remote.host)
        sock.sendall(b"".join(_resp(*command) for command in commands))
        reader = sock.makefile("rb")
        replies = [(command[0], _read_reply(reader)) for command in commands]
    for name, reply in replies:
        if not reply.startswith("-"):
            continue
        if name == "AUTH" or (credentials.password and reply.startswith(("-WRONGPASS", "-NOAUTH"))):
            return Reachability(False, f"authentication failed (check ${PASSWORD_ENV})")
        if reply.startswith("-NOAUTH"):
            return Reachability(False, f"the server wants a password; set ${PASSWORD_ENV}")
        if name == "SET" and reply.startswith(("-OOM", "-READONLY", "-MISCONF")):
            return Reachability(
                True, f"it takes no writes ({reply[1:].split(' ', 1)[0]}), so it is used read-only", read_only=True
            )
        return Reachability(False, f"{name} failed: {reply[1:80]}")
    return Reachability(True, "")


def _probe_http(remote: RemoteCache, credentials: Credentials, timeout: float) -> Reachability:
    request = urllib.request.Request(str(remote) + "/", method="GET")
    if credentials.password:
        token = f"{credentials.user or ''}:{credentials.password}".encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(token).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            pass
    except urllib.error.HTTPError as answer:
        if answer.code in (401, 403):
            return Reachability(False, f"authentication failed (HTTP {answer.code}; check ${PASSWORD_ENV})")
        if answer.code >= 500:
            return Reachability(False, f"the server answered HTTP {answer.code}")
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, (socket.timeout, TimeoutError)):
            raise TimeoutError from None
        if isinstance(exc.reason, OSError):
            raise exc.reason from None
        raise
    return Reachability(True, "")


# the launcher's settings, statistics and life ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CacheOutcome:
    """What the compiler cache did in one build, from the launcher's own statistics."""

    launcher: str
    remote: str | None  # the backend used, without credentials
    remote_note: str | None  # why the backend was not used, when it was configured but not used
    compiles: int
    hits: int
    misses: int
    remote_hits: int
    remote_errors: int
    dist: distbuild.DistOutcome | None = None  # what the build cluster did, with build.distributed

    def line(self) -> str:
        if self.compiles == 0:
            text = f"{self.launcher}: no compiler calls went through it"
        else:
            text = f"{self.launcher}: {self.compiles} compile(s), {self.hits} hit(s)"
            if self.remote:
                text += f" ({self.remote_hits} from {self.remote})"
            text += f", {self.misses} miss(es)"
        if self.remote_errors:
            text += f"; {self.remote_errors} remote error(s)/timeout(s), those units used the local cache or nvcc"
        return text

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "dist": self.dist.to_json() if self.dist else None}


@dataclasses.dataclass
class CacheRun:
    """The launcher's settings for one build (`env`), and afterwards its outcome."""

    launcher: Launcher
    env: dict[str, str]
    remote: RemoteCache | None
    remote_note: str | None
    stats_log: Path | None = None
    sccache_env: dict[str, str] | None = None
    distributed: Distributed | None = None  # the build cluster, configured (used or not)
    dist_note: str | None = None  # why the cluster was not used; None when it was

    def outcome(self) -> CacheOutcome:
        stats = self._sccache_stats() if self.launcher.kind is CompilerCache.SCCACHE else {}
        counts = self._ccache_counts() if self.launcher.kind is CompilerCache.CCACHE else self._sccache_counts(stats)
        dist = distbuild.outcome(self.distributed, self.dist_note, stats) if self.distributed else None
        return CacheOutcome(
            launcher=self.launcher.describe(),
            remote=str(self.remote) if self.remote else None,
            remote_note=self.remote_note,
            compiles=counts["hits"] + counts["misses"],
            **counts,
            dist=dist,
        )

    def _ccache_counts(self) -> dict[str, int]:
        counters: collections.Counter[str] = collections.Counter()
        if self.stats_log is not None and self.stats_log.exists():
            counters.update(
                line.strip()
                for line in self.stats_log.read_text(errors="replace").splitlines()
                if line.strip() and not line.startswith("#")
            )
        return {
            "hits": counters["direct_cache_hit"] + counters["preprocessed_cache_hit"],
            "misses": counters["cache_miss"],
            "remote_hits": counters["remote_storage_hit"],
            "remote_errors": counters["remote_storage_error"] + counters["remote_storage_timeout"],
        }

    def _sccache_stats(self) -> dict:
        """The `stats` of this build's sccache server ({} when it does not answer)."""
        try:
            done = execute(
                [self.launcher.path, "--show-stats", "--stats-format=json"], env=self.sccache_env, text=True, timeout=60
            )
            done.check_returncode()
            stats = json.loads(done.stdout).get("stats", {})
        except (OSError, subprocess.SubprocessError, ValueError):
            return {}
        return stats if isinstance(stats, dict) else {}

    def _sccache_counts(self, stats: dict) -> dict[str, int]:
        def total(name: str) -> int:
            value = stats.get(name, 0)
            return sum(value.get("counts", {}).values()) if isinstance(value, dict) else int(value or 0)

        hits = total("cache_hits")
        errors = total("cache_errors") + total("cache_read_errors") + total("cache_write_errors")
        return {
            "hits": hits,
            "misses": total("cache_misses"),
            "remote_hits": hits if self.remote else 0,
            "remote_errors": errors + total("cache_timeouts"),
        }


def _ccache_remote_url(remote: RemoteCache, credentials: Credentials, read_only: bool) -> str:
    """ccache's URL for the backend: it percent-decodes the user info and then splits user from password at
    the first ':', so a password with a ':' gets redis' `default` user in front (an empty user for http)."""
    userinfo = ""
    if credentials.password:
        password = urllib.parse.quote(credentials.password, safe="")
        user = credentials.user
        if user is None and (remote.scheme is RemoteScheme.HTTP or ":" in credentials.password):
            user = "default" if remote.scheme is RemoteScheme.REDIS else ""
        userinfo = f"{urllib.parse.quote(user, safe='')}:{password}@" if user is not None else f"{password}@"
    url = remote.url(userinfo)
    attributes = [f"connect-timeout={CONNECT_TIMEOUT_MS}", f"operation-timeout={OPERATION_TIMEOUT_MS}"]
    if read_only:
        attributes.append("read-only=true")
    return "|".join([url, *attributes])


def _ccache_env(launcher_dir: Path, src: Path, scratch: Path, remote_url: str | None) -> dict[str, str]:
    """Local cache dir, paths relative to the build dir (so other checkouts and other machines hit), the stats
    log of this build, and the remote backend through a private config file."""
    env = {
        "CCACHE_DIR": str(launcher_dir),
        "CCACHE_BASEDIR": str(src),
        "CCACHE_NOHASHDIR": "1",
        "CCACHE_COMPILERCHECK": "content",
        "CCACHE_STATSLOG": str(scratch / "ccache-stats.log"),
    }
    if remote_url is not None:
        own = launcher_dir / "ccache.conf"
        lines = own.read_text(errors="replace").splitlines(keepends=True) if own.is_file() else []
        kept = "".join(
            line for line in lines if line.split("=", 1)[0].strip() not in ("remote_storage", "secondary_storage")
        )
        if kept and not kept.endswith("\n"):
            kept += "\n"
        config = write_private(scratch / "ccache-private.conf", f"{kept}remote_storage = {remote_url}\n")
        env["CCACHE_CONFIGPATH"] = str(config)
    return env


def _sccache_config(remote: RemoteCache, credentials: Credentials) -> str:
    """sccache's TOML for the backend; the password sits in this file only."""
    value = distbuild.toml_string
    user = [f"username = {value(credentials.user)}"] if credentials.user else []
    password = [f"password = {value(credentials.password)}"] if credentials.password else []
    if remote.scheme in (RemoteScheme.REDIS, RemoteScheme.REDISS):
        lines = [
            "[cache.redis]",
            f"endpoint = {value(dataclasses.replace(remote, db=None).url())}",
            *user,
            *password,
            f"db = {remote.db or 0}",
        ]
    elif remote.scheme in (RemoteScheme.HTTP, RemoteScheme.HTTPS):
        lines = ["[cache.webdav]", f"endpoint = {value(str(remote))}", *user, *password]
    elif remote.scheme is RemoteScheme.S3:
        lines = [
            "[cache.s3]",
            f"bucket = {value(remote.host)}",
            f"key_prefix = {value(remote.path)}",
            "no_credentials = false",
        ]  # credentials: the AWS_* variables of the environment
    else:
        lines = []  # gha: SCCACHE_GHA_ENABLED, with the runner's own ACTIONS_* variables
    return "\n".join(lines) + "\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def run(
    launcher: Launcher | None,
    remote: RemoteCache | None,
    cache_root: Path,
    src: Path,
    scratch: Path,
    environ: Mapping[str, str],
    distributed: Distributed | None = None,
) -> Iterator[CacheRun | None]:
    """Set the launcher up for one build in `src` (None without one); the `remote` backend is probed first, and it and
    the build cluster (`distributed`: sccache only) are left out, with one progress line saying why, when unusable."""
    credentials = Credentials.from_env(environ)
    if distributed is not None and (launcher is None or launcher.kind is not CompilerCache.SCCACHE):
        raise BadInput(f"build.distributed {distributed} needs sccache as the compiler launcher; set compiler_cache")
    if launcher is None:
        if remote is not None:
            reporter.phase("remote cache", f"{remote} not used: no compiler cache (ccache or sccache) on PATH")
        yield None
        return
    note = None
    reachability = Reachability(True, "")
    if remote is not None and launcher.kind not in remote.scheme.launchers:
        note = f"{remote.scheme.value} storage needs sccache, which is not on PATH"
    elif remote is not None:
        reachability = probe(remote, credentials)
        if not reachability.usable:
            note = reachability.reason
    if note is not None:
        reporter.phase(
            "remote cache", f"{remote} not used: {note}; building with the local {launcher.kind.value} cache"
        )
        remote = None
    if launcher.kind is CompilerCache.CCACHE:
        if remote is not None:
            reporter.phase("remote cache", f"{remote} via ccache: {reachability.reason}")
        launcher_dir = Path(environ.get("CCACHE_DIR") or cache_root / "ccache")
        remote_url = _ccache_remote_url(remote, credentials, reachability.read_only) if remote else None
        env = _ccache_env(launcher_dir, src, scratch, remote_url)
        yield CacheRun(launcher, env, remote, note, stats_log=scratch / "ccache-stats.log")
        return
    dist_config, dist_note = None, None
    if distributed is not None:
        client_token = distbuild.token(environ)
        checked = distbuild.check(distributed, client_token)
        if checked.usable and client_token:
            reporter.phase("distributed", f"{distributed} via sccache-dist: {checked.reason}")
            dist_config = distbuild.client_config(distributed, client_token, cache_root / "sccache-dist-toolchains")
        else:
            dist_note = checked.reason
            reporter.phase("distributed", f"{distributed} not used: {dist_note}; compiling on this machine")
    with _sccache_server(launcher, cache_root, src, scratch, environ, remote, credentials, dist_config) as started:
        started = dataclasses.replace(started, distributed=distributed, dist_note=dist_note)
        if started.remote_note is not None:
            reporter.phase(
                "remote cache",
                f"{remote} not used: sccache could not use it ({started.remote_note}); "
                f"building with the local sccache cache",
            )
        elif remote is not None:
            reporter.phase("remote cache", f"{remote} via sccache: {reachability.reason}")
        yield started if note is None else dataclasses.replace(started, remote_note=note)


@contextlib.contextmanager
def _sccache_server(
    launcher: Launcher,
    cache_root: Path,
    src: Path,
    scratch: Path,
    environ: Mapping[str, str],
    remote: RemoteCache | None,
    credentials: Credentials,
    dist_config: str | None = None,
) -> Iterator[CacheRun]:
    """A private sccache server on a free port (its settings and statistics this build's alone); started again with
    the local disk cache when it will not start with the backend (why: `remote_note`); `dist_config` in its file."""
    local = {
        "SCCACHE_DIR": environ.get("SCCACHE_DIR") or str(cache_root / "sccache"),
        "SCCACHE_BASEDIRS": str(src),
        "SCCACHE_SERVER_PORT": str(_free_port()),
        "SCCACHE_IDLE_TIMEOUT": "3600",  # a server left by a killed build goes away
    }
    if dist_config is not None:
        local["SCCACHE_CONF"] = str(write_private(scratch / "sccache-private-dist.toml", dist_config))
    env = dict(local)
    if remote is not None:
        text = _sccache_config(remote, credentials) + (f"\n{dist_config}" if dist_config else "")
        env["SCCACHE_CONF"] = str(write_private(scratch / "sccache-private.toml", text))
        if remote.scheme is RemoteScheme.GHA:
            env["SCCACHE_GHA_ENABLED"] = "on"
    server_env = {**secret_free_env(environ), **env}
    server_env = {k: v for k, v in server_env.items() if k in env or k not in LAUNCHER_REMOTE_ENV}
    note = None
    started = _start_sccache(launcher, server_env)
    if started is not None and remote is not None:
        note = credentials.scrub(started)
        remote, env = None, dict(local)
        server_env = {k: v for k, v in server_env.items() if k not in ("SCCACHE_CONF", "SCCACHE_GHA_ENABLED")}
        server_env.update(local)
        started = _start_sccache(launcher, server_env)
    if started is not None:
        raise BadInput(
            f"sccache could not start its server ({credentials.scrub(started)}); "
            f"fix it or set build.compiler_cache: ccache or none"
        )
    try:
        yield CacheRun(launcher, env, remote, note, sccache_env=server_env)
    finally:
        execute([launcher.path, "--stop-server"], env=server_env, timeout=60)


def _start_sccache(launcher: Launcher, env: dict[str, str]) -> str | None:
    """Start the server; None when it runs, else the first line of what it said."""
    try:
        result = execute([launcher.path, "--start-server"], env=env, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return _reason(exc)
    if result.returncode == 0:
        return None
    said = (result.stderr + result.stdout).splitlines()
    error = next((line.split("error:", 1)[1].strip() for line in said if "error:" in line), "")
    return error.removeprefix("Server startup failed:").strip()[:160] or f"exit {result.returncode}"
