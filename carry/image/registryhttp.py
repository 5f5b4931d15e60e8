"""The registry HTTP API v2, spoken directly: blobs checked with HEAD and streamed up in one chunked PATCH, manifests
PUT by digest and then under their tags. Every push of carry goes through here (carry.image.publish says in which
order). Credentials travel only in an Authorization header (basic, or a bearer token from the challenge's realm). Plain
HTTP only for a loopback registry or, for reads, one the engine names insecure.

Faults (docs/reliability.md, "Registry and push"): a 408, 429 or 5xx answer and a dropped connection are retried
(ATTEMPTS, BACKOFF_S, a Retry-After up to RETRY_AFTER_MAX_S), then one line names the registry, the blob or tag and the
last status (exit 1). A refused login (401, 403) or an unreachable registry (`probe`) is bad input naming
$CARRY_REGISTRY_USER / $CARRY_REGISTRY_PASSWORD, the password never printed."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import http.client
import ipaddress
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable

from carry.util.errors import BadInput, Failed

USER_ENV = "CARRY_REGISTRY_USER"
PASSWORD_ENV = "CARRY_REGISTRY_PASSWORD"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
ACCEPT = ", ".join((DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST))
TIMEOUT_S = 600  # one read or write on an open connection (a registry hashing a large blob on its final PUT)
CONNECT_TIMEOUT_S = 10  # opening a connection: a host that does not answer is unreachable, not a hang
RETRIED = frozenset({408, 429, 500, 502, 503, 504})
ATTEMPTS = 4
BACKOFF_S = (0.5, 1.0, 2.0)  # before the 2nd, 3rd and 4th attempt
RETRY_AFTER_MAX_S = 10.0
REDIRECTS = (301, 302, 303, 307, 308)


def registry_of(image_name: str) -> str:
    """The registry host of an image name (Docker Hub when the first part is not a host)."""
    first, _, rest = image_name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def repository_of(ref: str) -> str:
    """`host/name` of a reference (tag and digest dropped): the identity a signature names."""
    name = ref.split("@", 1)[0]
    head, _, tail = name.rpartition("/")
    if ":" in tail:
        tail = tail.split(":", 1)[0]
    return f"{head}/{tail}" if head else tail


def loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0].strip("[]") if not host.startswith("[") or "]:" in host else host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def digest_of(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


class Transient(Failed):
    """What a retry may cure: a 408, 429 or 5xx answer, or a connection that dropped (`status` None)."""

    def __init__(self, message: str, status: int | None, retry_after: float | None = None, connect: bool = False):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.connect = connect  # the connection was never made (refused, unknown host, no answer)


class _Connection(http.client.HTTPConnection):
    """A connection opened (and, over TLS, shaken hands) within CONNECT_TIMEOUT_S, then read and written with the
    timeout it was made with; a failure to open it is a `Transient` with `connect` set."""

    def connect(self) -> None:
        _connect(self, super().connect)


class _SecureConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        _connect(self, super().connect)


def _connect(connection: http.client.HTTPConnection, opener: Callable[[], None]) -> None:
    reading, connection.timeout = connection.timeout, CONNECT_TIMEOUT_S
    try:
        opener()
    except (OSError, http.client.HTTPException) as exc:
        raise Transient(_reason(exc), None, connect=True) from None
    connection.timeout = reading
    assert connection.sock is not None
    connection.sock.settimeout(reading)


def _reason(exc: BaseException) -> str:
    """An OS or HTTP error in a few words: `connection refused`, `timed out`, `RemoteDisconnected: ...`."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.timeout):
        return "no answer (timed out)"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclasses.dataclass
