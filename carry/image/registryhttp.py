"""The registry HTTP API v2, spoken directly: blobs checked with HEAD and streamed up in one chunked PATCH, then
manifests and manifest lists PUT. Used for carry's own layers, which it writes itself (carry.image.locked.lockedimage).

Credentials are the ones carry.image.registry finds ($CARRY_REGISTRY_USER / $CARRY_REGISTRY_PASSWORD, else the user's
Docker config); they travel only in an Authorization header: basic, or a bearer token fetched from the realm a
registry's challenge names. Plain HTTP only for a loopback registry (as dockerd's default), HTTPS otherwise.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import ipaddress
import json
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable

from carry.util.errors import Failed

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
ACCEPT = ", ".join((DOCKER_LIST, DOCKER_MANIFEST, OCI_INDEX, OCI_MANIFEST))
TIMEOUT_S = 600


def loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0].strip("[]") if not host.startswith("[") or "]:" in host else host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass
class Repository:
    """One repository of one registry (`host/name`), with the login's username and password (or none)."""

    host: str
    name: str
    username: str | None = None
    password: str | None = None
    _token: str | None = None
    sent: int = 0  # bytes of the bodies sent (blobs, manifests): what a push cost
    received: int = 0  # bytes of the bodies read (manifests, configs, blobs)

    @classmethod
    def of(cls, image_name: str, auth: dict | None) -> Repository:
        from carry.image.registry import registry_of

        host = registry_of(image_name)
        name = image_name[len(host) + 1 :] if image_name.startswith(host + "/") else image_name
        if host == "docker.io" and "/" not in name:
            name = f"library/{name}"
        auth = auth or {}
        return cls(host, name, auth.get("username"), auth.get("password"))

    @property
    def scheme(self) -> str:
        return "http" if loopback(self.host) else "https"

    def _connection(self, netloc: str, scheme: str) -> http.client.HTTPConnection:
        if scheme == "http":
            return http.client.HTTPConnection(netloc, timeout=TIMEOUT_S)
        return http.client.HTTPSConnection(netloc, timeout=TIMEOUT_S)

    def _authorization(self) -> dict[str, str]:
        if self._token:
            return {"Authorization": f"Bearer {self._token}"}
        if self.username and self.password:
            pair = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            return {"Authorization": f"Basic {pair}"}
        return {}

    def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        body: bytes | Iterable[bytes] | None = None,
        ok: tuple[int, ...] = (200,),
    ) -> tuple[int, dict[str, str], bytes]:
        """One request (a path on this registry or a full URL it gave); a bearer challenge is answered once.
        A streamed body (an iterator) cannot be sent twice: authenticate with a small request first."""
        for attempt in range(2):
            url = urllib.parse.urlsplit(path if "://" in path else f"{self.scheme}://{self.host}{path}")
            if url.scheme == "http" and not loopback(url.netloc):
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
            except OSError as exc:
                raise Failed(f"registry {self.host}: {method} {url.path} failed ({exc})") from None
            finally:
                connection.close()
            answer = {k.lower(): v for k, v in response.getheaders()}
            if response.status == 401 and attempt == 0 and self._challenge(answer.get("www-authenticate", "")):
                continue
            if response.status not in ok:
                raise Failed(
                    f"registry {self.host}: {method} {url.path} answered {response.status}: {_error_text(data)}"
                )
            return response.status, answer, data
        raise Failed(f"registry {self.host}: {method} {path} refused the login (401)")

    def _challenge(self, header: str) -> bool:
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
        if self.username and self.password:
            pair = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            request.add_header("Authorization", f"Basic {pair}")
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                answer = json.loads(response.read())
        except (OSError, ValueError) as exc:
            raise Failed(f"registry {self.host}: no token from its auth server ({type(exc).__name__})") from None
        self._token = answer.get("token") or answer.get("access_token")
        return bool(self._token)

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

    def upload(self, chunks: Iterable[bytes], digest_of: Callable[[], str]) -> str:
        """Stream a blob up (POST, one chunked PATCH, PUT ?digest=); `digest_of()` names it once streamed."""
        self.request("GET", "/v2/", ok=(200,))  # authenticate before the body is spent
        _, answer, _ = self.request("POST", f"/v2/{self.name}/blobs/uploads/", ok=(202,))
        location = self._absolute(answer["location"])
        _, answer, _ = self.request(
            "PATCH", location, {"Content-Type": "application/octet-stream"}, self._counted(chunks), ok=(202, 204)
        )
        location = self._absolute(answer.get("location", location))
        digest = digest_of()
        joiner = "&" if "?" in location else "?"
        self.request(
            "PUT", f"{location}{joiner}digest={urllib.parse.quote(digest)}", {"Content-Length": "0"}, b"", ok=(201, 204)
        )
        return digest

    def _counted(self, chunks: Iterable[bytes]) -> Iterable[bytes]:
        for chunk in chunks:
            self.sent += len(chunk)
            yield chunk

    def upload_bytes(self, data: bytes, digest: str) -> bool:
        """A small blob (a config): True when it was pushed, False when the registry had it."""
        if self.has_blob(digest):
            return False
        _, answer, _ = self.request("POST", f"/v2/{self.name}/blobs/uploads/", ok=(202,))
        location = self._absolute(answer["location"])
        joiner = "&" if "?" in location else "?"
        self.request(
            "PUT",
            f"{location}{joiner}digest={urllib.parse.quote(digest)}",
            {"Content-Type": "application/octet-stream", "Content-Length": str(len(data))},
            data,
            ok=(201, 204),
        )
        return True

    def get_blob(self, digest: str) -> bytes:
        """A small blob's bytes (a signature's payload, an attestation's envelope); a redirect is followed without
        the credentials (storage that signs its own URLs)."""
        status, answer, data = self.request("GET", f"/v2/{self.name}/blobs/{digest}", ok=(200, 302, 307))
        if status != 200:
            try:
                with urllib.request.urlopen(answer["location"], timeout=TIMEOUT_S) as response:
                    data = response.read()
                self.received += len(data)
            except (OSError, KeyError) as exc:
                raise Failed(f"registry {self.host}: blob {digest[:19]} not readable ({exc})") from None
        return data

    def _absolute(self, location: str) -> str:
        return location if "://" in location else f"{self.scheme}://{self.host}{location}"

    # -- manifests -------------------------------------------------------------------------------------------

    def put_manifest(self, reference: str, body: bytes, media_type: str) -> str:
        _, answer, _ = self.request(
            "PUT", f"/v2/{self.name}/manifests/{reference}", {"Content-Type": media_type}, body, ok=(201, 200)
        )
        return answer.get("docker-content-digest", "")

    def get_manifest(self, reference: str) -> tuple[str, bytes] | None:
        status, answer, data = self.request(
            "GET", f"/v2/{self.name}/manifests/{reference}", {"Accept": ACCEPT}, ok=(200, 404)
        )
        if status == 404:
            return None
        return answer.get("content-type", ""), data

    def delete_manifest(self, digest: str) -> None:
        self.request("DELETE", f"/v2/{self.name}/manifests/{digest}", ok=(202, 404))


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


def _error_text(data: bytes) -> str:
    try:
        errors = json.loads(data).get("errors") or []
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors) or data[:200].decode(errors="replace")
    except (ValueError, AttributeError):
        return data[:200].decode(errors="replace")
