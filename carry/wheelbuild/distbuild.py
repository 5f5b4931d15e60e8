"""A source build's compiles sent to an sccache-dist build cluster (`build.distributed`): the scheduler checked
before the build (reachable, the token accepted, a server registered), the client's settings for the build's private
sccache server, and what was distributed, read from sccache's own statistics. The client token comes only from
$CARRY_DIST_TOKEN or the file $CARRY_DIST_TOKEN_FILE names, and reaches sccache through that server's private mode-600
config file only. A scheduler that is down, refuses the token or has no server costs one line and the build compiles
locally: sccache itself fails every compile on a wrong token (docs/builds.md, "A build cluster").
"""

from __future__ import annotations

import dataclasses
import json
import struct
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from carry.config import Config
from carry.config.build import Distributed, overridden
from carry.util.errors import BadInput

URL_ENV = "CARRY_DIST_SCHEDULER_URL"
TOKEN_ENV = "CARRY_DIST_TOKEN"
TOKEN_FILE_ENV = "CARRY_DIST_TOKEN_FILE"
CHECK_TIMEOUT_S = 3.0


def setting(config: Config, environ: Mapping[str, str]) -> Distributed | None:
    """build.distributed, or $CARRY_DIST_SCHEDULER_URL when set (an http(s) URL; `none` turns it off)."""
    return overridden(environ, URL_ENV, config.build.distributed, Distributed.parse, config.build.compiler_cache)


def token(environ: Mapping[str, str]) -> str | None:
    """The client token: $CARRY_DIST_TOKEN, else the first line of $CARRY_DIST_TOKEN_FILE (unreadable: bad input)."""
    if given := environ.get(TOKEN_ENV, "").strip():
        return given
    named = environ.get(TOKEN_FILE_ENV, "").strip()
    if not named:
        return None
    try:
        text = Path(named).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.__class__.__name__
        raise BadInput(f"${TOKEN_FILE_ENV} {named}: cannot read it ({reason}); name a readable file") from None
    if not text:
        raise BadInput(f"${TOKEN_FILE_ENV} {named} is empty; it must hold the scheduler's client token")
    return text.splitlines()[0].strip()


# checking the scheduler ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Check:
    usable: bool
    reason: str  # why not usable, or what the scheduler said (servers, cores)


def check(distributed: Distributed, client_token: str | None, timeout: float = CHECK_TIMEOUT_S) -> Check:
    """Ask the scheduler (short timeout) before the build relies on it: its status (servers and cores; none is a
    reason not to use it), then an empty job request: 401 for a wrong token, 400 (no job) for the right one."""
    if not client_token:
        return Check(False, f"no client token (set ${TOKEN_ENV} or ${TOKEN_FILE_ENV})")
    base = distributed.scheduler_url
    alloc = urllib.request.Request(
        f"{base}/api/v1/scheduler/alloc_job", data=b"", headers={"Authorization": f"Bearer {client_token}"}
    )
    try:
        status, body = _ask(urllib.request.Request(f"{base}/api/v1/scheduler/status"), timeout)
        if status != 200:
            return Check(False, f"its status answered HTTP {status}")
        # sccache 0.16's status: bincode, three little-endian u64s (servers, cpus, jobs in progress)
        servers, cpus, _ = struct.unpack_from("<3Q", body)
        if servers == 0:
            return Check(False, "no build server is registered with it")
        status, _ = _ask(alloc, timeout)
    except TimeoutError:
        return Check(False, f"no answer within {timeout:g} s")
    except ConnectionRefusedError:
        return Check(False, "connection refused")
    except (OSError, struct.error) as exc:
        return Check(False, f"no status from it ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})")
    if status in (401, 403):
        return Check(False, f"it refused the client token (HTTP {status}; check ${TOKEN_ENV})")
    if status != 400:  # the right token and no job in the request
        return Check(False, f"it answered HTTP {status} to a job request")
    return Check(True, f"{servers} server(s), {cpus} core(s)")


def _ask(request: urllib.request.Request, timeout: float) -> tuple[int, bytes]:
    """The HTTP status and body of one request; a failing connection raises its own OSError, not urllib's wrapper."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as answer:
        return answer.code, b""
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, OSError):
            raise exc.reason from None
        raise OSError(str(exc.reason)) from None


# the client's settings and what it did -------------------------------------------------------------------------


def toml_string(text: str) -> str:
    """`text` as a TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(text)


def client_config(distributed: Distributed, client_token: str, toolchains: Path) -> str:
    """sccache's `[dist]` TOML: the scheduler, token auth, the toolchains it packages itself (none named: Linux
    clients package their compilers) and where it keeps those archives. The token sits in this text only."""
    lines = [
        "[dist]",
        f"scheduler_url = {toml_string(distributed.scheduler_url)}",
        "toolchains = []",
        f"cache_dir = {toml_string(str(toolchains))}",
        "",
        "[dist.auth]",
        'type = "token"',
        f"token = {toml_string(client_token)}",
    ]
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class DistOutcome:
    """What the cluster did in one build, from sccache's statistics: compiles sent, by server, and run locally."""

    scheduler: str
    note: str | None  # why distribution was off for this build; None when it was on
    compiles: int  # compilations sccache ran (cache misses), here or on a server
    servers: dict[str, int]  # server address -> compiles it ran
    failed: int  # distributed compiles that failed and ran locally instead

    @property
    def distributed(self) -> int:
        return sum(self.servers.values())

    @property
    def local(self) -> int:
        return max(self.compiles - self.distributed, 0)

    def line(self) -> str:
        if self.note is not None:
            return f"{self.scheduler} not used: {self.note}; {self.compiles} compile(s) ran locally"
        text = f"{self.scheduler}: {self.distributed} of {self.compiles} compile(s) distributed"
        if self.servers:
            text += " (" + ", ".join(f"{server} {count}" for server, count in sorted(self.servers.items())) + ")"
        text += f", {self.local} ran locally"
        if self.local:
            why = [f"{self.failed} after a failed distributed compile"] if self.failed else []
            if self.local > self.failed:
                why.append(f"{self.local - self.failed} not sent: not distributable, or no server free")
            text += " (" + "; ".join(why) + ")"
        return text

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "distributed": self.distributed, "local": self.local}


def outcome(distributed: Distributed, note: str | None, stats: Mapping) -> DistOutcome:
    """The dist counts of sccache's `--show-stats --stats-format=json` `stats` object."""
    servers = stats.get("dist_compiles") or {}
    return DistOutcome(
        scheduler=distributed.scheduler_url,
        note=note,
        compiles=int(stats.get("compilations") or 0),
        servers={str(k): int(v) for k, v in servers.items()} if isinstance(servers, dict) else {},
        failed=int(stats.get("dist_errors") or 0),
    )