class Repository:
    """One repository of one registry (`host/name`) with the login's username and password (or none); `retries_said`: a
    `retry` line per retry; `plain_http` (the engine's insecure registries, for a read): plain HTTP to its host."""

    host: str
    name: str
    username: str | None = None
    password: str | None = None
    retries_said: bool = False
    read_timeout: float = TIMEOUT_S
    plain_http: bool = False
    _token: str | None = None
    sent: int = 0  # bytes of the bodies sent (blobs, manifests): what a push cost
    received: int = 0  # bytes of the bodies read (manifests, configs, blobs)

    @classmethod
    def of(cls, image_name: str, auth: dict | None, retries_said: bool = False) -> Repository:
        host = registry_of(image_name)
        name = image_name[len(host) + 1 :] if image_name.startswith(host + "/") else image_name
        if host == "docker.io" and "/" not in name:
            name = f"library/{name}"
        auth = auth or {}  # the Docker config's own keys, or a credential helper's (docker.auth)
        user, password = auth.get("username") or auth.get("Username"), auth.get("password") or auth.get("Password")
        return cls(host, name, user, password, retries_said)

    @property
    def scheme(self) -> str:
        return "http" if self.plain_http or loopback(self.host) else "https"

    def _connection(self, netloc: str, scheme: str) -> http.client.HTTPConnection:
        if scheme == "http":
            return _Connection(netloc, timeout=self.read_timeout)
        return _SecureConnection(netloc, timeout=self.read_timeout)

    def _basic(self) -> str:
        if not (self.username and self.password):
            return ""
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()

    def _authorization(self) -> dict[str, str]:
        if self._token:
            return {"Authorization": f"Bearer {self._token}"}
        return {"Authorization": self._basic()} if self._basic() else {}

    def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        body: bytes | Iterable[bytes] | None = None,
        ok: tuple[int, ...] = (200,),
    ) -> tuple[int, dict[str, str], bytes]:
        """One request (a path here or a full URL it gave), retried on a `Transient` fault while its body can be sent
        again (a streamed one raises it for `upload`); a bearer challenge is answered once."""
        resend = body is None or isinstance(body, (bytes, str))
        started = time.monotonic()
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return self._once(method, path, headers, body, ok)
            except Transient as fault:
                if not resend:
                    raise
                if attempt == ATTEMPTS:
                    raise self.gave_up(fault, _target(method, path), attempt, started) from None
                self._wait(fault, _target(method, path), attempt)
        raise AssertionError("unreachable")

    def _once(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None,
        body: bytes | Iterable[bytes] | None,
        ok: tuple[int, ...],
    ) -> tuple[int, dict[str, str], bytes]:
        for attempt in range(2):
            url = urllib.parse.urlsplit(path if "://" in path else f"{self.scheme}://{self.host}{path}")
            if url.scheme == "http" and not loopback(url.netloc) and not (self.plain_http and url.netloc == self.host):
                raise Failed(f"registry {self.host} sent carry to plain HTTP at {url.netloc}; refused (not loopback)")
            connection = self._connection(url.netloc, url.scheme)
            target = url.path + (f"?{url.query}" if url.query else "")
            try:
                connection.request(
                    method,
                    target,
                    body=body,
                    headers={**(headers or {}), **self._authorization()},
                    encode_chunked=body is not None and not isinstance(body, (bytes, str)),
                )
                response = connection.getresponse()
                data = response.read()
                self.sent += len(body) if isinstance(body, bytes) else 0
                self.received += len(data)
            except (OSError, http.client.HTTPException) as exc:
                if isinstance(exc, socket.timeout):
                    raise Transient(f"no answer in {self.read_timeout:.0f}s", None) from None
                raise Transient(f"the connection dropped ({_reason(exc)})", None) from None
            finally:
                connection.close()
            answer = {k.lower(): v for k, v in response.getheaders()}
            challenge = answer.get("www-authenticate", "")
            if response.status == 401 and attempt == 0 and self._challenge(challenge, method, path):
                continue
            if response.status in ok:
                return response.status, answer, data
            said = f"answered {response.status} {response.reason}".rstrip() + _error_suffix(data)
            if response.status in RETRIED:
                raise Transient(said, response.status, _retry_after(answer.get("retry-after")))
            if response.status in (401, 403):
                raise self.refused(method, path, response.status)
            raise Failed(f"registry {self.host}: {method} {_target(method, url.path)} {said}")
        raise self.refused(method, path, 401)

    def refused(self, method: str, path: str, status: int) -> BadInput:
        """A 401 or 403: bad input naming the variables that hold the login (never the password)."""
        what = f"{method} {_target(method, urllib.parse.urlsplit(path).path or path)}"
        if self.username:
            return BadInput(
                f"registry {self.host} refused the login of {self.username} ({status}) for {what}: check "
                f"{USER_ENV} and {PASSWORD_ENV} (or `docker login {self.host}`)"
            )
        return BadInput(
            f"registry {self.host} wants a login ({status}) for {what}: set {USER_ENV} and {PASSWORD_ENV} (or "
            f"`docker login {self.host}`)"
        )

    def gave_up(self, fault: Transient, what: str, attempts: int, started: float) -> Failed:
        """The line after the last attempt: the registry, the blob or tag, the last status."""
        return Failed(
            f"registry {self.host}: {what} {fault} ({attempts} attempts over {time.monotonic() - started:.1f}s); "
            f"run it again once the registry answers"
        )

    def _wait(self, fault: Transient, what: str, attempt: int) -> None:
        delay = fault.retry_after if fault.retry_after is not None else BACKOFF_S[attempt - 1]
        if self.retries_said:
            from carry.util import reporter

            reporter.phase(
                "retry", f"registry {self.host}: {what} {fault}; attempt {attempt + 1} of {ATTEMPTS} in {delay:.1f}s"
            )
        time.sleep(delay)

    def probe(self) -> None:
        """`GET /v2/` with the login, before any work: unreachable (within CONNECT_TIMEOUT_S) or a refused login is bad
        input in one line; 408, 429 or 5xx to every attempt a failure."""
        quick = dataclasses.replace(self, retries_said=False, read_timeout=CONNECT_TIMEOUT_S)
        started = time.monotonic()
        for attempt in range(1, ATTEMPTS + 1):
            try:
                quick._once("GET", "/v2/", None, None, (200,))
            except Transient as fault:
                if fault.status is None:
                    raise BadInput(
                        f"cannot reach registry {self.host} ({fault}): check the registry in the image name, and "
                        f"{USER_ENV} / {PASSWORD_ENV} for its login"
                    ) from None
                if attempt == ATTEMPTS:
                    raise self.gave_up(fault, "GET /v2/", attempt, started) from None
                self._wait(fault, "GET /v2/", attempt)
            else:
                self._token = quick._token
                return

    # -- blobs -----------------------------------------------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        status, _, _ = self.request("HEAD", f"/v2/{self.name}/blobs/{digest}", ok=(200, 404))
        return status == 200

    def blob_size(self, digest: str) -> int | None:
        """The size the registry holds `digest` at (HEAD's Content-Length), or None when it has no such blob."""
        status, answer, _ = self.request("HEAD", f"/v2/{self.name}/blobs/{digest}", ok=(200, 404))
        if status != 200:
            return None
        try:
            return int(answer.get("content-length", ""))
        except ValueError:
            return None

    def mount(self, digest: str, source: str) -> bool:
        """Link the blob `digest` of repository `source` (same registry) into this one, nothing sent; False when the
        registry would not (it then opens an upload instead, which is cancelled)."""
        query = urllib.parse.urlencode({"mount": digest, "from": source})
        status, answer, _ = self.request("POST", f"/v2/{self.name}/blobs/uploads/?{query}", ok=(201, 202))
        if status == 201:
            return True
        if answer.get("location"):
            self.request("DELETE", self._absolute(answer["location"]), ok=(202, 204, 404))
        return False

    def upload(self, chunks: Callable[[], Iterable[bytes]], digest_of: Callable[[], str], what: str = "") -> str:
        """Stream a blob up (POST, one chunked PATCH, PUT ?digest=), `chunks()` made again for each attempt."""
        started = time.monotonic()
        label = f"blob upload{f' of {what}' if what else ''}"
        for attempt in range(1, ATTEMPTS + 1):
            stream = chunks()
            try:
                return self._upload_once(stream, digest_of)
            except Transient as fault:
                known = _known(digest_of)
                if known and self.has_blob(known):  # the last attempt's PUT landed; only its answer was lost
                    return known
                if attempt == ATTEMPTS:
                    named = f"{label} {known[:19]}…" if known else label
                    raise self.gave_up(fault, named, attempt, started) from None
                self._wait(fault, label, attempt)
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()  # an abandoned stream's threads stop (gzlayer.prefetched)
        raise AssertionError("unreachable")

    def _upload_once(self, chunks: Iterable[bytes], digest_of: Callable[[], str]) -> str:
        self.request("GET", "/v2/", ok=(200,))  # authenticate before the body is spent
        location = self._start_upload()
        _, answer, _ = self.request(
            "PATCH", location, {"Content-Type": "application/octet-stream"}, self._counted(chunks), ok=(202, 204)
        )
        digest = digest_of()
        self._finish_upload(self._absolute(answer.get("location", location)), digest, {"Content-Length": "0"}, b"")
        return digest

    def _start_upload(self) -> str:
        _, answer, _ = self.request("POST", f"/v2/{self.name}/blobs/uploads/", ok=(202,))
        return self._absolute(answer["location"])

    def _finish_upload(self, location: str, digest: str, headers: dict[str, str], data: bytes) -> None:
        joiner = "&" if "?" in location else "?"
        self.request("PUT", f"{location}{joiner}digest={urllib.parse.quote(digest)}", headers, data, ok=(201, 204))

    def _counted(self, chunks: Iterable[bytes]) -> Iterable[bytes]:
        for chunk in chunks:
            self.sent += len(chunk)
            yield chunk

    def upload_bytes(self, data: bytes, digest: str) -> bool:
        """A small blob (a config): True when it was pushed, False when the registry had it."""
        if self.has_blob(digest):
            return False
        headers = {"Content-Type": "application/octet-stream", "Content-Length": str(len(data))}
        self._finish_upload(self._start_upload(), digest, headers, data)
        return True

    def get_blob(self, digest: str) -> bytes:
        """A small blob's bytes; a redirect is followed without the credentials (storage that signs its URLs)."""
        status, answer, data = self.request("GET", f"/v2/{self.name}/blobs/{digest}", ok=(200, *REDIRECTS))
        if status != 200:
            with self._redirected(answer.get("location", ""), digest) as response:
                data = response.read()
            self.received += len(data)
        return data

    def open_blob(self, digest: str) -> http.client.HTTPResponse:
        """A blob as a stream for the caller to read and close, asked once; a redirect followed as `get_blob`'s."""
        path = f"/v2/{self.name}/blobs/{digest}"
        for attempt in range(2):
            connection = self._connection(self.host, self.scheme)
            try:
                connection.request("GET", path, headers=self._authorization())
                response = connection.getresponse()
            except (OSError, http.client.HTTPException, Transient) as exc:
                connection.close()
                reason = str(exc) if isinstance(exc, Transient) else _reason(exc)
                raise Failed(f"cannot reach registry {self.host}: {reason}") from None
            if response.status == 200:
                if connection.sock is not None:  # the response holds the socket until it is closed (as urllib)
                    connection.sock.close()
                    connection.sock = None
                return response
            response.read()
            connection.close()
            challenge = response.getheader("www-authenticate", "")
            if response.status == 401 and attempt == 0 and self._challenge(challenge, "GET", path):
                continue
            if response.status in REDIRECTS:
                return self._redirected(response.getheader("location", ""), digest)
            if response.status == 404:
                raise Failed(f"registry {self.host} has no blob {digest[:19]} of {self.name}")
            if response.status in (401, 403):
                raise self.refused("GET", path, response.status)
            raise Failed(f"registry {self.host}: GET {_target('GET', path)} answered {response.status}")
        raise self.refused("GET", path, 401)

    def _redirected(self, location: str, digest: str) -> http.client.HTTPResponse:
        """Where the registry sent a blob (storage that signs its own URLs), opened without the credentials."""
        try:
            if not location:
                raise ValueError("no location")
            return urllib.request.urlopen(self._absolute(location), timeout=self.read_timeout)
        except (OSError, ValueError) as exc:
            raise Failed(f"registry {self.host}: blob {digest[:19]} not readable ({exc})") from None

    def _absolute(self, location: str) -> str:
        return location if "://" in location else f"{self.scheme}://{self.host}{location}"

    # -- manifests -------------------------------------------------------------------------------------------

    def put_manifest(self, reference: str, body: bytes, media_type: str) -> str:
        """PUT under a tag or, by digest (`sha256:…`), under no tag at all; the digest the registry names."""
        _, answer, _ = self.request(
            "PUT", f"/v2/{self.name}/manifests/{reference}", {"Content-Type": media_type}, body, ok=(201, 200)
        )
        return answer.get("docker-content-digest", "")

    def manifest_digest(self, reference: str) -> str | None:
        """The digest the registry names for a tag or digest (HEAD), None when it has none."""
        status, answer, _ = self.request(
            "HEAD", f"/v2/{self.name}/manifests/{reference}", {"Accept": ACCEPT}, ok=(200, 404)
        )
        return answer.get("docker-content-digest") if status == 200 else None

    def get_manifest(self, reference: str) -> tuple[str, bytes] | None:
        status, answer, data = self.request(
            "GET", f"/v2/{self.name}/manifests/{reference}", {"Accept": ACCEPT}, ok=(200, 404)
        )
        if status == 404:
            return None
        return answer.get("content-type", ""), data

    def delete_manifest(self, digest: str) -> None:
        self.request("DELETE", f"/v2/{self.name}/manifests/{digest}", ok=(202, 404))

    def _challenge(self, header: str, method: str, path: str) -> bool:
        """Fetch a bearer token from the challenge's realm (basic credentials sent there, if any)."""
        scheme, _, params = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        fields = dict(part.split("=", 1) for part in split_params(params))
        fields = {k.strip(): v.strip().strip('"') for k, v in fields.items()}
        realm = fields.pop("realm", "")
        if not realm.startswith("https://") and not (
            realm.startswith("http://") and loopback(urllib.parse.urlsplit(realm).netloc)
        ):
            return False
        fields.setdefault("scope", f"repository:{self.name}:pull,push")
        request = urllib.request.Request(f"{realm}?{urllib.parse.urlencode(fields)}")
        if self._basic():
            request.add_unredirected_header("Authorization", self._basic())  # not on to where it redirects
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise self.refused(method, path, exc.code) from None
            raise Failed(f"registry {self.host}: its auth server answered {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise Failed(f"registry {self.host}: no token from its auth server ({type(exc).__name__})") from None
        self._token = answer.get("token") or answer.get("access_token")
        return bool(self._token)


def manifest_list(entries: Iterable[tuple[bytes, str, dict[str, str]]]) -> bytes:
    """A Docker manifest list of (manifest bytes, its media type, platform {os, architecture[, variant]}), in the
    order given: the same platforms' manifests give the same bytes, so the same digest."""
    return json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": DOCKER_LIST,
            "manifests": [
                {"mediaType": media_type, "size": len(body), "digest": digest_of(body), "platform": platform}
                for body, media_type, platform in entries
            ],
        },
        separators=(",", ":"),
    ).encode()


def _target(method: str, path: str) -> str:
    """What a request is about, for a message: `manifest NAME:TAG`, `blob sha256:…`, `blob upload to NAME`."""
    parts = urllib.parse.urlsplit(path).path.split("/")
    if "manifests" in parts:
        at = parts.index("manifests")
        reference = "/".join(parts[at + 1 :])
        name = "/".join(parts[2:at])
        return f"manifest {name}@{reference}" if reference.startswith("sha256:") else f"manifest {name}:{reference}"
    if "uploads" in parts:
        return f"blob upload to {'/'.join(parts[2 : parts.index('blobs')])}"
    if "blobs" in parts:
        return f"blob {parts[-1][:19]}…"
    return urllib.parse.urlsplit(path).path or path


def _known(digest_of: Callable[[], str]) -> str | None:
    """The streamed blob's digest, once a stream got through; None before."""
    try:
        return digest_of()
    except (KeyError, LookupError, AttributeError):
        return None


def _retry_after(value: str | None) -> float | None:
    """A Retry-After in seconds (an HTTP date is not followed), capped at RETRY_AFTER_MAX_S."""
    try:
        return min(max(float(value), 0.0), RETRY_AFTER_MAX_S) if value is not None else None
    except ValueError:
        return None


def split_params(text: str) -> list[str]:
    """`a="x,y",b=c` split on the commas outside quotes."""
    parts, current, quoted = [], "", False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return [part for part in parts if "=" in part]


def _error_suffix(data: bytes) -> str:
    """`: ` and the registry's own errors, or the start of its answer, on one line; '' when it said nothing."""
    try:
        errors = json.loads(data).get("errors") or []
        text = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors) or data[:200].decode(errors="replace")
    except (ValueError, AttributeError):
        text = data[:200].decode(errors="replace")
    return f": {' '.join(text.split())}" if text.strip() else ""
